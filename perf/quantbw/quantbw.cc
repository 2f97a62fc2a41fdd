// quantbw: the int8 quantization kernels' speed on one core (src/algorithms/quantize.h), the
// compute a quantized AllGather must hide behind the link: per float type, the median time to
// quantize one piece's elements and to dequantize them, in elements per second and GB/s of the
// float side. Values are normally distributed, as a model's weights.
// Usage: quantbw [elements=524288] [reps=31] [block=256].
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "algorithms/quantize.h"
#include "base/numeric.h"
#include "base/quant_format.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Type {
  const char* name;
  hcDataType_t dt;
  size_t size;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const size_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 0) : size_t{1} << 19;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 31;
  const size_t block = argc > 3 ? std::strtoull(argv[3], nullptr, 0) : 256;
  if (n == 0 || reps < 1 || block == 0 || block > hicoll::quant::kMaxBlock) {
    std::fprintf(stderr, "usage: quantbw [elements > 0] [reps >= 1] [block 1..%zu]\n", hicoll::quant::kMaxBlock);
    return 2;
  }
  std::printf("# quantbw: %zu elements, block %zu, median of %d reps, one core\n", n, block, reps);
  std::printf("%-6s %12s %10s %12s %10s\n", "type", "quantize", "GB/s", "dequantize", "GB/s");
  const Type types[] = {{"fp32", hcFloat32, 4}, {"bf16", hcBfloat16, 2}, {"fp16", hcFloat16, 2}};
  for (const Type& t : types) {
    std::vector<char> src(n * t.size), out(n * t.size), image(hicoll::quant::packedBytes(n, block));
    std::mt19937 rng(7);
    std::normal_distribution<float> dist(0.0f, 0.02f);
    for (size_t i = 0; i < n; ++i) {
      const float f = dist(rng);
      if (t.dt == hcFloat32) std::memcpy(&src[i * 4], &f, 4);
      else {
        const uint16_t h = t.dt == hcBfloat16 ? hicoll::num::floatToBf16(f) : hicoll::num::floatToHalf(f);
        std::memcpy(&src[i * 2], &h, 2);
      }
    }
    std::vector<double> q, d;
    for (int r = 0; r < reps + 1; ++r) {  // the first rep warms the caches and pages
      const auto t0 = Clock::now();
      hicoll::quant::quantize(src.data(), n, t.dt, block, image.data());
      const auto t1 = Clock::now();
      hicoll::quant::dequantize(image.data(), n, t.dt, block, out.data());
      const auto t2 = Clock::now();
      if (r == 0) continue;
      q.push_back(std::chrono::duration<double>(t1 - t0).count());
      d.push_back(std::chrono::duration<double>(t2 - t1).count());
    }
    const double mq = median(q), md = median(d), bytes = static_cast<double>(n * t.size);
    std::printf("%-6s %9.2f G/s %10.2f %9.2f G/s %10.2f\n", t.name, n / mq / 1e9, bytes / mq / 1e9, n / md / 1e9,
                bytes / md / 1e9);
  }
  return 0;
}
