#include "plan/refine.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

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

Corrections combineCorrections(const std::vector<Corrections>& ranks) {
  Corrections out;
  for (int c = 0; c < kFigureClasses; ++c) {
    std::vector<double> f;
    for (const Corrections& r : ranks) {
      if (r.calls[c] < kRefineMinCalls || !(r.factor[c] > 0)) continue;
      f.push_back(r.factor[c]);
      out.calls[c] += r.calls[c];
    }
    if (f.empty()) continue;
    std::sort(f.begin(), f.end());
    const size_t m = f.size() / 2;
    out.factor[c] = f.size() % 2 ? f[m] : (f[m - 1] + f[m]) / 2;
  }
  return out;
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

Corrections Refiner::local(const MachineFigures& m) const {
  std::vector<double> factors[kFigureClasses];
  for (const Observation& o : kept_) {
    // Classed under the figures now in use: an earlier step may have moved the bound.
    const Prediction p = predictObservation(m, o);
    const FigureClass c = classOf(p);
    if (classShare(p, c) < kRefineShare) continue;
    const double f = fitFactor(m, o, c);
    if (f > 0) factors[static_cast<int>(c)].push_back(f);
  }
  Corrections out;
  for (int c = 0; c < kFigureClasses; ++c) {
    std::vector<double>& f = factors[c];
    if (f.empty()) continue;
    std::nth_element(f.begin(), f.begin() + static_cast<long>(f.size() / 2), f.end());
    out.factor[c] = f[f.size() / 2];
    out.calls[c] = static_cast<double>(f.size());
  }
  return out;
}

MachineFigures Refiner::apply(const MachineFigures& m, const Corrections& agreed) {
  MachineFigures out = m;
  const double most = kRefineStep * kRefineStep;
  for (int c = 0; c < kFigureClasses; ++c) {
    const double step = std::clamp(agreed.factor[c], 1 / kRefineStep, kRefineStep);
    const double total = std::clamp(total_[c] * step, 1 / most, most);
    out = scaledFigures(out, static_cast<FigureClass>(c), total / total_[c]);
    total_[c] = total;
  }
  return out;
}

std::string Refiner::describe() const {
  return fmt::format("refined from {} calls: times x{:.2f} latency, x{:.2f} link, x{:.2f} cpu", calls_, total_[0],
                     total_[1], total_[2]);
}

}  // namespace hicoll
