// Checks of agbench's data check itself: results stay exact in every type, a single wrong
// element is counted, a block in the wrong place is counted, guards catch overruns.
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "data.h"

using namespace agbench;

static int failures = 0;
#define EXPECT(cond, ...)                                       \
  do {                                                          \
    if (!(cond)) {                                              \
      ++failures;                                               \
      std::fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
      std::fprintf(stderr, __VA_ARGS__);                        \
      std::fprintf(stderr, "\n");                               \
    }                                                           \
  } while (0)

// Reduces the inputs of all ranks in double precision (exact for these integers) the way a
// correct library would, stores the result in the type, and compares with the checker.
static void exactness(Coll coll, const TypeDesc& t, int op, int W) {
  const size_t block = 257;  // odd, so blocks straddle nothing aligned
  const size_t n = coll == Coll::AllGather ? block * W : coll == Coll::ReduceScatter ? block * W : block;
  Pattern p(coll, t, op, W, /*root=*/W - 1, block, 1234);
  std::vector<double> acc(n);
  for (size_t j = 0; j < n; ++j) {
    double a = static_cast<double>(p.value(0, j));
    for (int q = 1; q < W && collReduces(coll); ++q) {
      double v = static_cast<double>(p.value(q, j));
      switch (op) {
        case hcProd: a *= v; break;
        case hcMax: a = a > v ? a : v; break;
        case hcMin: a = a < v ? a : v; break;
        default: a += v; break;
      }
    }
    if (collReduces(coll) && op == hcAvg) a /= W;
    if (collReduces(coll) && op == kOpMulSum) a *= 2;
    if (coll == Coll::AllGather) a = static_cast<double>(p.value(static_cast<int>(j / block), j));
    if (coll == Coll::Broadcast) a = static_cast<double>(p.value(W - 1, j));
    EXPECT(a <= static_cast<double>(t.exact), "%s %s W=%d: result %g above exact %lld", t.name, opName(op), W, a,
           static_cast<long long>(t.exact));
    EXPECT(a == static_cast<double>(p.expected(j)), "%s %s W=%d j=%zu: %g vs expected %lld", t.name, opName(op), W, j,
           a, static_cast<long long>(p.expected(j)));
  }
  // A rank's own input passes its check; one changed element is one wrong element.
  std::vector<unsigned char> out(n * t.size);
  fillInput(p, 0, 0, n, out.data());
  EXPECT(countWrongInput(p, 0, out.data(), 0, n) == 0, "%s: own input not recognised", t.name);
  out[(n / 2) * t.size] ^= 0x40;
  EXPECT(countWrongInput(p, 0, out.data(), 0, n) == 1, "%s: one flipped element not counted", t.name);
}

int main() {
  for (int W : {1, 2, 3, 4, 8}) {
    for (const TypeDesc& t : allTypes()) {
      exactness(Coll::AllGather, t, kOpNone, W);
      exactness(Coll::Broadcast, t, kOpNone, W);
      for (int op : allOps()) {
        exactness(Coll::ReduceScatter, t, op, W);
        exactness(Coll::AllReduce, t, op, W);
      }
    }
  }

  // AllGather: swapping two ranks' blocks is caught (values depend on the global index).
  {
    const TypeDesc& f = allTypes()[7];  // float
    const size_t block = 1000;
    Pattern p(Coll::AllGather, f, kOpNone, 2, 0, block, 99);
    std::vector<float> out(2 * block);
    fillInput(p, 0, 0, block, out.data());
    fillInput(p, 1, block, block, out.data() + block);
    EXPECT(countWrongOutput(p, out.data(), 0, 2 * block) == 0, "gathered output not accepted");
    std::vector<float> swapped(out.begin() + block, out.end());
    swapped.insert(swapped.end(), out.begin(), out.begin() + block);
    EXPECT(countWrongOutput(p, swapped.data(), 0, 2 * block) > 1900, "swapped blocks not caught");
    // The poison value is never a correct element.
    std::vector<unsigned char> poison(2 * block * 4, kPoison);
    EXPECT(countWrongOutput(p, poison.data(), 0, 2 * block) == 2 * block, "poison accepted");
  }
  // uint8: poison stays out of every result.
  {
    const TypeDesc& u8 = allTypes()[1];
    for (int op : allOps()) {
      Pattern p(Coll::AllReduce, u8, op, 2, 0, 0, 5);
      for (size_t j = 0; j < 4096; ++j) EXPECT(p.expected(j) != kPoison, "uint8 result equals poison");
    }
  }
  // Guards: a write one element past the end is counted.
  {
    GuardedBuffer b(1 << 16);
    b.poison(4000);
    EXPECT(b.damagedGuards(4000, 4) == 0, "clean guards reported damaged");
    b.data()[4000] = 0;
    b.data()[-1] = 0;
    EXPECT(b.damagedGuards(4000, 4) == 2, "overrun/underrun not counted");
  }
  // -u: the data and its guards move together.
  {
    GuardedBuffer b(1 << 16, false, 24);
    char* start = b.data();
    b.shift(12);
    EXPECT(b.data() == start + 12, "shift did not move the data");
    b.poison(4000);
    EXPECT(b.damagedGuards(4000, 4) == 0, "clean guards of a shifted buffer reported damaged");
    b.data()[4000] = 0;
    b.data()[-1] = 0;
    EXPECT(b.damagedGuards(4000, 4) == 2, "overrun/underrun of a shifted buffer not counted");
    bool refused = false;
    try {
      b.shift(25);
    } catch (const std::invalid_argument&) {
      refused = true;
    }
    EXPECT(refused, "a shift beyond the slack was accepted");
  }
  if (failures) {
    std::fprintf(stderr, "%d failures\n", failures);
    return 1;
  }
  std::printf("agbench data check: OK\n");
  return 0;
}
