// Sampling from logits: log-softmax, greedy argmax, top-k logprobs, and temperature / top-k /
// top-p sampling with an explicit random generator (one per request, seeded: reproducible).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace moeserve {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  float top_p = 1.0f;        // (0, 1]
  int64_t top_k = 0;         // 0: all
  friend bool operator==(const SamplingParams&, const SamplingParams&) = default;
};

struct TokenLogprob {
  int32_t id;
  float logprob;
  friend bool operator==(const TokenLogprob&, const TokenLogprob&) = default;
};

// logprobs[i] = logits[i] - logsumexp(logits), in FP32 with a double accumulator.
void log_softmax(const float* logits, int64_t n, float* logprobs);

// Index of the largest value (ties: lower index).
int32_t argmax(const float* v, int64_t n);

// The k largest entries of logprobs, descending (ties: lower id first).
std::vector<TokenLogprob> top_logprobs(const float* logprobs, int64_t n, int64_t k);

// Draws a token from logits under params: greedy when temperature == 0; otherwise the softmax
// of logits / temperature, restricted to the top_k highest logits (ties: lower id first), then
// to the smallest set of highest logits whose probability (within what top-k kept) reaches top_p,
// renormalised. One uniform draw from rng picks the token by inverse CDF (over ids in order when
// nothing is cut; over the kept tokens in rank order otherwise): the same rng state gives the
// same token. O(vocab) plus a sort of the kept candidates only.
int32_t sample_token(const float* logits, int64_t n, const SamplingParams& params,
                     std::mt19937_64& rng);

// Speculative verification of drafts proposed deterministically (a draft distribution that is
// a point mass on each draft, as the MTP module's argmax is: docs/mtp.md). logits: rows
// [drafts.size() + 1, n], row j the target's logits for the token after drafts[0, j). Row by
// row: t = sample_token(row j); t is emitted; the walk goes on to row j + 1 only while
// j < drafts.size() and t == drafts[j]. Returns the emitted tokens (1 to drafts.size() + 1:
// the accepted drafts, then the correction or the bonus token).
//
// Exactness: rejection sampling with draft distribution q accepts d with probability
// min(1, p(d) / q(d)) and otherwise draws from max(0, p - q) renormalised; for q a point mass on
// d that is p(d), then p restricted to tokens != d: exactly "draw t from p, accept iff t == d",
// so every emitted token is distributed as sample_token's (greedy: the argmax).
std::vector<int32_t> verify_drafts(const float* logits, int64_t n, std::span<const int32_t> drafts,
                                   const SamplingParams& params, std::mt19937_64& rng);

}  // namespace moeserve
