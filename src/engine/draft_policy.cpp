#include "engine/draft_policy.h"

#include <algorithm>

namespace moeserve {

int DraftPolicy::bucket_of(int64_t decoding) {
  int b = 0;
  while (b + 1 < kBuckets && (int64_t(2) << b) <= decoding) ++b;
  return b;
}

int64_t DraftPolicy::choose(int64_t decoding) {
  if (max_drafts_ <= 0 || decoding <= 0) return 0;
  Bucket& b = buckets_[size_t(bucket_of(decoding))];
  ++b.steps;
  if (b.trying >= 0 && b.held++ < kHold) return b.trying;
  b.trying = -1;
  auto try_k = [&](int64_t k) {
    b.trying = k;
    b.held = 1;
    return k;
  };
  for (int64_t k = 0; k <= max_drafts_; ++k) {  // anything not measured yet first
    if (b.k[size_t(k)].samples < kSamples) return try_k(k);
  }
  int64_t best = 0;
  for (int64_t k = 1; k <= max_drafts_; ++k) {
    if (b.k[size_t(k)].rate > b.k[size_t(best)].rate) best = k;
  }
  if (b.steps % kRefreshSteps == 0) {  // re-measure the others in turn
    const int64_t other = (best + 1 + (b.steps / kRefreshSteps) % max_drafts_) % (max_drafts_ + 1);
    if (other != best) return try_k(other);
  }
  return best;
}

void DraftPolicy::record(int64_t decoding, int64_t verified_k, int64_t proposed_k, double seconds,
                         int64_t tokens) {
  if (decoding <= 0 || verified_k != proposed_k || verified_k < 0 || verified_k > max_drafts_ ||
      seconds <= 0) {
    return;
  }
  Stat& s = buckets_[size_t(bucket_of(decoding))].k[size_t(verified_k)];
  const double r = double(tokens) / seconds;
  s.rate = s.samples == 0 ? r : (1 - kDecay) * s.rate + kDecay * r;
  ++s.samples;
}

double DraftPolicy::rate(int64_t decoding, int64_t k) const {
  if (k < 0 || k > max_drafts_) return 0;
  return buckets_[size_t(bucket_of(decoding))].k[size_t(k)].rate;
}

}  // namespace moeserve
