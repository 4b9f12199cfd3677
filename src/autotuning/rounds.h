// The autotuner's decision logic on a noisy machine: candidates measured in interleaved rounds
// against a control (the heuristics config), successive halving, and a bootstrap confidence for
// the winner. Pure logic over two injected functions, one that takes a sample of a candidate and
// one that reads a clock, so that tests drive it with synthetic timings and a fake clock.
//
// Why this shape: on a shared machine a neighbour can slow every call by 2x for seconds to
// minutes. A candidate measured alone in such a phase looks slow and loses for good. Here each
// round runs every remaining candidate once in a fresh random order, in short segments each
// bracketed by two samples of the control; a candidate's score is its time divided by the mean
// of its segment's two control samples, so a phase that slows the whole segment cancels. A
// segment whose control strays above the control's quiet level (a low quantile of all control
// samples), or whose two control samples disagree (the machine changed mid-segment), is
// discarded and its candidates measured again later: under load the fastest config differs from
// the quiet machine's (a config with more work items balances better around a busy core), and
// the quiet machine's winner is the one wanted.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tokamax/autotuning/autotuner.h"

namespace tokamax::tuning {

// The public measurement options, plus what one run of the rounds is given: its budget
// (seconds of the injected clock; when it runs out, decisions are taken on what was measured,
// and a candidate with no accepted round cannot win) and the seed of its round order and
// bootstrap.
struct RoundOptions : ::tokamax::RoundOptions {
  double budget_s = 20;
  uint64_t seed = 0;
};

// One discarded segment.
struct DiscardedSegment {
  int round = 0;
  std::vector<int> candidates;
  std::string reason;
};

struct CandidateRounds {
  std::vector<double> samples_ms;  // every raw sample, in order
  std::vector<int> sample_round;   // the round of each sample
  std::vector<double> ratios;      // per sample: ratio to its segment's control, NaN if discarded
  int accepted = 0;                // samples with a ratio
  int stage = 0;                   // last successive-halving stage it was measured in
  bool finalist = false;
  // Median of the accepted ratios and its bootstrap interval (NaN when none was accepted).
  double ratio = 0, ratio_lo = 0, ratio_hi = 0;
};

struct RoundsResult {
  std::vector<CandidateRounds> candidates;
  std::vector<double> control_ms;  // every control sample, in order
  double control_quiet_ms = 0;     // the control's quiet level at the end
  std::vector<DiscardedSegment> discarded;
  int rounds = 0;  // rounds run
  int stages = 0;  // successive-halving stages run
  bool budget_exhausted = false;
  bool decided = false;  // every finalist decided against the best
  int best = -1;         // lowest median ratio among the finalists
  // The best against the control: the median of its ratios to the control with a bootstrap
  // interval, and whether it is confidently faster beyond the tie window (upper bound below
  // 1 - tie).
  double vs_control = 1, vs_control_lo = 1, vs_control_hi = 1;
  bool confident = false;
  double elapsed_s = 0;
};

// Candidates 0..n-1; `control` is one of them (also measured as a candidate, so its own ratio
// carries the same noise as the others'). sample(i) returns one sample of candidate i in ms;
// est_ms[i] (may be empty) is a first estimate of a sample's wall time, for sizing segments
// (later ones come from the clock around each sample). An exception from sample() propagates.
RoundsResult run_rounds(int n, int control, const std::function<double(int)>& sample,
                        const std::function<double()>& clock, const std::vector<double>& est_ms,
                        const RoundOptions& options);

// Seconds one round of every candidate takes by the estimates (est_ms[i]: a sample's wall time),
// as run_rounds spends it on a quiet machine: the candidates packed into segments of about
// segment_s, each between two control samples (shared by consecutive segments); plus the
// three control samples that open the rounds.
double round_seconds(const std::vector<double>& est_ms, int control, double segment_s);

// Ratio of (low) medians a/b with a bootstrap interval (independent resampling of each), at the
// given two-sided confidence; deterministic for a seed. Empty inputs give NaN.
struct RatioInterval {
  double ratio, lo, hi;
};
RatioInterval bootstrap_ratio(const std::vector<double>& a, const std::vector<double>& b,
                              double confidence, int resamples, uint64_t seed);

// The stored decision's bar, one rule for the rounds and the autotuner: a best's interval
// against the control (its ratios against 1) lies below 1 - tie, over at least
// min_confident_rounds accepted rounds.
bool confidently_faster(const RatioInterval& vs_control, int accepted_rounds, double tie,
                        int min_rounds);

// The low median (for an even count, the lower of the two middle values): one slow outlier
// among six samples (a preempted call) cannot move it; with the mean of the middle two it
// moves halfway to the outlier, and a bootstrap over six samples then straddles 1.
double median_of(std::vector<double> v);

}  // namespace tokamax::tuning
