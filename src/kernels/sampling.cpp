#include "kernels/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace moeserve {

void log_softmax(const float* logits, int64_t n, float* out) {
  float mx = *std::max_element(logits, logits + n);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(double(logits[i]) - mx);
  float lse = mx + float(std::log(sum));
  for (int64_t i = 0; i < n; ++i) out[i] = logits[i] - lse;
}

int32_t argmax(const float* v, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (v[i] > v[best]) best = i;
  }
  return int32_t(best);
}

std::vector<TokenLogprob> top_logprobs(const float* lp, int64_t n, int64_t k) {
  k = std::min(k, n);
  std::vector<int32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    return lp[a] > lp[b] || (lp[a] == lp[b] && a < b);
  });
  std::vector<TokenLogprob> out(k);
  for (int64_t i = 0; i < k; ++i) out[i] = {idx[i], lp[idx[i]]};
  return out;
}

int32_t sample_token(const float* logits, int64_t n, const SamplingParams& p,
                     std::mt19937_64& rng) {
  if (p.temperature <= 0.0f) return argmax(logits, n);
  // Candidates sorted by logit, cut by top-k, then by top-p on the tempered distribution.
  std::vector<int32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  int64_t k = (p.top_k > 0 && p.top_k < n) ? p.top_k : n;
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  idx.resize(k);
  std::vector<double> prob(k);
  double mx = logits[idx[0]], sum = 0.0;
  for (int64_t i = 0; i < k; ++i) {
    prob[i] = std::exp((double(logits[idx[i]]) - mx) / p.temperature);
    sum += prob[i];
  }
  int64_t keep = k;
  if (p.top_p < 1.0f) {
    double cum = 0.0;
    for (int64_t i = 0; i < k; ++i) {
      cum += prob[i] / sum;
      if (cum >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double total = std::accumulate(prob.begin(), prob.begin() + keep, 0.0);
  double u = std::uniform_real_distribution<double>(0.0, total)(rng);
  for (int64_t i = 0; i < keep; ++i) {
    u -= prob[i];
    if (u <= 0.0) return idx[i];
  }
  return idx[keep - 1];
}

}  // namespace moeserve
