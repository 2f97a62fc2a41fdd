// The out-of-band key-value store every bootstrap is built on (Gloo's rendezvous::Store,
// c10d's Store): set a key, get it (waiting until it exists, bounded by a timeout).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hicoll/hicoll.h"

namespace hicoll {

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<uint8_t>& value) = 0;
  // Waits until key exists; throws hcTimeout naming the key after timeout_ms.
  virtual std::vector<uint8_t> get(const std::string& key, size_t len, long timeout_ms) = 0;
  // Frees a key nobody will read again (stores that cannot delete keep it).
  virtual void erase(const std::string& key) { (void)key; }
  // Stores that can answer at once whether a key exists (so a wait can also watch for dead
  // peers between tries): tryGet returns false while it does not, without waiting.
  virtual bool pollable() const { return false; }
  virtual bool tryGet(const std::string& key, size_t len, std::vector<uint8_t>* out) {
    (void)key, (void)len, (void)out;
    return false;
  }
};

// All ranks are threads of one process (tests): one shared in-memory store.
std::shared_ptr<Store> makeInMemoryStore();
// Wraps the C callbacks of hcStoreOps (the torch plugin hands in a c10d Store this way).
std::shared_ptr<Store> makeCallbackStore(const hcStoreOps& ops);

}  // namespace hicoll
