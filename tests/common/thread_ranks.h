// Ranks as threads of one process, for the transport tests (tests/transport/*): one in-memory
// store, one Bootstrap per rank; what a thread throws becomes a test failure naming its rank.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "bootstrap/bootstrap.h"
#include "bootstrap/store.h"

namespace hctest {

// Runs body(rank, bootstrap) on n threads and joins them.
inline void onRankThreads(int n, const char* name, long timeout_ms,
                          const std::function<void(int, hicoll::Bootstrap&)>& body) {
  auto store = hicoll::makeInMemoryStore();
  std::mutex mu;
  std::vector<std::string> errors;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        hicoll::Bootstrap bs(store, name, r, n, timeout_ms);
        body(r, bs);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lk(mu);
        errors.push_back("rank " + std::to_string(r) + ": " + e.what());
      }
    });
  }
  for (auto& th : threads) th.join();
  for (auto& e : errors) ADD_FAILURE() << e;
}

// Calls f, which must throw hicoll::Error with `code`; returns its message.
template <class F>
std::string expectError(F&& f, hcResult_t code) {
  try {
    f();
  } catch (const hicoll::Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected hicoll::Error with code " << code;
  return "";
}

}  // namespace hctest
