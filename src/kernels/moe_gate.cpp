#include "kernels/moe_gate.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

namespace moeserve {

namespace {

// Indices of the k largest values (ties: lower index first), in descending value order.
void top_k_indices(const float* v, int64_t n, int64_t k, std::vector<int32_t>* out) {
  out->resize(n);
  std::iota(out->begin(), out->end(), 0);
  std::partial_sort(out->begin(), out->begin() + k, out->end(),
                    [&](int32_t a, int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
  out->resize(k);
}

}  // namespace

void moe_gate_ref(const float* logits, int64_t n_tokens, const float* bias, const MoeGateParams& p,
                  int32_t* ids, float* weights) {
  const int64_t E = p.n_experts;
  const int64_t per_group = E / p.n_group;
  const float kNegInf = -std::numeric_limits<float>::infinity();
  std::vector<float> scores(E), choice(E), group_score(p.n_group);
  std::vector<int32_t> top, groups, in_group;
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* l = logits + t * E;
    if (p.scoring == MoeGateParams::Scoring::kSigmoid) {
      for (int64_t e = 0; e < E; ++e) scores[e] = 1.0f / (1.0f + std::exp(-l[e]));
    } else {
      float mx = *std::max_element(l, l + E);
      double sum = 0.0;
      for (int64_t e = 0; e < E; ++e) sum += std::exp(double(l[e] - mx));
      for (int64_t e = 0; e < E; ++e) scores[e] = float(std::exp(double(l[e] - mx)) / sum);
    }
    for (int64_t e = 0; e < E; ++e) {
      choice[e] = scores[e] + (p.method == MoeGateParams::Method::kNoauxTc ? bias[e] : 0.0f);
    }
    if (p.method != MoeGateParams::Method::kGreedy && p.n_group > 1) {
      for (int64_t g = 0; g < p.n_group; ++g) {
        const float* cg = choice.data() + g * per_group;
        if (p.method == MoeGateParams::Method::kNoauxTc) {
          top_k_indices(cg, per_group, 2, &in_group);
          group_score[g] = cg[in_group[0]] + cg[in_group[1]];
        } else {
          group_score[g] = *std::max_element(cg, cg + per_group);
        }
      }
      top_k_indices(group_score.data(), p.n_group, p.topk_group, &groups);
      std::vector<bool> keep(p.n_group, false);
      for (int32_t g : groups) keep[g] = true;
      for (int64_t e = 0; e < E; ++e) {
        if (!keep[e / per_group]) choice[e] = kNegInf;
      }
    }
    top_k_indices(choice.data(), E, p.top_k, &top);
    int32_t* id = ids + t * p.top_k;
    float* w = weights + t * p.top_k;
    double sum = 0.0;
    for (int64_t j = 0; j < p.top_k; ++j) {
      id[j] = top[j];
      w[j] = scores[top[j]];
      sum += w[j];
    }
    bool normalise = p.norm_topk_prob;
    bool scale = true;
    if (p.weight_rule == MoeGateParams::WeightRule::kV2NormElseScale) {
      normalise = p.norm_topk_prob && p.top_k > 1;
      scale = !normalise;
    }
    for (int64_t j = 0; j < p.top_k; ++j) {
      if (normalise) w[j] = float(w[j] / (sum + 1e-20));
      if (scale) w[j] *= p.routed_scaling_factor;
    }
  }
}

}  // namespace moeserve
