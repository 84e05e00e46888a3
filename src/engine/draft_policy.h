// DraftPolicy: how many MTP drafts the next step gets, chosen by measurement (docs/mtp.md
// "The load policy"). Whether drafts pay depends on what a step costs: where reading the
// weights dominates (a large model at small batch) verifying extra rows is nearly free; where
// the step is compute- or overhead-bound (large batches, tiny models) they cost their share.
// Rather than predict that, the policy measures it: per load bucket (decoding sequences,
// rounded down to a power of two), a moving average of tokens per second of pure decode steps
// for each k in [0, K]; the best k wins, every other k is re-measured now and then.
//
// A measurement counts only for a step that verified k drafts per sequence and proposed k
// again (steady state: a switch's first step mixes two settings), so a k being tried is held
// for kHold steps. Output never depends on the choice (verification is exact); only speed does.
// Not thread-safe: the engine's step thread owns it.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace moeserve {

class DraftPolicy {
 public:
  static constexpr int kBuckets = 8;        // 1, 2-3, 4-7, ..., 128+ decoding sequences
  static constexpr int kSamples = 2;        // steady steps per k before it is compared
  static constexpr int kHold = 3;           // steps a k is held when tried
  static constexpr int kRefreshSteps = 64;  // a bucket retries its other k's this often
  static constexpr double kDecay = 0.2;     // weight of a new sample in the moving average

  explicit DraftPolicy(int64_t max_drafts) : max_drafts_(max_drafts) {}

  // Drafts per decoding sequence for the next step, with `decoding` sequences decoding.
  int64_t choose(int64_t decoding);
  // A pure decode step (no prefill rows) with `decoding` sequences, which verified
  // `verified_k` drafts per sequence and proposed `proposed_k`, took `seconds` and emitted
  // `tokens`.
  void record(int64_t decoding, int64_t verified_k, int64_t proposed_k, double seconds,
              int64_t tokens);

  // The measured tokens/s of k in the bucket of `decoding` (0 while unmeasured).
  double rate(int64_t decoding, int64_t k) const;

 private:
  struct Stat {
    double rate = 0;  // tokens per second, moving average
    int samples = 0;
  };
  struct Bucket {
    std::array<Stat, 4> k{};
    int64_t steps = 0;     // choices made in this bucket
    int64_t trying = -1;   // the k being tried, or -1
    int held = 0;          // steps it has been held
  };
  static int bucket_of(int64_t decoding);

  int64_t max_drafts_;
  std::array<Bucket, kBuckets> buckets_{};
};

}  // namespace moeserve
