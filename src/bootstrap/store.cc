#include "bootstrap/store.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <map>
#include <mutex>

#include "base/error.h"
#include "base/log.h"

namespace hicoll {
namespace {

class InMemoryStore : public Store {
 public:
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      data_[key] = value;
    }
    cv_.notify_all();
  }
  std::vector<uint8_t> get(const std::string& key, size_t len, long timeout_ms) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return data_.count(key) > 0; }))
      HC_THROW(hcTimeout, "bootstrap: timed out after {} ms waiting for key '{}'", timeout_ms, key);
    const auto& v = data_[key];
    HC_CHECK(v.size() == len, hcRemoteError, "bootstrap: key '{}' has {} bytes, expected {}", key, v.size(), len);
    return v;
  }
  void erase(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    data_.erase(key);
  }
  bool pollable() const override { return true; }
  bool tryGet(const std::string& key, size_t len, std::vector<uint8_t>* out) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = data_.find(key);
    if (it == data_.end()) return false;
    HC_CHECK(it->second.size() == len, hcRemoteError, "bootstrap: key '{}' has {} bytes, expected {}", key,
             it->second.size(), len);
    *out = it->second;
    return true;
  }
  size_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return data_.size();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<uint8_t>> data_;
};

class CallbackStore : public Store {
 public:
  // ops.size may be that of an older hcStoreOps without del: copy only what the caller has.
  explicit CallbackStore(const hcStoreOps& ops) { std::memcpy(&ops_, &ops, std::min(ops.size, sizeof ops_)); }
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    HC_CHECK(ops_.set(ops_.ctx, key.c_str(), value.data(), value.size()) == 0, hcRemoteError,
             "bootstrap: store set('{}') failed", key);
  }
  std::vector<uint8_t> get(const std::string& key, size_t len, long timeout_ms) override {
    std::vector<uint8_t> v(len);
    int rc = ops_.get(ops_.ctx, key.c_str(), v.data(), len, static_cast<int>(timeout_ms));
    HC_CHECK(rc == 0, hcTimeout, "bootstrap: store get('{}', {} bytes) failed or timed out after {} ms", key, len,
             timeout_ms);
    return v;
  }
  void erase(const std::string& key) override {
    HC_TRACE("bootstrap: erase key '{}'", key);
    if (ops_.size >= offsetof(hcStoreOps, del) + sizeof ops_.del && ops_.del) (void)ops_.del(ops_.ctx, key.c_str());
  }

 private:
  hcStoreOps ops_{};
};

}  // namespace

std::shared_ptr<Store> makeInMemoryStore() {
  return std::make_shared<InMemoryStore>();
}
std::shared_ptr<Store> makeCallbackStore(const hcStoreOps& ops) {
  return std::make_shared<CallbackStore>(ops);
}

}  // namespace hicoll
