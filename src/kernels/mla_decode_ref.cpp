// mla_decode_ref: the scalar reference. Per query row, every head scores every visible token
// in FP32, then a two-pass softmax and the weighted sum of latents, exactly as the header's
// formulas read. Cached tokens are converted to float once per query row.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/check.h"
#include "kernels/mla_decode.h"
#include "kernels/mla_decode_internal.h"

namespace moeserve {

namespace {

struct Row {
  const MlaSequence* seq;
  int64_t pos;  // the query's position: it sees tokens [0, pos]
};

// Token t of a sequence as dim floats (the cache's values, exactly: kernels/kv_token.h).
void load_token(const MlaCacheView& c, const MlaSequence& s, int64_t t, float* out) {
  const int64_t block = s.block_table[size_t(t / kMlaBlockTokens)];
  const uint8_t* p = static_cast<const uint8_t*>(c.blocks) + block * c.stride() +
                     (t % kMlaBlockTokens) * c.token.bytes();
  kv_token_load(c.token, p, out);
}

}  // namespace

void mla_decode_ref(const MlaBatch& b, ThreadPool* pool) {
  mla_detail::validate(b);
  const int64_t H = b.shape.heads, R = b.shape.kv_lora_rank, D = b.shape.dim();
  std::vector<Row> rows;
  for (const MlaSequence& s : b.seqs) {
    for (int64_t i = 0; i < s.n_queries; ++i)
      rows.push_back(Row{&s, s.context_len - s.n_queries + i});
  }
  auto run = [&](int64_t r0, int64_t r1) {
    std::vector<float> q(size_t(H * D));  // [H, D]
    std::vector<float> k, scores;         // [n, D], [H, n]
    for (int64_t r = r0; r < r1; ++r) {
      const Row& row = rows[size_t(r)];
      const int64_t n = row.pos + 1;
      for (int64_t i = 0; i < H * D; ++i) {
        const size_t at = size_t(r * H * D + i);
        q[size_t(i)] = b.q_dtype == DType::kF32
                           ? static_cast<const float*>(b.q)[at]
                           : bf16_to_f32(static_cast<const uint16_t*>(b.q)[at]);
      }
      k.resize(size_t(n * D));
      for (int64_t t = 0; t < n; ++t) load_token(b.cache, *row.seq, t, &k[size_t(t * D)]);
      scores.resize(size_t(H * n));
      for (int64_t h = 0; h < H; ++h) {
        const float* qh = &q[size_t(h * D)];  // [D]
        float* sh = &scores[size_t(h * n)];   // [n]
        float mx = -INFINITY;
        for (int64_t t = 0; t < n; ++t) {
          const float* kt = &k[size_t(t * D)];
          float dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += qh[d] * kt[d];
          sh[t] = dot * b.shape.softmax_scale;
          mx = std::max(mx, sh[t]);
        }
        float sum = 0;
        for (int64_t t = 0; t < n; ++t) {
          sh[t] = std::exp(sh[t] - mx);
          sum += sh[t];
        }
        float* o = b.o + (r * H + h) * R;  // [R]
        std::fill(o, o + R, 0.0f);
        for (int64_t t = 0; t < n; ++t) {
          const float p = sh[t] / sum;
          const float* v = &k[size_t(t * D)];  // the latent: first R values
          for (int64_t j = 0; j < R; ++j) o[j] += p * v[j];
        }
        if (b.lse) b.lse[r * H + h] = mx + std::log(sum);
      }
    }
  };
  const int64_t n_rows = int64_t(rows.size());
  if (pool) {
    pool->parallel_for(n_rows, run);
  } else {
    run(0, n_rows);
  }
}

}  // namespace moeserve
