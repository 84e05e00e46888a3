// Sampling from logits: log-softmax, greedy argmax, top-k logprobs, and temperature / top-k /
// top-p sampling with an explicit random generator (one per request, seeded: reproducible).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace moeserve {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  float top_p = 1.0f;        // (0, 1]
  int64_t top_k = 0;         // 0: all
  // vLLM's min_p: of the tempered probabilities, those below min_p times the largest are cut
  // (before top-k and top-p). 0: none.
  float min_p = 0.0f;
  // Adjustments of the logits before anything else (LogitAdjuster): OpenAI's presence and
  // frequency penalties, vLLM's (Hugging Face's) repetition penalty, OpenAI's logit_bias (token
  // id, bias), in id order, ids unique.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;  // > 0
  std::vector<std::pair<int32_t, float>> logit_bias{};
  bool adjusts_logits() const {
    return presence_penalty != 0.0f || frequency_penalty != 0.0f || repetition_penalty != 1.0f ||
           !logit_bias.empty();
  }
  friend bool operator==(const SamplingParams&, const SamplingParams&) = default;
};

// The tokens a request's penalties look at when a row is sampled.
struct TokenHistory {
  std::span<const int32_t> prompt;
  std::span<const int32_t> output;  // generated before the row
};

// A request's logit adjustments (SamplingParams::adjusts_logits), applied to a row of logits
// in this order, each in F32 (vLLM's order: logit_bias among its logits processors, then the
// repetition penalty, then frequency and presence):
//   l += logit_bias[t]
//   l  = l > 0 ? l / repetition_penalty : l * repetition_penalty     t in the prompt or output
//   l -= frequency_penalty * count(t) + presence_penalty * (count(t) > 0)   count: in the output
// add() appends a token to the output (the rows of one verification follow each other).
class LogitAdjuster {
 public:
  LogitAdjuster(const SamplingParams& p, const TokenHistory& h);
  void apply(float* row, int64_t n) const;
  void add(int32_t token);

 private:
  const SamplingParams* p_;
  std::unordered_map<int32_t, int32_t> counts_;  // in the output
  std::unordered_set<int32_t> seen_;             // in the prompt or the output
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

// Draws a token from logits under params (logits already adjusted: LogitAdjuster): greedy when
// temperature == 0; otherwise the softmax of logits / temperature, without the tokens whose
// probability is below min_p times the largest, restricted to the top_k highest logits (ties:
// lower id first), then to the smallest set of highest logits whose probability (within what
// min_p and top-k kept) reaches top_p, renormalised. One uniform draw from rng picks the token by
// inverse CDF (over ids in order when nothing is cut; over the kept tokens in rank order
// otherwise): the same rng state gives the same token. O(vocab) plus a sort of the kept candidates
// only.
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
// so every emitted token is distributed as sample_token's (greedy: the argmax). With logit
// adjustments, row j is adjusted for `history` plus the tokens emitted before it: the tokens are
// those of sampling the rows one step at a time.
std::vector<int32_t> verify_drafts(const float* logits, int64_t n, std::span<const int32_t> drafts,
                                   const SamplingParams& params, std::mt19937_64& rng,
                                   const TokenHistory& history = {});

}  // namespace moeserve
