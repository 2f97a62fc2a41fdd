#include "store_bridge.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace hicoll_torch {

StoreBridge::StoreBridge(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {
  ops_.size = sizeof(hcStoreOps);
  ops_.ctx = this;
  ops_.set = &StoreBridge::set;
  ops_.get = &StoreBridge::get;
  ops_.del = &StoreBridge::del;
}

// The bootstrap deletes the keys no rank will read again, so a long job's store does not grow
// with every group it creates.
int StoreBridge::del(void* ctx, const char* key) {
  try {
    static_cast<StoreBridge*>(ctx)->store_->deleteKey(key);
    return 0;
  } catch (const std::exception&) {
    return 1;  // a store that cannot delete keeps the key; nothing else depends on it
  }
}

int StoreBridge::set(void* ctx, const char* key, const void* value, size_t len) {
  try {
    auto* p = static_cast<const uint8_t*>(value);
    static_cast<StoreBridge*>(ctx)->store_->set(key, std::vector<uint8_t>(p, p + len));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hicoll torch: store set '%s' failed: %s\n", key, e.what());
    return 1;
  }
}

int StoreBridge::get(void* ctx, const char* key, void* value, size_t len, int timeout_ms) {
  try {
    auto& store = static_cast<StoreBridge*>(ctx)->store_;
    store->wait({key}, std::chrono::milliseconds(std::max(timeout_ms, 1)));
    auto v = store->get(key);
    if (v.size() != len) {
      std::fprintf(stderr, "hicoll torch: store key '%s' has %zu bytes, expected %zu\n", key, v.size(), len);
      return 2;
    }
    if (len) std::memcpy(value, v.data(), len);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hicoll torch: store get '%s' failed: %s\n", key, e.what());
    return 1;
  }
}

}  // namespace hicoll_torch
