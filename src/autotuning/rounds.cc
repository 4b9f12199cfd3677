// Interleaved rounds, successive halving and bootstrap decisions (rounds.h).
#include "autotuning/rounds.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

namespace tokamax::tuning {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double quantile_of(std::vector<double> v, double q) {
  if (v.empty()) return kNaN;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

std::vector<double> accepted_ratios(const CandidateRounds& c) {
  std::vector<double> out;
  for (double r : c.ratios) {
    if (!std::isnan(r)) out.push_back(r);
  }
  return out;
}

// The whole procedure's state; one instance per run_rounds call.
class Rounds {
 public:
  Rounds(int n, int control, const std::function<double(int)>& sample,
         const std::function<double()>& clock, const std::vector<double>& est_ms,
         const RoundOptions& o)
      : n_(n),
        control_(control),
        sample_(sample),
        clock_(clock),
        o_(o),
        rng_(o.seed * 2654435761u + 17) {
    r_.candidates.resize(static_cast<size_t>(n));
    est_.assign(static_cast<size_t>(n), 1.0);
    for (int i = 0; i < n && i < static_cast<int>(est_ms.size()); ++i) {
      if (est_ms[i] > 0 && std::isfinite(est_ms[i])) est_[i] = est_ms[i];
    }
    t0_ = clock_();
  }

  RoundsResult run() {
    // The control's quiet level needs a few samples before the first segment is judged.
    for (int i = 0; i < 3 && !over_budget(); ++i) control_sample();
    std::vector<int> alive(static_cast<size_t>(n_));
    std::iota(alive.begin(), alive.end(), 0);
    int target = std::max(1, std::min(o_.first_rounds, o_.max_rounds));
    while (true) {
      ++r_.stages;
      std::vector<int> repeats(static_cast<size_t>(n_), 0);
      measure_until(alive, target, r_.stages, repeats, o_.max_repeats);
      update_stats(alive);
      if (static_cast<int>(alive.size()) <= std::max(1, o_.finalists) || r_.budget_exhausted) break;
      std::stable_sort(alive.begin(), alive.end(),
                       [&](int a, int b) { return score(a) < score(b); });
      size_t keep = (alive.size() + 1) / 2;
      if (keep <= static_cast<size_t>(o_.finalists)) keep = static_cast<size_t>(o_.finalists);
      alive.resize(keep);
      target = std::min(o_.max_rounds, target * 2);
    }
    // The control is always a finalist: the winner must beat it side by side.
    if (std::find(alive.begin(), alive.end(), control_) == alive.end()) alive.push_back(control_);
    finish(alive);
    r_.elapsed_s = clock_() - t0_;
    r_.control_quiet_ms = quiet_level();
    return std::move(r_);
  }

 private:
  bool over_budget() {
    if (clock_() - t0_ > o_.budget_s) r_.budget_exhausted = true;
    return r_.budget_exhausted;
  }

  // One sample of candidate i; its wall time (which may include work the sample does not
  // report, such as a cache flush) becomes the estimate that sizes segments.
  double timed_sample(int i) {
    const double t0 = clock_();
    const double t = sample_(i);
    est_[i] = std::max((clock_() - t0) * 1e3, 1e-6);
    return t;
  }

  double control_sample() {
    const double t = timed_sample(control_);
    r_.control_ms.push_back(t);
    return t;
  }

  // A low quantile of every control sample: a neighbour only ever slows the control down, so
  // the lower part of its samples is the quiet machine.
  double quiet_level() const { return quantile_of(r_.control_ms, 0.25); }

  double score(int c) const {
    const auto& k = r_.candidates[static_cast<size_t>(c)];
    return k.accepted > 0 ? k.ratio : std::numeric_limits<double>::infinity();
  }

  // Rounds over `set` until each has `target` accepted samples (or has been discarded
  // max_repeats times in this stage, or the budget is gone).
  // `repeats` counts each candidate's discarded samples over the whole stage.
  void measure_until(const std::vector<int>& set, int target, int stage, std::vector<int>& repeats,
                     int max_repeats) {
    open_control_ = kNaN;
    while (true) {
      std::vector<int> need;
      for (int c : set) {
        if (r_.candidates[c].accepted < target && repeats[c] <= max_repeats) need.push_back(c);
      }
      if (need.empty() || over_budget()) return;
      ++r_.rounds;
      std::shuffle(need.begin(), need.end(), rng_);
      size_t i = 0;
      while (i < need.size()) {
        if (over_budget()) return;
        // A segment: as many candidates as fit in segment_s (and in the budget left) by their
        // estimates, at least one; none when even one and its controls would overrun.
        const double left_ms = (o_.budget_s - (clock_() - t0_)) * 1e3;
        const double control_ms = (std::isnan(open_control_) ? 2 : 1) * est_[control_];
        if (est_[need[i]] + control_ms > left_ms) {
          r_.budget_exhausted = true;
          return;
        }
        const double limit_ms = std::min(o_.segment_s * 1e3, left_ms - control_ms);
        std::vector<int> seg;
        double ms = 0;
        while (i < need.size() && (seg.empty() || ms + est_[need[i]] <= limit_ms)) {
          ms += est_[need[i]];
          seg.push_back(need[i++]);
        }
        run_segment(seg, stage, repeats);
      }
    }
  }

  void run_segment(const std::vector<int>& seg, int stage, std::vector<int>& repeats) {
    // The control sample that closed the previous segment opens this one when that segment
    // was accepted (nothing ran between them): one control sample per segment instead of two,
    // a third of a round's time for calls longer than a segment.
    const double c0 = std::isnan(open_control_) ? control_sample() : open_control_;
    std::vector<double> t(seg.size());
    for (size_t j = 0; j < seg.size(); ++j) t[j] = timed_sample(seg[j]);
    const double c1 = control_sample();
    const double quiet = quiet_level();
    std::string reason;
    if (std::max(c0, c1) > quiet * (1 + o_.stray)) {
      reason = fmt::format("control {:.4g} ms is {:.0f}% above its quiet level {:.4g} ms",
                           std::max(c0, c1), (std::max(c0, c1) / quiet - 1) * 100, quiet);
    } else if (std::abs(c0 - c1) > o_.bracket * std::min(c0, c1)) {
      reason = fmt::format("control moved from {:.4g} to {:.4g} ms within the segment", c0, c1);
    }
    const double base = (c0 + c1) / 2;
    for (size_t j = 0; j < seg.size(); ++j) {
      CandidateRounds& k = r_.candidates[seg[j]];
      k.samples_ms.push_back(t[j]);
      k.sample_round.push_back(r_.rounds);
      k.stage = stage;
      if (reason.empty() && base > 0) {
        k.ratios.push_back(t[j] / base);
        ++k.accepted;
      } else {
        k.ratios.push_back(kNaN);
        ++repeats[seg[j]];
      }
    }
    open_control_ = reason.empty() ? c1 : kNaN;
    if (!reason.empty()) r_.discarded.push_back({r_.rounds, seg, std::move(reason)});
  }

  void update_stats(const std::vector<int>& set) {
    for (int c : set) {
      CandidateRounds& k = r_.candidates[c];
      const std::vector<double> a = accepted_ratios(k);
      if (a.empty()) {
        k.ratio = k.ratio_lo = k.ratio_hi = kNaN;
        continue;
      }
      // Interval of the median ratio itself: against a constant 1.
      const RatioInterval iv = bootstrap_ratio(a, {1.0}, o_.confidence, o_.bootstrap, o_.seed + c);
      k.ratio = iv.ratio;
      k.ratio_lo = iv.lo;
      k.ratio_hi = iv.hi;
      // Every ratio is against the control, so its own is 1 by definition, as the decision
      // compares the best's ratios with 1. Its samples as a candidate can sit apart from the
      // brackets around them (a neighbour's burst, its data left in the caches by the bracket
      // just before); ranked on those, a stored "0.2x control" sat beside "the control was
      // the fastest finalist".
      if (c == control_) k.ratio = k.ratio_lo = k.ratio_hi = 1;
    }
  }

  int best_of(const std::vector<int>& set) const {
    int best = -1;
    for (int c : set) {
      if (r_.candidates[c].accepted > 0 && (best < 0 || score(c) < score(best))) best = c;
    }
    return best;
  }

  // Decided: `other` is confidently slower than `best`, or confidently within the tie window.
  // Against the control, the best's ratios are compared with 1, the control's own value: each
  // ratio already divides by control samples of the same segment, and the control's samples as a
  // candidate would only add their noise (in simulation, a neighbour busy half the time: the
  // stored config within 3% of the best in 199 of 200 runs against 194).
  bool decided(int best, int other) const {
    const RatioInterval iv = bootstrap_ratio(
        accepted_ratios(r_.candidates[best]),
        other == control_ ? std::vector<double>{1.0} : accepted_ratios(r_.candidates[other]),
        o_.confidence, o_.bootstrap, o_.seed + best * 7919 + other);
    if (std::isnan(iv.ratio)) return false;
    // A best that would be stored instead of the control needs min_confident_rounds (see
    // RoundOptions): until then the control is undecided and measured on.
    if (other == control_ && iv.hi < 1 - o_.tie) {
      return confidently_faster(iv, r_.candidates[best].accepted, o_.tie, o_.min_confident_rounds);
    }
    // Against the control the bar is the stored decision's: faster beyond the tie window.
    const double faster = other == control_ ? 1 - o_.tie : 1;
    return iv.hi < faster || (iv.lo >= 1 - o_.tie && iv.hi <= 1 + o_.tie);
  }

  void finish(const std::vector<int>& finalists) {
    for (int c : finalists) r_.candidates[c].finalist = true;
    const int stage = ++r_.stages;
    std::vector<int> repeats(static_cast<size_t>(n_), 0);
    while (true) {
      update_stats(finalists);
      const int best = best_of(finalists);
      std::vector<int> undecided;
      if (best >= 0) {
        for (int c : finalists) {
          if (c != best && !decided(best, c)) undecided.push_back(c);
        }
      }
      r_.best = best;
      if (best >= 0 && undecided.empty()) {
        r_.decided = true;
        break;
      }
      int most = 0;
      for (int c : finalists) most = std::max(most, r_.candidates[c].accepted);
      if (r_.budget_exhausted || most >= o_.max_rounds) break;
      // Two more accepted rounds of the best and the undecided (all, when nothing has a sample).
      // While the control is undecided only the best and the control: that decides what is
      // stored, the order of the other finalists only which near-equal wins.
      if (best < 0) {
        undecided = finalists;
      } else if (std::find(undecided.begin(), undecided.end(), control_) != undecided.end()) {
        undecided = {best, control_};
      } else {
        undecided.push_back(best);
      }
      const int before = r_.rounds;
      // The final decision is worth the whole budget: no cap on repeats here.
      measure_until(undecided, std::min(o_.max_rounds, most + 2), stage, repeats,
                    std::numeric_limits<int>::max() - 1);
      if (r_.rounds == before) break;  // nothing could be measured (repeats exhausted)
    }
    const int best = r_.best;
    if (best < 0) return;
    if (best == control_) {
      r_.vs_control = r_.vs_control_lo = r_.vs_control_hi = 1;
      r_.confident = false;
      return;
    }
    const RatioInterval iv = bootstrap_ratio(accepted_ratios(r_.candidates[best]), {1.0},
                                             o_.confidence, o_.bootstrap, o_.seed + 31);
    r_.vs_control = iv.ratio;
    r_.vs_control_lo = iv.lo;
    r_.vs_control_hi = iv.hi;
    r_.confident =
        confidently_faster(iv, r_.candidates[best].accepted, o_.tie, o_.min_confident_rounds);
  }

  const int n_, control_;
  const std::function<double(int)>& sample_;
  const std::function<double()>& clock_;
  const RoundOptions& o_;
  std::mt19937_64 rng_;
  std::vector<double> est_;
  double open_control_ = kNaN;  // see run_segment
  double t0_ = 0;
  RoundsResult r_;
};

}  // namespace

double round_seconds(const std::vector<double>& est_ms, int control, double segment_s) {
  const double c = control >= 0 && control < static_cast<int>(est_ms.size()) ? est_ms[control] : 0;
  double ms = 3 * c, seg = 0;
  int segments = 0;
  for (double e : est_ms) {
    if (segments == 0 || seg + e > segment_s * 1e3) {
      ms += (segments++ == 0 ? 2 : 1) * c;  // consecutive segments share a control sample
      seg = 0;
    }
    seg += e;
    ms += e;
  }
  return ms / 1e3;
}

double median_of(std::vector<double> v) {
  if (v.empty()) return kNaN;
  const size_t k = (v.size() - 1) / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

bool confidently_faster(const RatioInterval& vs_control, int accepted_rounds, double tie,
                        int min_rounds) {
  return !std::isnan(vs_control.hi) && vs_control.hi < 1 - tie &&
         accepted_rounds >= std::max(min_rounds, 1);
}

RatioInterval bootstrap_ratio(const std::vector<double>& a, const std::vector<double>& b,
                              double confidence, int resamples, uint64_t seed) {
  if (a.empty() || b.empty()) return {kNaN, kNaN, kNaN};
  const double point = median_of(a) / median_of(b);
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 1);
  std::vector<double> ra(a.size()), rb(b.size()), ratios;
  ratios.reserve(static_cast<size_t>(std::max(resamples, 1)));
  for (int s = 0; s < resamples; ++s) {
    std::uniform_int_distribution<size_t> da(0, a.size() - 1), db(0, b.size() - 1);
    for (double& x : ra) x = a[da(rng)];
    for (double& x : rb) x = b[db(rng)];
    ratios.push_back(median_of(ra) / median_of(rb));
  }
  const double tail = (1 - confidence) / 2;
  return {point, quantile_of(ratios, tail), quantile_of(ratios, 1 - tail)};
}

RoundsResult run_rounds(int n, int control, const std::function<double(int)>& sample,
                        const std::function<double()>& clock, const std::vector<double>& est_ms,
                        const RoundOptions& options) {
  if (n < 1 || control < 0 || control >= n) return {};
  return Rounds(n, control, sample, clock, est_ms, options).run();
}

}  // namespace tokamax::tuning
