#include "kernels/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <optional>

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

namespace {

// Descending logit, then ascending id, as one ascending integer (so candidates sort and select
// as plain integers, without an indirect comparator).
uint64_t rank_key(float logit, int32_t id) {
  uint32_t u;
  std::memcpy(&u, &logit, 4);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);  // float order as unsigned order
  return (uint64_t(~u) << 32) | uint32_t(id);
}

int32_t key_id(uint64_t key) {
  return int32_t(uint32_t(key));
}

}  // namespace

int32_t sample_token(const float* logits, int64_t n, const SamplingParams& p,
                     std::mt19937_64& rng) {
  if (p.temperature <= 0.0f) return argmax(logits, n);
  const double inv_t = 1.0 / double(p.temperature);
  const bool cut_k = p.top_k > 0 && p.top_k < n;
  // The candidates, as rank keys, sorted: a prefix of the rank order that holds every token the
  // cuts can keep. Their tempered weights relative to the best logit go into `prob` (by id).
  std::vector<uint64_t> keys;
  std::vector<double> prob;
  double total = 0.0;  // top-p is a share of what top-k left (of everything without top-k)
  if (cut_k) {
    // Top-k: select k, sort them; weights of those k only.
    keys.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) keys[size_t(i)] = rank_key(logits[i], int32_t(i));
    if (p.top_k <= 4096) {  // heap selection: ~one compare per token for small k
      std::partial_sort(keys.begin(), keys.begin() + p.top_k, keys.end());
    } else {
      std::nth_element(keys.begin(), keys.begin() + (p.top_k - 1), keys.end());
      std::sort(keys.begin(), keys.begin() + p.top_k);
    }
    keys.resize(size_t(p.top_k));
    prob.resize(static_cast<size_t>(n));
    const double mx = logits[key_id(keys[0])];
    for (uint64_t key : keys)
      total += prob[size_t(key_id(key))] = std::exp((double(logits[key_id(key)]) - mx) * inv_t);
    // min_p: the weights are relative to the largest (1), and the keys in descending order.
    while (p.min_p > 0.0f && prob[size_t(key_id(keys.back()))] < p.min_p) {
      total -= prob[size_t(key_id(keys.back()))];
      keys.pop_back();
    }
  } else {
    const double mx = *std::max_element(logits, logits + n);
    prob.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      total += prob[size_t(i)] = std::exp((double(logits[i]) - mx) * inv_t);
    if (p.min_p > 0.0f) {  // (the largest weight is 1: it always stays)
      for (int64_t i = 0; i < n; ++i) {
        if (prob[size_t(i)] < p.min_p) {
          total -= prob[size_t(i)];
          prob[size_t(i)] = 0.0;
        }
      }
    }
    if (p.top_p >= 1.0f) {
      // Nothing cut: inverse CDF over the vocabulary in id order, no sorting at all.
      double u = std::uniform_real_distribution<double>(0.0, total)(rng);
      int64_t last = 0;
      for (int64_t i = 0; i < n; ++i) {
        if (prob[size_t(i)] <= 0.0) continue;
        last = i;
        u -= prob[size_t(i)];
        if (u <= 0.0) return int32_t(i);
      }
      return int32_t(last);
    }
    // Top-p alone: bucket the tokens by tempered log-weight (8 buckets per e-fold; bucket order
    // is rank order, strictly across buckets), find the bucket where the weight from the top
    // reaches top_p, and take everything up to it: a rank-order prefix holding the nucleus.
    constexpr int kBuckets = 256;
    std::vector<double> mass(kBuckets, 0.0);
    auto bucket = [&](int64_t i) {
      double b = (mx - double(logits[i])) * inv_t * 8.0;
      return b < double(kBuckets - 1) ? int(b) : kBuckets - 1;
    };
    for (int64_t i = 0; i < n; ++i) mass[size_t(bucket(i))] += prob[size_t(i)];
    int last_bucket = kBuckets - 1;
    double cum = 0.0;
    for (int b = 0; b < kBuckets; ++b) {
      cum += mass[size_t(b)];
      if (cum >= double(p.top_p) * total) {
        last_bucket = b;
        break;
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      if (bucket(i) <= last_bucket && prob[size_t(i)] > 0.0) {
        keys.push_back(rank_key(logits[i], int32_t(i)));
      }
    }
    std::sort(keys.begin(), keys.end());
  }
  const int64_t m = int64_t(keys.size());
  int64_t keep = m;
  if (p.top_p < 1.0f) {
    double cum = 0.0;
    for (int64_t i = 0; i < m; ++i) {
      cum += prob[size_t(key_id(keys[size_t(i)]))] / total;
      if (cum >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept = 0.0;
  for (int64_t i = 0; i < keep; ++i) kept += prob[size_t(key_id(keys[size_t(i)]))];
  double u = std::uniform_real_distribution<double>(0.0, kept)(rng);
  for (int64_t i = 0; i < keep; ++i) {
    u -= prob[size_t(key_id(keys[size_t(i)]))];
    if (u <= 0.0) return key_id(keys[size_t(i)]);
  }
  return key_id(keys[size_t(keep - 1)]);
}

LogitAdjuster::LogitAdjuster(const SamplingParams& p, const TokenHistory& h) : p_(&p) {
  for (int32_t t : h.output) add(t);
  if (p.repetition_penalty != 1.0f) seen_.insert(h.prompt.begin(), h.prompt.end());
}

void LogitAdjuster::add(int32_t token) {
  ++counts_[token];
  if (p_->repetition_penalty != 1.0f) seen_.insert(token);
}

void LogitAdjuster::apply(float* row, int64_t n) const {
  for (const auto& [t, bias] : p_->logit_bias) {
    if (t >= 0 && t < n) row[t] += bias;
  }
  const float r = p_->repetition_penalty;
  if (r != 1.0f) {
    for (int32_t t : seen_) {
      if (t < 0 || t >= n) continue;
      row[t] = row[t] > 0.0f ? row[t] / r : row[t] * r;
    }
  }
  if (p_->frequency_penalty != 0.0f || p_->presence_penalty != 0.0f) {
    for (const auto& [t, c] : counts_) {
      if (t < 0 || t >= n) continue;
      row[t] -= p_->frequency_penalty * float(c) + p_->presence_penalty;
    }
  }
}

std::vector<int32_t> verify_drafts(const float* logits, int64_t n, std::span<const int32_t> drafts,
                                   const SamplingParams& params, std::mt19937_64& rng,
                                   const TokenHistory& history) {
  std::optional<LogitAdjuster> adjust;
  std::vector<float> adjusted;
  if (params.adjusts_logits()) adjust.emplace(params, history);
  std::vector<int32_t> out;
  for (size_t j = 0; j <= drafts.size(); ++j) {
    const float* row = logits + int64_t(j) * n;
    if (adjust) {
      adjusted.assign(row, row + n);
      adjust->apply(adjusted.data(), n);
      row = adjusted.data();
    }
    const int32_t t = sample_token(row, n, params, rng);
    out.push_back(t);
    if (adjust) adjust->add(t);
    if (j == drafts.size() || t != drafts[j]) break;
  }
  return out;
}

}  // namespace moeserve
