// The call log of libnccl_standin.so, a stand-in for libnccl.so.2 that the fallback tests load
// through HICOLL_NCCL_LIB. The test reaches these through dlsym on the same library.
#pragma once

#include <cstddef>
#include <cstdint>

struct StandinCall {
  char fn[40];
  const void* send;
  void* recv;
  size_t count;
  int dtype;
  int op;
  int root;
  int nranks;
  int rank;
  int residence;
  void* comm;
  void* stream;
  unsigned char scalar[8];
  char id[128];
};

extern "C" {
// Number of calls recorded, the i-th, and a reset.
using StandinCountFn = int (*)();
using StandinCallFn = const StandinCall* (*)(int i);
using StandinResetFn = void (*)();
// Makes the named function return code from now on ("async" for ncclCommGetAsyncError's
// asyncError); code 0 clears it.
using StandinFailFn = void (*)(const char* fn, int code);
}
