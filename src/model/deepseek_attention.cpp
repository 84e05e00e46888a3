// MLA, DeepSeek-V2/V3's attention (docs/kernels-mla.md): the query through its low-rank
// projection, the latent KV of the new tokens into the paged cache, then attention over every
// cached position, naive (kv_b_proj expands each latent into per-head keys and values) or
// absorbed (kv_b_proj folded into the query and the output: attention in the latent space, the
// served form). Shapes: n = new tokens in the step, H = hidden_size, nh = heads, dn/dr/dv =
// qk_nope/qk_rope/v head dims, R = kv_lora_rank, T = context length.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "kernels/convert.h"
#include "kernels/gemm_bf16.h"
#include "kernels/mla_decode.h"
#include "kernels/rmsnorm.h"
#include "model/deepseek.h"
#include "model/dsa_indexer.h"
#include "model/stage_span.h"

namespace moeserve {

namespace {

// q_a_layernorm and kv_a_layernorm are built without the config's eps in DeepSeek's model.py,
// its hub code and transformers: always 1e-6 (docs/hf-reference.md section 2).
constexpr float kLoraNormEps = 1e-6f;

// In-place softmax over v[0, n).
void softmax(float* v, int64_t n) {
  float mx = *std::max_element(v, v + n);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    v[i] = std::exp(v[i] - mx);
    sum += v[i];
  }
  float inv = float(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) v[i] *= inv;
}

float dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

void DeepseekModel::attention(int64_t layer, std::span<const StepSequence> batch, const float* x,
                              int64_t n, KvCache& cache, float* out) {
  const ModelConfig& c = config_;
  const AttentionWeights& A = weights_.layers[size_t(layer)].attn;
  const int64_t H = c.hidden_size, nh = c.num_attention_heads;
  const int64_t dn = c.qk_nope_head_dim, dv = c.v_head_dim, dq = c.qk_head_dim();
  const int64_t R = c.kv_lora_rank, D = c.kv_cache_dim();

  // Buffers reused across layers and steps (attn_scratch_: tens of MB in a prefill step, which
  // fresh allocations would page-fault in again for every layer); every element is written
  // before it is read.
  std::vector<float>& q = attn_scratch_.q;  // [n, nh, dn + dr]
  q.resize(size_t(n * nh * dq));
  if (A.q_a) {
    const int64_t QR = A.q_a->rows;
    std::vector<float>& qa = attn_scratch_.q_lora;  // [n, q_lora_rank]
    qa.resize(size_t(n * QR));
    linear(x, n, H, *A.q_a, qa.data(), QR);
    norm(qa.data(), n, QR, QR, A.q_a_norm.data(), kLoraNormEps, qa.data(), QR);
    linear(qa.data(), n, QR, A.q_b, q.data(), nh * dq);
  } else {
    linear(x, n, H, A.q_b, q.data(), nh * dq);
  }
  std::vector<float>& kv = attn_scratch_.kv;  // [n, R + dr]: latent, then the shared rope key
  kv.resize(size_t(n * D));
  linear(x, n, H, A.kv_a, kv.data(), D);
  norm(kv.data(), n, R, D, A.kv_a_norm.data(), kLoraNormEps, kv.data(), D);

  int64_t row = 0;
  for (const StepSequence& s : batch) {
    for (size_t i = 0; i < s.tokens.size(); ++i, ++row) {
      int64_t pos = s.start_pos + int64_t(i);
      if (path_ == ComputePath::kFast) {                                // the same bits, vectorized
        rope_.apply_fast(&q[size_t(row * nh * dq + dn)], nh, dq, pos);  // q_pe of every head
        rope_.apply_fast(&kv[size_t(row * D + R)], 1, D, pos);          // k_pe
      } else {
        rope_.apply(&q[size_t(row * nh * dq + dn)], nh, dq, pos);  // q_pe of every head
        rope_.apply(&kv[size_t(row * D + R)], 1, D, pos);          // k_pe
      }
      cache.write(layer, s.block_table, pos, &kv[size_t(row * D)]);
    }
  }

  // DSA (V3.2): which cached positions each new token attends to (docs/dsa.md).
  std::vector<std::vector<int32_t>> selected;
  if (A.indexer) {
    CHECK(A.q_a.has_value(), "the indexer reads the q latent (checked at load)");
    selected = index_select(layer, batch, x, attn_scratch_.q_lora.data(), n, cache);
  }

  std::vector<float>& o = attn_scratch_.o;  // [n, nh, dv]
  o.resize(size_t(n * nh * dv));
  if (path_ == ComputePath::kFast && mode_ != AttentionMode::kNaive) {
    if (selected.empty()) {
      attend_absorbed_fast(layer, batch, q.data(), n, cache, o.data());
    } else {
      attend_dsa_fast(layer, batch, q.data(), n, cache, selected, o.data());
    }
    linear(o.data(), n, nh * dv, A.o, out, H);  // [n, H]
    return;
  }
  std::vector<float> kv_b(size_t(A.kv_b.rows * R));  // [nh * (dn + dv), R] dequantized
  for (int64_t r = 0; r < A.kv_b.rows; ++r) A.kv_b.row_to_f32(r, &kv_b[size_t(r * R)]);

  row = 0;
  for (const StepSequence& s : batch) {
    std::span<const std::vector<int32_t>> sel;
    if (!selected.empty()) sel = std::span(selected).subspan(size_t(row), s.tokens.size());
    attend_sequence(layer, s, &q[size_t(row * nh * dq)], nh * dq, cache, kv_b,
                    &o[size_t(row * nh * dv)], nh * dv, sel);
    row += int64_t(s.tokens.size());
  }
  linear(o.data(), n, nh * dv, A.o, out, H);  // [n, H]
}

// The absorbed form's projections, heads in parallel: q_lat = W_UK^T q_nope per head beside
// q_pe, and o = W_UV o_lat per head; FP8 slices through absorbed_fp8 below, otherwise FP32 GEMMs
// against matrices dequantized at construction.
void DeepseekModel::absorb_queries(int64_t layer, const float* q, int64_t n, float* qa) {
  const ModelConfig& c = config_;
  const int64_t nh = c.num_attention_heads, dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim;
  const int64_t dq = c.qk_head_dim(), R = c.kv_lora_rank, D = c.kv_cache_dim();
  const AbsorbedWeights& W = absorbed_[size_t(layer)];
  for (int64_t i = 0; i < n * nh; ++i) std::copy_n(q + i * dq + dn, dr, qa + i * D + R);  // q_pe
  if (!W.uk_t_fp8.empty()) {  // q_lat [n, R] of head h = q_nope W_UK
    absorbed_fp8(q, n, dq, W.uk_t_fp8, qa, D);
    return;
  }
  // Heads in parallel (one pool pass per projection, not one per head).
  auto q_heads = [&](int64_t h0, int64_t h1) {
    for (int64_t h = h0; h < h1; ++h) {
      gemm_f32_kn(q + h * dq, n, nh * dq, &W.uk[size_t(h * dn * R)], R, dn, R, qa + h * D, nh * D,
                  nullptr);
    }
  };
  pool_ ? pool_->parallel_for(nh, q_heads) : q_heads(0, nh);
}

void DeepseekModel::project_values(int64_t layer, const float* o_lat, int64_t n, float* o) {
  const ModelConfig& c = config_;
  const int64_t nh = c.num_attention_heads, dv = c.v_head_dim, R = c.kv_lora_rank;
  const AbsorbedWeights& W = absorbed_[size_t(layer)];
  if (!W.uv_fp8.empty()) {  // o [n, dv] of head h = o_lat W_UV^T
    absorbed_fp8(o_lat, n, R, W.uv_fp8, o, dv);
    return;
  }
  auto o_heads = [&](int64_t h0, int64_t h1) {
    for (int64_t h = h0; h < h1; ++h) {
      gemm_f32_kn(o_lat + h * R, n, nh * R, &W.uv_t[size_t(h * R * dv)], dv, R, dv, o + h * dv,
                  nh * dv, nullptr);
    }
  };
  pool_ ? pool_->parallel_for(nh, o_heads) : o_heads(0, nh);
}

// y[i, h, :w.n] (head stride dy) = x[i, h, :w.k] (head stride dx) times w[h]^T for every token i
// and head h, in F32 to within FP32 accumulation: each F32 row is split into two BF16 terms, hi =
// bf16(x) and lo = bf16(x - hi) (x - hi is exact, and lo leaves ~2^-17 of x), and gemm_fp8 takes
// both as rows of one GEMM (the slice is read once), y = W hi + W lo. The BF16 dot products
// cost half of gemm_fp8_f32x's FP32 FMAs per row, so at decode, where these slices are 6% of a
// token's bytes and were 10% of its time, they stream near memory speed; at prefill the two
// terms are as much work as the FMAs were. (One BF16 term moved logprobs past the naive form's
// by 0.02-0.04 on the test models: the scores q_lat . c amplify it.) Each thread splits its own
// heads' slices, kChunk tokens at a time, into scratch it keeps: no serial pass over the step.
void DeepseekModel::absorbed_fp8(const float* x, int64_t n, int64_t dx,
                                 std::span<const PackedFp8Weight> w, float* y, int64_t dy) {
  const int64_t nh = int64_t(w.size()), k = w[0].k, out = w[0].n;
  constexpr int64_t kChunk = 64;  // tokens per GEMM: 2 kChunk rows
  // Heads in parallel, each thread splitting its own heads' slices (scratch kept between calls:
  // [hi: c rows][lo: c rows] of k, x - hi of a row, the two terms' products).
  auto heads = [&](int64_t h0, int64_t h1) {
    thread_local std::vector<uint16_t> xs;
    thread_local std::vector<float> res, t;
    xs.resize(size_t(2 * kChunk * k));
    res.resize(size_t(k));
    t.resize(size_t(2 * kChunk * out));
    for (int64_t h = h0; h < h1; ++h) {
      for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
        const int64_t cn = std::min(kChunk, n - i0);
        uint16_t* hi = xs.data();
        uint16_t* lo = hi + cn * k;
        for (int64_t i = 0; i < cn; ++i) {
          const float* xi = x + ((i0 + i) * nh + h) * dx;
          f32_to_bf16_row(xi, k, hi + i * k);
          bf16_to_f32_row(hi + i * k, k, res.data());
          for (int64_t j = 0; j < k; ++j) res[size_t(j)] = xi[j] - res[size_t(j)];
          f32_to_bf16_row(res.data(), k, lo + i * k);
        }
        gemm_fp8(xs.data(), 2 * cn, k, w[size_t(h)], GemmOutput{t.data(), DType::kF32, out},
                 nullptr);
        for (int64_t i = 0; i < cn; ++i) {
          float* yi = y + ((i0 + i) * nh + h) * dy;
          const float* a = t.data() + i * out;
          const float* b = t.data() + (cn + i) * out;
          for (int64_t j = 0; j < out; ++j) yi[j] = a[j] + b[j];
        }
      }
    }
  };
  pool_ ? pool_->parallel_for(nh, heads) : heads(0, nh);
}

MlaShape DeepseekModel::mla_shape() const {
  const ModelConfig& c = config_;
  return MlaShape{c.num_attention_heads, c.kv_lora_rank, c.qk_rope_head_dim,
                  float(c.softmax_scale())};
}

// Absorbed attention on the fast path: q_lat = W_UK^T q_nope per head (FP32 GEMM against
// matrices dequantized at construction), the paged MLA kernel over the cache, then
// o = W_UV o_lat per head.
void DeepseekModel::attend_absorbed_fast(int64_t layer, std::span<const StepSequence> batch,
                                         const float* q, int64_t n, const KvCache& cache,
                                         float* o) {
  const ModelConfig& c = config_;
  const int64_t nh = c.num_attention_heads, R = c.kv_lora_rank, D = c.kv_cache_dim();
  const int64_t dq = c.qk_head_dim(), dv = c.v_head_dim;
  std::vector<float>& qa = attn_scratch_.q_lat;  // [n, nh, R + dr] absorbed queries
  qa.resize(size_t(n * nh * D));
  std::vector<float>& o_lat = attn_scratch_.o_lat;  // [n, nh, R]
  o_lat.resize(size_t(n * nh * R));
  const MlaCacheView view{.blocks = cache.layer_base(layer),
                          .token = cache.layout().token,
                          .num_blocks = cache.num_blocks(),
                          .block_stride = cache.block_stride_bytes()};
  // The whole step in one kernel call (one pass over the pool, not one per sequence), with
  // every sequence's KV cut at fixed 4-block (256-token) boundaries: a sequence's split, and so
  // its rounding, never depends on what else is in the batch. With kMhaPrefill, the sequences
  // whose step attends in MHA form leave it: each run of the others is absorbed, attended and
  // projected on its own (its rows are contiguous), and the MHA ones write their rows after.
  MlaOptions mla_options;
  mla_options.split_blocks = 4;
  const int64_t nh_R = nh * R;
  std::vector<MlaSequence> run;
  int64_t run_row = 0, row = 0;
  auto flush = [&] {
    if (run.empty()) return;
    const int64_t rows = row - run_row;
    absorb_queries(layer, q + run_row * nh * dq, rows, qa.data() + run_row * nh * D);
    mla_decode(MlaBatch{mla_shape(), view, run, qa.data() + run_row * nh * D, DType::kF32,
                        o_lat.data() + run_row * nh_R, nullptr},
               pool_, mla_options);
    project_values(layer, o_lat.data() + run_row * nh_R, rows, o + run_row * nh * dv);
    run.clear();
  };
  std::vector<std::pair<size_t, int64_t>> mha;  // (sequence, first row)
  for (size_t i = 0; i < batch.size(); ++i) {
    const StepSequence& s = batch[i];
    const int64_t len = int64_t(s.tokens.size());
    if (len == 0) continue;
    if (mode_ == AttentionMode::kMhaPrefill && mha_step(len, s.start_pos + len)) {
      flush();
      mha.emplace_back(i, row);
    } else {
      if (run.empty()) run_row = row;
      run.push_back(MlaSequence{s.block_table, s.start_pos + len, len});
    }
    row += len;
  }
  flush();
  for (const auto& [i, r] : mha)
    attend_mha_fast(layer, batch[i], q + r * nh * dq, cache, o + r * nh * dv);
}

// Multiply-adds per (query, key) pair and head: the absorbed form's scores over R + dr with F32
// queries as two BF16 terms, then P V over R; the MHA form's scores over dn + dr (BF16 queries;
// the kernel skips their zero V columns, MlaShape::q_zero_dims), then P V over dv. The MHA form
// also expands every cached token per head (R x (dn + dv)), counted twice for the copies into
// per-head rows. V3's widths: 1,664 against 320 a pair; a whole prompt of more than ~390
// tokens, or a chunk of more than ~200 at a long context.
bool DeepseekModel::mha_step(int64_t n_new, int64_t T) const {
  if (n_new < 2) return false;
  if (mha_min_tokens_ > 0) return n_new >= mha_min_tokens_;
  const ModelConfig& c = config_;
  const double R = double(c.kv_lora_rank), dr = double(c.qk_rope_head_dim);
  const double dn = double(c.qk_nope_head_dim), dv = double(c.v_head_dim);
  const double absorbed = 2 * (R + dr) + R, mha = dn + dr + dv;
  const double n = double(n_new);
  const double pairs = n * double(T - n_new) + n * (n + 1) / 2;
  return pairs * (absorbed - mha) > 2 * double(T) * R * (dn + dv);
}

// Attention of one sequence's step in MHA form on the fast path (DeepSeek's prefill form):
// every cached latent of the sequence expanded by kv_b_proj into per-head keys and values (the
// fast path's GEMMs, 512 tokens at a time), stored per head as BF16 rows [V (dv) | K_nope (dn) |
// K_rope (dr)] in 64-token blocks, and the paged MLA kernel run over them with one head per
// "sequence": its latent is V and its rope part the whole key, and each query row is
// [0 (dv) | q_nope | q_pe], so its scores are q_nope . k_nope + q_pe . k_pe exactly (zeros times
// V add nothing; the kernel skips them) and its output is the V-weighted sum. Each head's K, V
// and queries are rounded to BF16 once (the absorbed form's cache is BF16 anyway).
void DeepseekModel::attend_mha_fast(int64_t layer, const StepSequence& s, const float* q,
                                    const KvCache& cache, float* o) {
  const ModelConfig& c = config_;
  const AttentionWeights& A = weights_.layers[size_t(layer)].attn;
  const int64_t nh = c.num_attention_heads, dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim;
  const int64_t dv = c.v_head_dim, dq = c.qk_head_dim(), R = c.kv_lora_rank, D = c.kv_cache_dim();
  const int64_t n = int64_t(s.tokens.size()), T = s.start_pos + n;
  const int64_t Dm = dv + dn + dr, W = nh * (dn + dv);
  const int64_t nblk = (T + kMlaBlockTokens - 1) / kMlaBlockTokens;
  AttentionScratch& S = attn_scratch_;
  S.mha_blocks.resize(size_t(nh * nblk * kMlaBlockTokens * Dm));
  uint16_t* blocks = S.mha_blocks.data();

  constexpr int64_t kChunk = 512;
  const int64_t chunk = std::min(T, kChunk);
  S.mha_lat.resize(size_t(chunk * D));
  S.mha_kv.resize(size_t(chunk * W));
  float* lat = S.mha_lat.data();
  const float* kv = S.mha_kv.data();
  for (int64_t t0 = 0; t0 < T; t0 += kChunk) {
    const int64_t m = std::min(kChunk, T - t0);
    auto read = [&](int64_t a, int64_t b) {
      for (int64_t t = a; t < b; ++t) cache.read(layer, s.block_table, t0 + t, lat + t * D);
    };
    pool_ ? pool_->parallel_for(m, read, 16) : read(0, m);
    linear(lat, m, D, A.kv_b, S.mha_kv.data(), W);  // [m, nh, dn + dv]
    auto place = [&](int64_t a, int64_t b) {
      for (int64_t t = a; t < b; ++t) {
        const int64_t tok = t0 + t;
        for (int64_t h = 0; h < nh; ++h) {
          const float* kvh = kv + t * W + h * (dn + dv);  // K_nope, then V
          uint16_t* dst =
              blocks +
              ((h * nblk + tok / kMlaBlockTokens) * kMlaBlockTokens + tok % kMlaBlockTokens) * Dm;
          f32_to_bf16_row(kvh + dn, dv, dst);
          f32_to_bf16_row(kvh, dn, dst + dv);
          f32_to_bf16_row(lat + t * D + R, dr, dst + dv + dn);  // the cached rope key (exact)
        }
      }
    };
    pool_ ? pool_->parallel_for(m, place, 16) : place(0, m);
  }

  // The queries [heads][n][Dm] in BF16, as prefill attention kernels take them (FlashAttention's,
  // DeepSeek's), not F32 as hi + lo (the absorbed form's latent queries need that:
  // docs/kernels-mla.md, "Numerics"): against transformers every fixture stayed within its bound
  // (MhaPrefill suite: max |dlogprob| 0.029-0.136, against 0.055-0.168 with F32 queries).
  S.mha_q.resize(size_t(nh * n * Dm));
  for (int64_t h = 0; h < nh; ++h) {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t* d = &S.mha_q[size_t((h * n + i) * Dm)];
      std::fill_n(d, dv, uint16_t(0));
      f32_to_bf16_row(q + (i * nh + h) * dq, dq, d + dv);
    }
  }
  S.mha_tables.resize(size_t(nh * nblk));
  std::vector<MlaSequence> seqs;
  for (int64_t h = 0; h < nh; ++h) {
    int32_t* table = &S.mha_tables[size_t(h * nblk)];
    for (int64_t b = 0; b < nblk; ++b) table[b] = int32_t(h * nblk + b);
    seqs.push_back(MlaSequence{std::span<const int32_t>(table, size_t(nblk)), T, n});
  }
  // (The kernel skips the queries' zero V columns in the scores: q_zero_dims, an even count.)
  const MlaShape shape{1, dv, dn + dr, mla_shape().softmax_scale, dv % 2 == 0 ? dv : 0};
  const MlaCacheView view{
      .blocks = blocks, .token = KvTokenFormat{DType::kBF16, dv, dn + dr}, .num_blocks = nh * nblk};
  S.mha_o.resize(size_t(nh * n * dv));
  MlaOptions options;
  options.split_blocks = 4;
  mla_decode(MlaBatch{shape, view, seqs, S.mha_q.data(), DType::kBF16, S.mha_o.data(), nullptr},
             pool_, options);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t h = 0; h < nh; ++h) {
      std::copy_n(&S.mha_o[size_t((h * n + i) * dv)], dv, o + (i * nh + h) * dv);
    }
  }
}

void DeepseekModel::attend_sequence(int64_t layer, const StepSequence& s, const float* q,
                                    int64_t ldq, const KvCache& cache,
                                    const std::vector<float>& kv_b, float* o, int64_t ldo,
                                    std::span<const std::vector<int32_t>> selected) {
  const ModelConfig& c = config_;
  const int64_t nh = c.num_attention_heads, dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim;
  const int64_t dv = c.v_head_dim, dq = c.qk_head_dim(), R = c.kv_lora_rank, D = c.kv_cache_dim();
  const int64_t n_new = int64_t(s.tokens.size());
  const int64_t T = s.start_pos + n_new;
  const float scale = float(c.softmax_scale());
  if (n_new == 0) return;

  std::vector<float> ctx(size_t(T * D));  // [T, R + dr] cached latents and rope keys
  for (int64_t t = 0; t < T; ++t) cache.read(layer, s.block_table, t, &ctx[size_t(t * D)]);

  std::vector<float> kvx;  // naive only: [T, nh, dn + dv] per-head keys (nope part) and values
  if (mode_ == AttentionMode::kNaive) {
    const int64_t W = nh * (dn + dv);
    kvx.resize(size_t(T * W));
    auto expand = [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        for (int64_t r = 0; r < W; ++r) {
          kvx[size_t(t * W + r)] = dot(&ctx[size_t(t * D)], &kv_b[size_t(r * R)], R);
        }
      }
    };
    pool_ ? pool_->parallel_for(T, expand) : expand(0, T);
  }

  auto heads = [&](int64_t h0, int64_t h1) {
    std::vector<float> scores(static_cast<size_t>(T)), q_lat(static_cast<size_t>(R)),
        o_lat(static_cast<size_t>(R));
    for (int64_t h = h0; h < h1; ++h) {
      const float* wk = &kv_b[size_t(h * (dn + dv) * R)];         // [dn, R] key rows of head h
      const float* wv = &kv_b[size_t((h * (dn + dv) + dn) * R)];  // [dv, R] value rows
      for (int64_t i = 0; i < n_new; ++i) {
        const float* qh = q + i * ldq + h * dq;  // [dn + dr]
        // Causal: positions [0, pos], or (DSA) the selected ones; score j is position at(j).
        const std::vector<int32_t>* sel =
            selected.empty() || selected[size_t(i)].empty() ? nullptr : &selected[size_t(i)];
        const int64_t n_ctx = sel ? int64_t(sel->size()) : s.start_pos + i + 1;
        auto at = [&](int64_t j) { return sel ? int64_t((*sel)[size_t(j)]) : j; };
        float* oh = o + i * ldo + h * dv;  // [dv]
        if (mode_ == AttentionMode::kNaive) {
          const int64_t W = nh * (dn + dv);
          for (int64_t j = 0; j < n_ctx; ++j) {
            const int64_t t = at(j);
            const float* k = &kvx[size_t(t * W + h * (dn + dv))];
            scores[size_t(j)] =
                (dot(qh, k, dn) + dot(qh + dn, &ctx[size_t(t * D + R)], dr)) * scale;
          }
          softmax(scores.data(), n_ctx);
          std::fill(oh, oh + dv, 0.0f);
          for (int64_t j = 0; j < n_ctx; ++j) {
            const float* v = &kvx[size_t(at(j) * W + h * (dn + dv) + dn)];
            for (int64_t d = 0; d < dv; ++d) oh[d] += scores[size_t(j)] * v[d];
          }
        } else {
          // q_lat = W_k^T q_nope: [R]
          std::fill(q_lat.begin(), q_lat.end(), 0.0f);
          for (int64_t d = 0; d < dn; ++d) {
            for (int64_t r = 0; r < R; ++r) q_lat[size_t(r)] += qh[d] * wk[d * R + r];
          }
          for (int64_t j = 0; j < n_ctx; ++j) {
            const float* kt = &ctx[size_t(at(j) * D)];
            scores[size_t(j)] = (dot(q_lat.data(), kt, R) + dot(qh + dn, kt + R, dr)) * scale;
          }
          softmax(scores.data(), n_ctx);
          std::fill(o_lat.begin(), o_lat.end(), 0.0f);  // [R] attention-weighted latent
          for (int64_t j = 0; j < n_ctx; ++j) {
            const float* kt = &ctx[size_t(at(j) * D)];
            for (int64_t r = 0; r < R; ++r) o_lat[size_t(r)] += scores[size_t(j)] * kt[r];
          }
          for (int64_t j = 0; j < dv; ++j) oh[j] = dot(wv + j * R, o_lat.data(), R);
        }
      }
    }
  };
  pool_ ? pool_->parallel_for(nh, heads) : heads(0, nh);
}

// DSA on the fast path, absorbed form: every new token's query absorbed once; the tokens whose
// context fits the top-k (a leading run per sequence) through the paged MLA kernel over the
// cache; each other token through sparse MLA over its selected positions (kernels/mla_decode.h,
// mla_sparse). A token's result depends only on its own query and selection (every sequence
// split at fixed 4-block boundaries), so batching and chunking change no bits.
void DeepseekModel::attend_dsa_fast(int64_t layer, std::span<const StepSequence> batch,
                                    const float* q, int64_t n, const KvCache& cache,
                                    const std::vector<std::vector<int32_t>>& selected, float* o) {
  const ModelConfig& c = config_;
  const int64_t nh = c.num_attention_heads, R = c.kv_lora_rank, D = c.kv_cache_dim();
  std::vector<float>& qa = attn_scratch_.q_lat;  // [n, nh, D] absorbed queries
  qa.resize(size_t(n * nh * D));
  absorb_queries(layer, q, n, qa.data());
  std::vector<float>& o_lat = attn_scratch_.o_lat;  // [n, nh, R]
  o_lat.resize(size_t(n * nh * R));
  MlaOptions mla_options;
  mla_options.split_blocks = 4;
  const MlaCacheView view{.blocks = cache.layer_base(layer),
                          .token = cache.layout().token,
                          .num_blocks = cache.num_blocks(),
                          .block_stride = cache.block_stride_bytes()};

  std::vector<MlaSequence> dense;   // each sequence's leading run of dense tokens
  std::vector<int64_t> dense_rows;  // their rows in the step
  std::vector<int64_t> sparse_rows;
  std::vector<MlaSparseQuery> sparse;
  int64_t row = 0;
  for (const StepSequence& s : batch) {
    const int64_t len = int64_t(s.tokens.size());
    int64_t k = 0;  // selections are empty exactly while the context fits the top-k
    while (k < len && selected[size_t(row + k)].empty()) ++k;
    if (k > 0) dense.push_back(MlaSequence{s.block_table, s.start_pos + k, k});
    for (int64_t i = 0; i < len; ++i) {
      if (i < k) {
        dense_rows.push_back(row + i);
      } else {
        sparse_rows.push_back(row + i);
        sparse.push_back({s.block_table, selected[size_t(row + i)]});
      }
    }
    row += len;
  }
  // The kernels take their query rows contiguous: copied in and out.
  auto run = [&](std::span<const int64_t> rows, auto&& kernel) {
    const int64_t m = int64_t(rows.size());
    if (m == 0) return;
    std::vector<float> qm(size_t(m * nh * D)), om(size_t(m * nh * R));
    for (int64_t i = 0; i < m; ++i) {
      std::copy_n(&qa[size_t(rows[size_t(i)] * nh * D)], nh * D, &qm[size_t(i * nh * D)]);
    }
    kernel(qm.data(), om.data());
    for (int64_t i = 0; i < m; ++i) {
      std::copy_n(&om[size_t(i * nh * R)], nh * R, &o_lat[size_t(rows[size_t(i)] * nh * R)]);
    }
  };
  run(dense_rows, [&](const float* qm, float* om) {
    mla_decode(MlaBatch{mla_shape(), view, dense, qm, DType::kF32, om, nullptr}, pool_,
               mla_options);
  });
  run(sparse_rows, [&](const float* qm, float* om) {
    mla_sparse(MlaSparseBatch{mla_shape(), view, sparse, qm, DType::kF32, om, nullptr}, pool_,
               mla_options);
  });
  project_values(layer, o_lat.data(), n, o);
}

std::vector<std::vector<int32_t>> DeepseekModel::index_select(int64_t layer,
                                                              std::span<const StepSequence> batch,
                                                              const float* x, const float* q_latent,
                                                              int64_t n, KvCache& cache) {
  const ModelConfig& c = config_;
  const IndexerWeights& I = *weights_.layers[size_t(layer)].attn.indexer;
  const int64_t H = c.hidden_size, QR = *c.q_lora_rank, dr = c.qk_rope_head_dim;
  const int64_t ih = c.indexer->n_heads, d = kIndexKeyDim, top_k = c.indexer->topk;
  const int64_t key_part = cache.layout().find_part(layer, KvPartKind::kIndexKey);
  CHECK(key_part >= 0 && c.indexer->head_dim == d, "the layer keeps 128-value index keys");
  constexpr float kIndexNormEps = 1e-6f;  // k_norm: LayerNorm(eps=1e-6) in DeepSeek's model.py

  // Rows in batch order: which sequence, at which position.
  struct Row {
    const StepSequence* seq;
    int64_t pos;
  };
  std::vector<Row> rows;
  rows.reserve(size_t(n));
  for (const StepSequence& s : batch) {
    for (size_t i = 0; i < s.tokens.size(); ++i) rows.push_back({&s, s.start_pos + int64_t(i)});
  }
  std::vector<float> q(size_t(n * ih * d)), k(size_t(n * d)), w(size_t(n * ih));
  linear(q_latent, n, QR, I.wq_b, q.data(), ih * d);  // [n, ih, d]
  linear(x, n, H, I.wk, k.data(), d);                 // [n, d]
  linear(x, n, H, I.weights_proj, w.data(), ih);      // [n, ih]
  std::vector<uint8_t> q8(size_t(n * ih * d));        // [n, ih, d] e4m3

  // DeepSeek's arithmetic (FP8 keys in the cache) or transformers' (F32 keys): docs/dsa.md.
  const bool fp8 =
      cache.layout().layer(layer).parts[size_t(key_part)].index_dtype == DType::kF8E4M3;
  // Keys into the cache (every new token's before any query scores), queries prepared.
  auto prepare = [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const Row& row = rows[size_t(r)];
      float* kr = &k[size_t(r * d)];
      layer_norm(kr, d, I.k_norm.data(), I.k_bias.data(), kIndexNormEps);
      rope_half(kr, dr, rope_.inv_freq(), rope_.attention_factor(), row.pos);  // first dr dims
      uint8_t* entry = cache.token_entry(layer, size_t(key_part), row.seq->block_table, row.pos);
      if (fp8) {
        hadamard_rotate(kr, d);
        const float ks = quantize_index_fp8(kr, entry);
        std::memcpy(entry + d, &ks, sizeof ks);
      } else {
        std::memcpy(entry, kr, size_t(d) * sizeof(float));
      }
      for (int64_t h = 0; h < ih; ++h) {
        float* qh = &q[size_t((r * ih + h) * d)];
        float& wh = w[size_t(r * ih + h)];
        rope_half(qh, dr, rope_.inv_freq(), rope_.attention_factor(), row.pos);
        wh = wh * (1.0f / std::sqrt(float(ih)));
        if (!fp8) continue;
        hadamard_rotate(qh, d);
        const float qs = quantize_index_fp8(qh, &q8[size_t((r * ih + h) * d)]);
        wh = wh * qs * (1.0f / std::sqrt(float(d)));
      }
    }
  };
  pool_ ? pool_->parallel_for(n, prepare) : prepare(0, n);

  std::vector<std::vector<int32_t>> selected(static_cast<size_t>(n));
  if (fp8) {  // the SIMD scores and top-k of kernels/index_score.h
    std::vector<IndexRows> seqs;
    std::vector<std::vector<const uint8_t*>> blocks(batch.size());
    int64_t row0 = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
      const StepSequence& s = batch[i];
      const int64_t rows = int64_t(s.tokens.size());
      const int64_t end = s.start_pos + rows;  // keys [0, end)
      for (int64_t b = 0; b * kIndexKeyBlock < end; ++b) {
        blocks[i].push_back(
            cache.token_entry(layer, size_t(key_part), s.block_table, b * kIndexKeyBlock));
      }
      seqs.push_back(IndexRows{q8.data() + row0 * ih * d, w.data() + row0 * ih, rows, s.start_pos,
                               IndexKeys{blocks[i]}});
      row0 += rows;
    }
    selected.clear();
    index_topk(seqs, ih, top_k, pool_, selected);
    return selected;
  }
  auto select = [&](int64_t r0, int64_t r1) {  // transformers' arithmetic (F32 keys)
    std::vector<float> scores;
    for (int64_t r = r0; r < r1; ++r) {
      const Row& row = rows[size_t(r)];
      const int64_t n_ctx = row.pos + 1;
      if (n_ctx <= top_k) continue;  // every position: dense attention
      scores.resize(size_t(n_ctx));
      for (int64_t t = 0; t < n_ctx; ++t) {
        const uint8_t* key = cache.token_entry(layer, size_t(key_part), row.seq->block_table, t);
        float kf[kIndexKeyDim];
        std::memcpy(kf, key, sizeof kf);
        scores[size_t(t)] = index_score_f32(&q[size_t(r * ih * d)], &w[size_t(r * ih)], ih, kf,
                                            1.0f / std::sqrt(float(d)));
      }
      selected[size_t(r)] = top_k_positions(scores, top_k);
    }
  };
  pool_ ? pool_->parallel_for(n, select) : select(0, n);
  return selected;
}

}  // namespace moeserve
