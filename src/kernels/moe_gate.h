// MoE gate: router logits -> top-k expert ids and weights, per DeepSeek's variants.
//
//   scores = sigmoid(logits) or softmax(logits)
//   selection (noaux_tc): choice = scores + e_score_correction_bias (bias only for choosing);
//       groups scored by the sum of their top-2 choice values, the best topk_group groups kept;
//   selection (group_limited_greedy): groups scored by their max score, topk_group kept;
//   selection (greedy): all experts;
//   ids = top-k of the (masked) choice values; weights = scores[ids] (never biased);
//   then the weights are normalised to sum 1 and/or multiplied by routed_scaling_factor as
//   `weight_rule` says (V3: normalise if norm_topk_prob, then always scale; V2: normalise if
//   norm_topk_prob and top_k > 1, otherwise scale).
// Ties go to the lower index. Pure function of its inputs; no allocation beyond scratch.
#pragma once

#include <cstdint>

namespace moeserve {

struct MoeGateParams {
  enum class Scoring { kSigmoid, kSoftmax } scoring = Scoring::kSoftmax;
  enum class Method { kNoauxTc, kGroupLimitedGreedy, kGreedy } method = Method::kGreedy;
  enum class WeightRule {
    kV3NormThenScale,
    kV2NormElseScale
  } weight_rule = WeightRule::kV3NormThenScale;
  int64_t n_experts = 0;
  int64_t top_k = 0;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  bool norm_topk_prob = false;
  float routed_scaling_factor = 1.0f;
};

// logits: [n_tokens, n_experts]; bias: [n_experts] or nullptr (noaux_tc requires it);
// ids: [n_tokens, top_k]; weights: [n_tokens, top_k].
void moe_gate_ref(const float* logits, int64_t n_tokens, const float* bias, const MoeGateParams& p,
                  int32_t* ids, float* weights);

}  // namespace moeserve
