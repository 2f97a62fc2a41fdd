#include "bootstrap/bootstrap.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <tuple>

#include "base/deadline.h"
#include "base/error.h"

namespace hicoll {

Bootstrap::Bootstrap(std::shared_ptr<Store> store, std::string prefix, int rank, int size, long timeout_ms)
    : store_(std::move(store)), prefix_(std::move(prefix)), rank_(rank), size_(size), timeout_ms_(timeout_ms) {
  HC_CHECK(size > 0 && rank >= 0 && rank < size, hcInvalidArgument, "bootstrap: rank {} is outside [0, {})", rank,
           size);
}

std::string Bootstrap::nextKey(const char* what) {
  return fmt::format("{}/{}/{}", prefix_, what, seq_++);
}

Bootstrap::~Bootstrap() {
  if (!parent_orphans_) return;
  for (auto& k : my_keys_) parent_orphans_->push_back(std::move(k.second));
  for (auto& k : *orphans_) parent_orphans_->push_back(std::move(k));
}

void Bootstrap::eraseKeysBefore(uint64_t op) {
  for (const std::string& k : *orphans_) store_->erase(k);
  orphans_->clear();
  std::erase_if(my_keys_, [&](const std::pair<uint64_t, std::string>& k) {
    if (k.first >= op) return false;
    store_->erase(k.second);
    return true;
  });
}

void Bootstrap::allgather(const void* mine, void* all, size_t len, const std::function<void()>& while_waiting) {
  const uint64_t op = seq_;
  std::string base = nextKey("ag");
  const uint8_t* m = static_cast<const uint8_t*>(mine);
  std::string key = fmt::format("{}/{}", base, rank_);
  store_->set(key, std::vector<uint8_t>(m, m + len));
  my_keys_.emplace_back(op, std::move(key));
  uint8_t* out = static_cast<uint8_t*>(all);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) {
      if (len) std::memcpy(out + r * len, mine, len);
      continue;
    }
    std::vector<uint8_t> v;
    const std::string k = fmt::format("{}/{}", base, r);
    try {
      if (while_waiting && store_->pollable()) {
        // Each try is a request to the store: back off to a few ms between them.
        Deadline d(timeout_ms_);
        for (int tries = 0; !store_->tryGet(k, len, &v); ++tries) {
          while_waiting();
          HC_CHECK(!d.expired(), hcTimeout, "bootstrap: timed out after {} ms waiting for key '{}'", timeout_ms_, k);
          std::this_thread::sleep_for(std::chrono::microseconds(50 << std::min(tries, 6)));
        }
      } else {
        v = store_->get(k, len, timeout_ms_);
      }
    } catch (const Error& e) {
      if (e.code() != hcTimeout) throw;
      HC_THROW(hcTimeout, "bootstrap: rank {} of {} did not arrive within {} ms (this is rank {}): {}", r, size_,
               timeout_ms_, rank_, e.what());
    }
    if (len) std::memcpy(out + r * len, v.data(), len);
  }
  eraseKeysBefore(op);
}

void Bootstrap::barrier() {
  uint8_t one = 1;
  std::vector<uint8_t> all(size_);
  allgather(&one, all.data(), 1);
}

void Bootstrap::broadcast(void* data, size_t len, int root) {
  HC_CHECK(root >= 0 && root < size_, hcInvalidArgument, "bootstrap: broadcast root {} is outside [0, {})", root,
           size_);
  const uint64_t op = seq_;
  std::string key = nextKey("bc");
  if (rank_ == root) {
    const uint8_t* d = static_cast<const uint8_t*>(data);
    store_->set(key, std::vector<uint8_t>(d, d + len));
    my_keys_.emplace_back(op, key);
  } else {
    std::vector<uint8_t> v = store_->get(key, len, timeout_ms_);
    if (len) std::memcpy(data, v.data(), len);
  }
}

std::unique_ptr<Bootstrap> Bootstrap::shrink(const std::vector<int>& excluded, uint64_t id) const {
  if (std::binary_search(excluded.begin(), excluded.end(), rank_)) return nullptr;
  const int new_rank =
      rank_ - static_cast<int>(std::lower_bound(excluded.begin(), excluded.end(), rank_) - excluded.begin());
  std::string name = fmt::format("{}/shrink{}/x", prefix_, id);
  for (int r : excluded) name += fmt::format("{}.", r);
  return std::make_unique<Bootstrap>(store_, name, new_rank, size_ - static_cast<int>(excluded.size()), timeout_ms_);
}

std::unique_ptr<Bootstrap> Bootstrap::split(int color, int key, std::vector<int>* members) {
  struct Entry {
    int32_t color, key;
  };
  Entry mine{color, key};
  std::vector<Entry> all(size_);
  uint64_t split_id = seq_;  // same on every rank: names the new group's keys
  allgather(&mine, all.data(), sizeof(Entry));
  if (color < 0) return nullptr;
  std::vector<std::tuple<int, int>> group;  // (key, parent rank)
  for (int r = 0; r < size_; ++r)
    if (all[r].color == color) group.emplace_back(all[r].key, r);
  std::sort(group.begin(), group.end());
  int new_rank = -1;
  std::vector<int> ranks;
  for (size_t i = 0; i < group.size(); ++i) {
    ranks.push_back(std::get<1>(group[i]));
    if (std::get<1>(group[i]) == rank_) new_rank = static_cast<int>(i);
  }
  if (members) *members = ranks;
  auto child = std::make_unique<Bootstrap>(store_, fmt::format("{}/split{}/c{}", prefix_, split_id, color), new_rank,
                                           static_cast<int>(group.size()), timeout_ms_);
  child->parent_orphans_ = orphans_;
  return child;
}

}  // namespace hicoll
