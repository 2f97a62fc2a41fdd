#include "base/copy.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace hicoll {

namespace {

#if defined(__x86_64__)
// d: 32-byte aligned; n: a multiple of 128. AVX2 writes a line in two stores, SSE2 in four.
__attribute__((target("avx2"))) void streamAvx2(char* d, const char* s, size_t n) {
  for (size_t i = 0; i < n; i += 128)
    for (size_t j = 0; j < 128; j += 32)
      _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + j),
                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + j)));
}

void streamSse2(char* d, const char* s, size_t n) {
  for (size_t i = 0; i < n; i += 128)
    for (size_t j = 0; j < 128; j += 16)
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + j),
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + j)));
}

void streamBody(char* d, const char* s, size_t n) {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  avx2 ? streamAvx2(d, s, n) : streamSse2(d, s, n);
}
#else
void streamBody(char* d, const char* s, size_t n) {
  std::memcpy(d, s, n);
}
#endif

}  // namespace

void copyStreaming(void* dst, const void* src, size_t n) {
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  const size_t head = std::min(n, (32 - reinterpret_cast<uintptr_t>(d) % 32) % 32);
  std::memcpy(d, s, head);
  d += head, s += head, n -= head;
  const size_t body = n / 128 * 128;
  if (body) streamBody(d, s, body);
  std::memcpy(d + body, s + body, n - body);
#if defined(__x86_64__)
  _mm_sfence();
#else
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}

}  // namespace hicoll
