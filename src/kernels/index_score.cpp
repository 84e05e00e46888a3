#include "kernels/index_score.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/dtype.h"

namespace moeserve {

float index_score(const uint8_t* q_fp8, const float* w, int64_t n_heads, const uint8_t* key,
                  float key_scale) {
  float k[kIndexKeyDim];
  for (int64_t d = 0; d < kIndexKeyDim; ++d) k[d] = fp8e4m3_to_f32(key[d]);
  float sum = 0;
  for (int64_t h = 0; h < n_heads; ++h) {
    const uint8_t* qh = q_fp8 + h * kIndexKeyDim;
    float dot = 0;
    for (int64_t d = 0; d < kIndexKeyDim; ++d) dot += fp8e4m3_to_f32(qh[d]) * k[d];
    sum += w[h] * std::max(dot, 0.0f);
  }
  return key_scale * sum;
}

void index_scores_fp8(const uint8_t* q8, const float* w, int64_t rows, int64_t heads,
                      const IndexKeys& keys, int64_t key_begin, int64_t key_end, float* scores,
                      int64_t ld, Isa isa) {
  if (isa >= Isa::kAvx512Bf16 && heads % 16 == 0) {
    return index_score_detail::index_scores_avx512(q8, w, rows, heads, keys, key_begin, key_end,
                                                   scores, ld);
  }
  for (int64_t s = key_begin; s < key_end; ++s) {
    const uint8_t* key =
        keys.blocks[size_t(s / kIndexKeyBlock)] + (s % kIndexKeyBlock) * kIndexKeyEntryBytes;
    float ks;
    std::memcpy(&ks, key + kIndexKeyDim, sizeof ks);
    for (int64_t r = 0; r < rows; ++r) {
      scores[r * ld + (s - key_begin)] =
          index_score(q8 + r * heads * kIndexKeyDim, w + r * heads, heads, key, ks);
    }
  }
}

std::vector<int32_t> top_k_positions(std::span<const float> scores, int64_t k) {
  std::vector<int32_t> idx(scores.size());
  std::iota(idx.begin(), idx.end(), 0);
  if (k < int64_t(idx.size())) {
    auto better = [&](int32_t a, int32_t b) {
      return scores[size_t(a)] > scores[size_t(b)] ||
             (scores[size_t(a)] == scores[size_t(b)] && a < b);
    };
    std::nth_element(idx.begin(), idx.begin() + k, idx.end(), better);
    idx.resize(size_t(k));
  }
  std::sort(idx.begin(), idx.end());
  return idx;
}

void index_topk(std::span<const IndexRows> seqs, int64_t heads, int64_t top_k, ThreadPool* pool,
                std::vector<std::vector<int32_t>>& out, Isa isa) {
  constexpr int64_t kGroup = 8, kChunk = 64 * kIndexKeyBlock;
  const size_t out0 = out.size();
  struct Group {
    const IndexRows* seq;
    int64_t first, rows, n_keys;  // rows [first, first + rows) of seq; keys [0, n_keys)
    size_t out;                   // the first row's index in `out`
    std::vector<float> scores;    // [rows][n_keys]
  };
  std::vector<Group> groups;
  size_t row = out0;
  for (const IndexRows& s : seqs) {
    // Rows whose context fits the top-k select nothing.
    const int64_t dense = std::clamp<int64_t>(top_k - s.first_pos, 0, s.rows);
    for (int64_t i = dense; i < s.rows; i += kGroup) {
      Group g{&s, i, std::min(kGroup, s.rows - i), 0, row + size_t(i), {}};
      g.n_keys = s.first_pos + i + g.rows;  // the group's last row's context
      g.scores.resize(size_t(g.rows * g.n_keys));
      groups.push_back(std::move(g));
    }
    row += size_t(s.rows);
  }
  out.resize(row);
  struct Task {
    size_t group;
    int64_t key_begin, key_end;
  };
  std::vector<Task> tasks;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    for (int64_t k0 = 0; k0 < groups[gi].n_keys; k0 += kChunk) {
      tasks.push_back({gi, k0, std::min(groups[gi].n_keys, k0 + kChunk)});
    }
  }
  auto score = [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const Task& task = tasks[size_t(t)];
      Group& g = groups[task.group];
      index_scores_fp8(g.seq->q8 + g.first * heads * kIndexKeyDim, g.seq->w + g.first * heads,
                       g.rows, heads, g.seq->keys, task.key_begin, task.key_end,
                       g.scores.data() + task.key_begin, g.n_keys, isa);
    }
  };
  pool ? pool->parallel_for(int64_t(tasks.size()), score) : score(0, int64_t(tasks.size()));
  auto pick = [&](int64_t g0, int64_t g1) {
    for (int64_t gi = g0; gi < g1; ++gi) {
      const Group& g = groups[size_t(gi)];
      for (int64_t i = 0; i < g.rows; ++i) {
        const int64_t n_ctx = g.n_keys - (g.rows - 1 - i);  // causal: up to the row's position
        out[g.out + size_t(i)] = top_k_positions(
            std::span(g.scores).subspan(size_t(i * g.n_keys), size_t(n_ctx)), top_k);
      }
    }
  };
  pool ? pool->parallel_for(int64_t(groups.size()), pick) : pick(0, int64_t(groups.size()));
}

}  // namespace moeserve
