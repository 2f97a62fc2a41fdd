#include "plan/refine.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace hicoll {

const char* figureClassName(FigureClass c) {
  switch (c) {
    case FigureClass::Latency: return "latency";
    case FigureClass::Link: return "link";
    case FigureClass::Cpu: return "cpu";
  }
  return "?";
}

Prediction predictObservation(const MachineFigures& m, const Observation& o) {
  if (o.quant_block)
    return predictQuantized(m, o.shape, o.coll, o.algo, o.bytes, o.in_place, o.quant_elem, o.quant_block);
  return predict(m, o.shape, o.coll, o.algo, o.bytes, o.in_place, o.allreduce_small);
}

MachineFigures scaledFigures(MachineFigures m, FigureClass c, double f) {
  switch (c) {
    case FigureClass::Latency:
      m.call_s *= f;
      m.shm_alpha_s *= f;
      m.net_alpha_s *= f;
      break;
    case FigureClass::Link: m.net_Bps /= f; break;
    case FigureClass::Cpu:
      m.copy_Bps /= f;
      m.reduce_Bps /= f;
      m.quant_Bps /= f;
      m.net_cpu_s_per_B *= f;
      m.net_msg_s *= f;
      break;
  }
  return m;
}

FigureClass classOf(const Prediction& p) {
  const double bulk = std::max({p.link, p.cpu, p.window});
  if (p.latency >= bulk) return FigureClass::Latency;
  if (bulk == p.link) return FigureClass::Link;
  // The window is a round trip's worth of chunks: the message latency bounds it.
  return bulk == p.cpu ? FigureClass::Cpu : FigureClass::Latency;
}

double classShare(const Prediction& p, FigureClass c) {
  const double total = p.total();
  if (!(total > 0)) return 0;
  switch (c) {
    case FigureClass::Latency: return std::max(p.latency, p.window) / total;
    case FigureClass::Link: return p.link / total;
    case FigureClass::Cpu: return p.cpu / total;
  }
  return 0;
}

double fitFactor(const MachineFigures& m, const Observation& o, FigureClass c) {
  double lo = -std::log(kRefineStep), hi = std::log(kRefineStep);
  auto time = [&](double log_f) { return predictObservation(scaledFigures(m, c, std::exp(log_f)), o).total(); };
  const double t_lo = time(lo), t_hi = time(hi);
  // A class that hardly moves the prediction says nothing of this call.
  if (!(o.seconds > 0) || t_hi - t_lo < 0.05 * time(0)) return 0;
  if (t_lo >= o.seconds) return std::exp(lo);
  if (t_hi <= o.seconds) return std::exp(hi);
  for (int i = 0; i < 30; ++i) {  // the time grows with the factor
    const double mid = (lo + hi) / 2;
    (time(mid) < o.seconds ? lo : hi) = mid;
  }
  return std::exp((lo + hi) / 2);
}

int sizeBand(size_t bytes) {
  int b = 0;
  for (size_t at = size_t{16} << 10; b + 1 < kSizeBands && bytes >= at && at <= SIZE_MAX / 4; at *= 4) ++b;
  return b;
}

size_t bandStart(int band) {
  return band <= 0 ? 0 : (size_t{4} << 10) << (2 * band);
}

Corrections::Corrections() {
  for (int b = 0; b < kSizeBands; ++b)
    for (int c = 0; c < kFigureClasses; ++c) factor[b][c] = 1, calls[b][c] = 0;
}

Corrections combineCorrections(const std::vector<Corrections>& ranks) {
  Corrections out;
  for (int b = 0; b < kSizeBands; ++b)
    for (int c = 0; c < kFigureClasses; ++c) {
      std::vector<double> f;
      for (const Corrections& r : ranks) {
        if (r.calls[b][c] < kRefineMinCalls || !(r.factor[b][c] > 0)) continue;
        f.push_back(r.factor[b][c]);
        out.calls[b][c] += r.calls[b][c];
      }
      if (f.empty()) continue;
      std::sort(f.begin(), f.end());
      const size_t m = f.size() / 2;
      out.factor[b][c] = f.size() % 2 ? f[m] : (f[m - 1] + f[m]) / 2;
    }
  return out;
}

Refiner::Refiner(int64_t first) : first_(first), next_(first) {
  for (auto& band : total_)
    for (double& t : band) t = 1;
}

bool Refiner::add(const Observation& o, bool skip) {
  ++calls_;
  if (!skip) {  // the newest calls, bounded; classed when a refinement reads them
    if (kept_.size() < kKept) {
      kept_.push_back(o);
    } else {
      kept_[oldest_] = o;
      oldest_ = (oldest_ + 1) % kKept;
    }
  }
  if (!active() || calls_ != next_) return false;
  next_ *= 4;
  ++done_;
  return true;
}

double Refiner::effective(int b, int c) const {
  const int step = static_cast<FigureClass>(c) == FigureClass::Latency ? -1 : 1;
  for (int k = b; k >= 0 && k < kSizeBands; k += step)
    if (fitted_[k][c]) return total_[k][c];
  return 1;
}

std::vector<MachineFigures> Refiner::bands(const MachineFigures& base) const {
  std::vector<MachineFigures> out;
  if (!applied_) return out;
  out.reserve(kSizeBands);
  for (int b = 0; b < kSizeBands; ++b) {
    MachineFigures m = base;
    for (int c = 0; c < kFigureClasses; ++c) m = scaledFigures(m, static_cast<FigureClass>(c), effective(b, c));
    out.push_back(m);
  }
  return out;
}

Corrections Refiner::local(const MachineFigures& base) const {
  const std::vector<MachineFigures> in_use = bands(base);
  std::vector<double> factors[kSizeBands][kFigureClasses];
  for (const Observation& o : kept_) {
    const int b = sizeBand(o.bytes);
    const MachineFigures& m = in_use.empty() ? base : in_use[static_cast<size_t>(b)];
    // Classed under the figures now in use: an earlier step may have moved the bound.
    const Prediction p = predictObservation(m, o);
    const FigureClass c = classOf(p);
    if (classShare(p, c) < kRefineShare) continue;
    const double f = fitFactor(m, o, c);
    if (f > 0) factors[b][static_cast<int>(c)].push_back(f);
  }
  Corrections out;
  for (int b = 0; b < kSizeBands; ++b)
    for (int c = 0; c < kFigureClasses; ++c) {
      std::vector<double>& f = factors[b][c];
      if (f.empty()) continue;
      std::nth_element(f.begin(), f.begin() + static_cast<long>(f.size() / 2), f.end());
      out.factor[b][c] = f[f.size() / 2];
      out.calls[b][c] = static_cast<double>(f.size());
    }
  return out;
}

std::vector<MachineFigures> Refiner::apply(const MachineFigures& base, const Corrections& agreed) {
  const double most = kRefineStep * kRefineStep;
  for (int b = 0; b < kSizeBands; ++b)
    for (int c = 0; c < kFigureClasses; ++c) {
      if (!(agreed.calls[b][c] > 0)) continue;
      // A band's first own factor starts from the one it took from its neighbour.
      const double from = fitted_[b][c] ? total_[b][c] : effective(b, c);
      const double step = std::clamp(agreed.factor[b][c], 1 / kRefineStep, kRefineStep);
      total_[b][c] = std::clamp(from * step, 1 / most, most);
      fitted_[b][c] = true;
    }
  applied_ = true;
  return bands(base);
}

namespace {
bool any(const bool (&f)[kFigureClasses]) {
  return f[0] || f[1] || f[2];
}
}  // namespace

std::string Refiner::describe() const {
  int n = 0;
  for (const auto& f : fitted_) n += any(f);
  return fmt::format("refined from {} calls in {} size band{}", calls_, n, n == 1 ? "" : "s");
}

std::string Refiner::factors() const {
  std::string out;
  for (int b = 0; b < kSizeBands; ++b) {
    if (!any(fitted_[b])) continue;
    out += fmt::format("{}from {} KiB: times x{:.2f} latency, x{:.2f} link, x{:.2f} cpu", out.empty() ? "" : "; ",
                       bandStart(b) >> 10, effective(b, 0), effective(b, 1), effective(b, 2));
  }
  return out.empty() ? "no call timed spoke for its figures" : out;
}

}  // namespace hicoll
