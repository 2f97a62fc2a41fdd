// hcStoreOps over a c10d Store: libhicoll's bootstrap reads and writes the group's store.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "hicoll/hicoll.h"

namespace hicoll_torch {

class StoreBridge {
 public:
  explicit StoreBridge(c10::intrusive_ptr<c10d::Store> store);
  const hcStoreOps* ops() const { return &ops_; }

 private:
  static int set(void* ctx, const char* key, const void* value, size_t len);
  static int get(void* ctx, const char* key, void* value, size_t len, int timeout_ms);
  static int del(void* ctx, const char* key);
  c10::intrusive_ptr<c10d::Store> store_;
  hcStoreOps ops_{};
};

}  // namespace hicoll_torch
