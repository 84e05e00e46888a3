// The fast path's weights, prepared once at construction (DeepseekModel::prepare_fast_path):
// FP8 projections repacked into gemm_fp8's tiles (or requantized for gemm_int8), kv_b_proj split
// per head for absorbed attention (kept FP8 where its slices are whole scale blocks), the router in
// F32 and the BF16 lm_head in the tiled layout. The packing runs over the thread pool, with an
// in-place progress line on stderr when asked (minutes for a 671B checkpoint).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>

#include <fmt/format.h>
#include <xxhash.h>

#include "core/check.h"
#include "core/file_pages.h"
#include "kernels/gemm_bf16.h"
#include "model/deepseek.h"
#include "model/weight_cache.h"

namespace moeserve {

bool DeepseekModel::absorbed_fp8_ok(const WeightView& kv_b) const {
  const int64_t dn = config_.qk_nope_head_dim, dv = config_.v_head_dim;
  return kv_b.dtype == DType::kF8E4M3 && kv_b.block_rows == 128 && kv_b.block_cols == 128 &&
         dn % 128 == 0 && dv % 128 == 0;
}

void DeepseekModel::pack_absorbed_fp8(const WeightView& kv_b, AbsorbedWeights& W) const {
  const int64_t nh = config_.num_attention_heads, dn = config_.qk_nope_head_dim;
  const int64_t dv = config_.v_head_dim, R = config_.kv_lora_rank;
  const int64_t rb = (R + 127) / 128, sc = kv_b.scale_cols();  // R's scale blocks
  std::vector<uint8_t> bytes;
  std::vector<float> scales;
  for (int64_t h = 0; h < nh; ++h) {
    const int64_t row0 = h * (dn + dv);  // a multiple of 128
    // W_UK^T [R, dn]: element (r, d) = kv_b[row0 + d, r]; block (r/128, d/128) has the scale
    // of kv_b block (row0/128 + d/128, r/128).
    bytes.assign(size_t(R * dn), 0);
    for (int64_t d = 0; d < dn; ++d) {
      const uint8_t* src = kv_b.data + (row0 + d) * kv_b.cols;
      for (int64_t r = 0; r < R; ++r) bytes[size_t(r * dn + d)] = src[r];
    }
    scales.assign(size_t(rb * (dn / 128)), 0.0f);
    for (int64_t a = 0; a < rb; ++a)
      for (int64_t b = 0; b < dn / 128; ++b)
        scales[size_t(a * (dn / 128) + b)] = kv_b.scale_inv[(row0 / 128 + b) * sc + a];
    W.uk_t_fp8.push_back(pack_fp8_weight(bytes.data(), scales.data(), R, dn));
    // W_UV [dv, R]: rows row0 + dn + j of kv_b as they are, with their scale rows.
    const int64_t vrow0 = row0 + dn;
    W.uv_fp8.push_back(
        pack_fp8_weight(kv_b.data + vrow0 * kv_b.cols, kv_b.scale_inv + (vrow0 / 128) * sc, dv, R));
  }
}

namespace {

// The cache key of the prepared weights (docs/memory.md): the model, the options that change
// the packed bytes, and where each packed tensor lies in the checkpoint (which experts this
// process holds). Null when a tensor is not in a mapped checkpoint file (weights built in
// memory): those are not cached.
std::optional<uint64_t> weight_cache_key(uint64_t model_key, const WeightFormats& formats,
                                         std::span<const WeightView* const> sources,
                                         std::span<const DeepseekModel::PackJob> jobs) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  auto add = [&](const auto& v) { XXH3_64bits_update(st, &v, sizeof v); };
  const uint64_t version = 2;  // of the packed layouts and the file (2: the head's format)
  add(version);
  add(model_key);
  add(formats.projections);
  add(formats.lm_head);
  for (const DeepseekModel::PackJob& j : jobs) add(j.format);
  bool ok = true;
  for (const WeightView* w : sources) {
    if (!(ok = add_weight_place(st, *w))) break;
  }
  const uint64_t key = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  if (!ok) return std::nullopt;
  return key;
}

}  // namespace

void DeepseekModel::prepare_fast_path(bool progress, const WeightCacheOptions& cache) {
  // Collect the FP8 projections first (map slots created here), then pack them in parallel.
  std::vector<PackJob> jobs;
  auto pack = [&](const WeightView& w, WeightFormat format) {
    if (w.dtype != DType::kF8E4M3 || packed_.count(w.data)) return;
    CHECK(w.block_rows == 128 && w.block_cols == 128, "gemm_fp8 needs 128x128 scale blocks");
    jobs.push_back({&w, &packed_[w.data], format});
  };
  const WeightFormat dense = formats_.projections, routed = formats_.expert_format();
  auto pack_mlp = [&](const MlpWeights& m, WeightFormat format) {
    pack(m.gate, format);
    pack(m.up, format);
    pack(m.down, format);
  };
  auto pack_moe = [&](const MoeWeights& moe) {
    for (const auto& e : moe.experts) {
      if (e) pack_mlp(*e, routed);
    }
    if (moe.shared) pack_mlp(*moe.shared, dense);
    // [E, H] router weights, exact in F32: read as they are when BF16 (gemm_f32_bf16w, the bits
    // of an F32 copy at half the bytes), else an F32 copy.
    const WeightView& g = moe.gate;
    if (g.dtype == DType::kBF16) return;
    std::vector<float>& gf = gate_f32_[g.data];
    gf.resize(size_t(g.rows * g.cols));
    for (int64_t r = 0; r < g.rows; ++r) g.row_to_f32(r, &gf[size_t(r * g.cols)]);
    release_file_pages(g.data, g.bytes());
  };
  const int64_t nh = config_.num_attention_heads, dn = config_.qk_nope_head_dim;
  const int64_t dv = config_.v_head_dim, R = config_.kv_lora_rank;
  std::vector<float> row(static_cast<size_t>(R));
  for (const LayerWeights& L : weights_.layers) {
    const AttentionWeights& A = L.attn;
    AbsorbedWeights W;
    if (absorbed_fp8_ok(A.kv_b)) {
      pack_absorbed_fp8(A.kv_b, W);
    } else {
      // Per head, K-major for gemm_f32_kn: W_UK [dn, R] (kv_b_proj rows h * (dn + dv) + d, as
      // they are) and W_UV^T [R, dv] (rows h * (dn + dv) + dn + j, transposed), in F32.
      W.uk.resize(size_t(nh * dn * R));
      W.uv_t.resize(size_t(nh * R * dv));
      for (int64_t h = 0; h < nh; ++h) {
        for (int64_t d = 0; d < dn; ++d)
          A.kv_b.row_to_f32(h * (dn + dv) + d, &W.uk[size_t((h * dn + d) * R)]);
        for (int64_t j = 0; j < dv; ++j) {
          A.kv_b.row_to_f32(h * (dn + dv) + dn + j, row.data());
          for (int64_t r = 0; r < R; ++r) W.uv_t[size_t((h * R + r) * dv + j)] = row[size_t(r)];
        }
      }
    }
    release_file_pages(A.kv_b.data, A.kv_b.bytes());
    absorbed_.push_back(std::move(W));
    if (mode_ == AttentionMode::kMhaPrefill) pack(A.kv_b, dense);  // attend_mha_fast's expansion
    if (A.q_a) pack(*A.q_a, dense);
    for (const WeightView* w : {&A.q_b, &A.kv_a, &A.o}) pack(*w, dense);
    if (A.indexer) {  // DSA: the indexer's FP8 projections (weights_proj is BF16)
      pack(A.indexer->wq_b, dense);
      pack(A.indexer->wk, dense);
    }
    if (L.mlp) pack_mlp(*L.mlp, dense);
    if (L.moe) pack_moe(*L.moe);
  }

  // What is prepared, in order, for the weight cache: every projection, then the BF16 lm_head
  // (its compact rows, then its tiles; rows empty when the head is whole).
  const WeightView& head = weights_.lm_head;
  const bool bf16_head = head.dtype == DType::kBF16 && head.rows > 0;
  std::vector<int32_t> head_rows;
  PackedHead head_packed;
  std::vector<CachedWeight> items;
  std::vector<const WeightView*> sources;
  for (const PackJob& j : jobs) {
    CachedWeight c;
    if (j.format == WeightFormat::kInt8) c.int8 = &j.packed->int8;
    if (j.format == WeightFormat::kInt4) c.int4 = &j.packed->int4;
    if (j.format == WeightFormat::kFp8) c.fp8 = &j.packed->fp8;
    items.push_back(c);
    sources.push_back(j.source);
  }
  if (bf16_head) {
    items.push_back({nullptr, nullptr, nullptr, &head_rows});
    CachedWeight c;
    if (formats_.lm_head == HeadFormat::kBf16) c.bf16 = &head_packed.bf16;
    if (formats_.lm_head == HeadFormat::kInt8) c.int8 = &head_packed.int8;
    if (formats_.lm_head == HeadFormat::kInt4) c.int4 = &head_packed.int4;
    items.push_back(c);
    sources.push_back(&head);
  }
  // The head's tiles where forward() looks for them: the compact head's, or the whole one's.
  auto place_head = [&] {
    if (!bf16_head) return;
    if (!head_rows.empty()) {
      compact_head_.rows = std::move(head_rows);
      compact_head_.packed = std::move(head_packed);
    } else {
      head_ = std::move(head_packed);
    }
  };
  std::optional<uint64_t> key;
  std::string cache_file;
  if (!cache.dir.empty()) key = weight_cache_key(cache.model_key, formats_, sources, jobs);
  if (key) {
    cache_file = weight_cache_path(cache.dir, *key);
    const Status loaded = load_weight_cache(cache_file, *key, items, pool_);
    if (loaded.ok()) {
      place_head();
      if (progress) fmt::print(stderr, "prepared weights mapped from {}\n", cache_file);
      return;
    }
    if (loaded.code() != StatusCode::kNotFound) {
      fmt::print(stderr, "weight cache: {}; preparing the weights again\n", loaded.message());
    }
  }

  // The BF16 lm_head in the tiled layout (docs/kernels-gemm.md: no horizontal sums at M >= 8),
  // or requantized to INT8 or INT4 (formats_.lm_head: a half or 0.28 of the bytes per decoded
  // token).
  if (bf16_head) {
    // A head whose vocabulary is mostly unused (rows of +0.0: a model trained on a subset of
    // its tokenizer, as tiny-py) keeps only its other rows: those logits are the same bits
    // (each column's sums are its own) and the zero rows' are exactly 0.
    const auto* w = reinterpret_cast<const uint16_t*>(head.data);
    std::vector<int32_t> live;
    for (int64_t r = 0; r < head.rows; ++r) {
      const uint16_t* row = w + r * head.cols;
      if (std::any_of(row, row + head.cols, [](uint16_t v) { return v != 0; })) {
        live.push_back(int32_t(r));
      }
    }
    if (int64_t(live.size()) * 4 <= head.rows * 3) {
      std::vector<uint16_t> rows(live.size() * size_t(head.cols));
      for (size_t i = 0; i < live.size(); ++i) {
        std::copy_n(w + live[i] * head.cols, head.cols, &rows[i * size_t(head.cols)]);
      }
      head_rows = std::move(live);
      head_packed = pack_head(rows.data(), int64_t(head_rows.size()), head.cols);
    } else {
      head_packed = pack_head(w, head.rows, head.cols);
    }
    // (When the head is the tied embedding, the rows a prompt embeds fault back in.)
    release_file_pages(head.data, head.bytes());
  }
  pack_projections(jobs, progress);
  if (key) {
    // Written once, for later starts; this one keeps its own copy (mapping the file back now
    // would hold both while its checksums are read).
    const Status saved = save_weight_cache(cache_file, *key, items);
    if (!saved.ok()) fmt::print(stderr, "weight cache: {}\n", saved.message());
    if (saved.ok() && progress) fmt::print(stderr, "prepared weights written to {}\n", cache_file);
  }
  place_head();
}

DeepseekModel::PackedHead DeepseekModel::pack_head(const uint16_t* w, int64_t n, int64_t k) const {
  PackedHead p;
  switch (formats_.lm_head) {
    case HeadFormat::kBf16:
      p.bf16 = pack_bf16_weight(w, n, k, k, pool_);
      break;
    case HeadFormat::kInt8:
      p.int8 = pack_int8_weight_bf16(w, n, k, k, pool_);
      break;
    case HeadFormat::kInt4:
      p.int4 = pack_int4_weight_bf16(w, n, k, k, pool_);
      break;
  }
  return p;
}

void DeepseekModel::PackedHead::gemm(const uint16_t* x, int64_t m, int64_t ldx, float* y,
                                     int64_t ldy, ThreadPool* pool) const {
  if (int8.data) {
    gemm_int8(x, m, ldx, int8, {y, DType::kF32, ldy}, pool);
  } else if (int4.data) {
    gemm_int4(x, m, ldx, int4, {y, DType::kF32, ldy}, pool);
  } else {
    gemm_bf16_packed(x, m, ldx, bf16, y, ldy, pool);
  }
}

void DeepseekModel::pack_projections(std::span<const PackJob> jobs, bool progress) {
  auto run = [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const WeightView& w = *jobs[size_t(i)].source;
      *jobs[size_t(i)].packed =
          pack_linear(w.data, w.scale_inv, w.rows, w.cols, jobs[size_t(i)].format);
      release_file_pages(w.data, w.bytes());  // the copy is what runs
    }
  };
  auto run_all = [&](int64_t b, int64_t e) {
    pool_ ? pool_->parallel_for(e - b, [&](int64_t i, int64_t j) { run(b + i, b + j); })
          : run(b, e);
  };
  if (!progress) {
    run_all(0, int64_t(jobs.size()));
    return;
  }
  // With progress: rounds of ~1% of the bytes each, a line rewritten in place after each (after
  // every tenth only when stderr is a log file rather than a terminal).
  auto bytes = [&](size_t i) {
    return double(jobs[i].source->rows) * double(jobs[i].source->cols);
  };
  const bool terminal = isatty(STDERR_FILENO) != 0;
  int shown_tenths = -1;
  double total = 0, done = 0;
  for (size_t i = 0; i < jobs.size(); ++i) total += bytes(i);
  for (size_t b = 0; b < jobs.size();) {
    size_t e = b;
    double round = 0;
    while (e < jobs.size() && (e == b || round < total / 100)) round += bytes(e++);
    run_all(int64_t(b), int64_t(e));
    done += round;
    b = e;
    const int tenths = int(10 * done / total);
    if (!terminal && tenths == shown_tenths && b < jobs.size()) continue;
    shown_tenths = tenths;
    fmt::print(stderr, "\rpreparing weights: {:.0f}% ({:.1f} of {:.1f} GB)", 100 * done / total,
               done / 1e9, total / 1e9);
    std::fflush(stderr);
  }
  if (!jobs.empty()) fmt::print(stderr, "\n");
}

}  // namespace moeserve
