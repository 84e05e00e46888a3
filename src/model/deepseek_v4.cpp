#include "model/deepseek_v4.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <limits>
#include <map>
#include <numeric>
#include <vector>

#include <fmt/format.h>
#include <xxhash.h>

#include "cache/kv_cache.h"
#include "core/check.h"
#include "core/file_pages.h"
#include "core/thread_pool.h"
#include "ep/dispatcher.h"
#include "kernels/attend_f32.h"
#include "kernels/convert.h"
#include "kernels/gemm_bf16.h"
#include "kernels/gemm_fp4.h"
#include "kernels/gemm_fp8.h"
#include "kernels/gemm_int4.h"
#include "kernels/gemm_int8.h"
#include "kernels/index_fp4.h"
#include "kernels/index_score.h"
#include "kernels/kv_token.h"
#include "kernels/linear_ref.h"
#include "model/checkpoint.h"
#include "model/deepseek_v4_weights.h"
#include "model/dsa_indexer.h"
#include "model/expert_store.h"
#include "model/weight_cache.h"

namespace moeserve {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// ---- Small pieces ---------------------------------------------------------------------------

// x <- w * x / rms(x) (w null: unweighted).
void rms_norm(float* x, int64_t n, const float* w, float eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
  const float inv = float(1.0 / std::sqrt(ss / double(n) + eps));
  for (int64_t i = 0; i < n; ++i) x[i] = w ? w[i] * (x[i] * inv) : x[i] * inv;
}

float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}

float softplus(float x) {  // torch's: x above 20 is its own softplus
  return x > 20.0f ? x : std::log1p(std::exp(x));
}

float silu(float x) {
  return x / (1.0f + std::exp(-x));
}

// RoPE tables of one kind of layer: inv_freq per rotary pair (docs/deepseek-v4.md "RoPE").
// Sliding-window layers: rope_theta, plain. Layers with a compressor: compress_rope_theta with
// YaRN's frequency ramp (no magnitude correction: V4's softmax scale is head_dim^-1/2).
std::vector<float> v4_inv_freq(const ModelConfig& c, bool compressed) {
  const int64_t rd = c.qk_rope_head_dim;
  const double base = compressed ? c.v4->compress_rope_theta : c.rope_theta;
  std::vector<float> inv(static_cast<size_t>(rd / 2));
  for (int64_t i = 0; i < rd / 2; ++i) {
    inv[size_t(i)] = float(1.0 / std::pow(base, double(2 * i) / double(rd)));
  }
  if (!compressed || !c.rope_scaling) return inv;
  const YarnScaling& y = *c.rope_scaling;
  auto dim_of = [&](double rotations) {
    return double(rd) *
           std::log(double(y.original_max_position_embeddings) / (rotations * 2 * M_PI)) /
           (2 * std::log(base));
  };
  const double low = std::max(std::floor(dim_of(y.beta_fast)), 0.0);
  double high = std::min(std::ceil(dim_of(y.beta_slow)), double(rd - 1));
  if (low == high) high += 0.001;
  for (int64_t i = 0; i < rd / 2; ++i) {
    const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
    const double f = inv[size_t(i)];
    inv[size_t(i)] = float(f / y.factor * ramp + f * (1 - ramp));
  }
  return inv;
}

// Rotates the last 2 * inv.size() values of v (interleaved pairs) by position pos; inverse
// rotates back (attention's output, whose values carry their keys' rotation).
void rope_tail(float* v, int64_t dim, const std::vector<float>& inv, int64_t pos,
               bool inverse = false) {
  const int64_t rd = int64_t(inv.size()) * 2;
  float* r = v + dim - rd;
  for (size_t i = 0; i < inv.size(); ++i) {
    const float angle = float(pos) * inv[i];
    const float c = std::cos(angle), s = inverse ? -std::sin(angle) : std::sin(angle);
    const float a = r[2 * i], b = r[2 * i + 1];
    r[2 * i] = a * c - b * s;
    r[2 * i + 1] = a * s + b * c;
  }
}

// A running per-channel softmax pool: m (max gate), s (sum of exp(gate - m)), acc (sum of
// exp(gate - m) * value). The compressor pools a group's values this way a token at a time, so
// that its state between tokens is 3 * d floats whatever the group's length.
struct Pool {
  float* m;
  float* s;
  float* acc;
  int64_t d;

  Pool(float* base, int64_t dim) : m(base), s(base + dim), acc(base + 2 * dim), d(dim) {}
  void clear() {
    std::fill(m, m + d, kNegInf);
    std::fill(s, s + d, 0.0f);
    std::fill(acc, acc + d, 0.0f);
  }
  void add(const float* value, const float* gate) {
    for (int64_t i = 0; i < d; ++i) {
      if (gate[i] > m[i]) {
        const float r = m[i] == kNegInf ? 0.0f : std::exp(m[i] - gate[i]);
        s[i] = s[i] * r + 1.0f;
        acc[i] = acc[i] * r + value[i];
        m[i] = gate[i];
      } else {
        const float e = std::exp(gate[i] - m[i]);
        s[i] += e;
        acc[i] += e * value[i];
      }
    }
  }
  void result(float* out) const {
    for (int64_t i = 0; i < d; ++i) out[i] = acc[i] / s[i];
  }
  void copy_from(const Pool& o) {
    std::copy(o.m, o.m + 3 * d, m);  // m, s and acc are contiguous
  }
};

// The compressor state record of one layer (a kState entry): the main compressor's pools for the
// group being filled (cur) and, for overlapping ratio-4 entries, the next group's first half
// (next); then the indexer compressor's two. Floats; then, as an int64, where in its block the
// position the record holds the state after lies (kStateTail bytes): the block's last position
// once the block is whole, so a copy of a whole block is a whole block's record wherever it goes.
constexpr int64_t kStateTail = 8;
int64_t state_floats(const ModelConfig& c, int64_t ratio) {
  if (ratio == 0) return 0;
  const int64_t dh = c.v4->head_dim;
  if (ratio != 4) return 3 * dh;
  return 2 * 3 * dh + 2 * 3 * c.indexer->head_dim;
}

// ---- The model --------------------------------------------------------------------------------

// The fast path's packed copies of the checkpoint's matrices (docs/deepseek-v4.md "Fast path"):
// FP8 projections in gemm_fp8's tiles, FP4 experts in gemm_fp4's (their own 4.25 bits), BF16
// matrices in gemm_bf16's, each found by the view it was packed from (its bytes and rows, so a
// group's row slice of wo_a is its own entry); or, with the requantizing options
// (docs/quantization.md), FP8 projections (--projection-dtype), FP4 experts (--expert-dtype) and
// the head (--lm-head-dtype) in gemm_int8's or gemm_int4's formats instead. Activations are
// rounded to BF16 on the way in.
class PackedViews {
 public:
  // formats: the requantizing options; head: the lm_head's bytes (the BF16 matrix
  // --lm-head-dtype takes).
  PackedViews(const WeightFormats& formats, const uint8_t* head) : formats_(formats), head_(head) {}

  // Packs every FP8, FP4 and BF16 view of `views`, and takes every view of `f32_views` for F32
  // products (F32 inputs, nothing rounded: BF16 ones in place through gemm_f32_bf16w, others
  // widened to an F32 copy for gemm_f32); others are left to linear_ref. With a
  // cache directory the packed matrices are mapped from its file when it holds them (written at
  // the first start, docs/memory.md); the F32 copies are made at every start (a pass over a few
  // BF16 matrices). The checkpoint's pages of what was packed are released.
  void prepare(const std::vector<WeightView>& views, const std::vector<WeightView>& f32_views,
               ThreadPool* pool, const WeightCacheOptions& cache) {
    std::vector<std::pair<const WeightView*, Packed*>> todo;
    for (const WeightView& v : views) {
      if (v.dtype != DType::kF8E4M3 && v.dtype != DType::kF4E2M1 && v.dtype != DType::kBF16) {
        continue;
      }
      if (v.dtype == DType::kF8E4M3 && (v.block_rows != 128 || v.block_cols != 128)) continue;
      auto [it, fresh] = packed_.try_emplace(Key{v.data, v.rows});
      if (!fresh) continue;
      it->second.dtype = v.dtype;
      todo.push_back({&v, &it->second});
    }
    const size_t n_packed = todo.size();
    for (const WeightView& v : f32_views) {
      auto [it, fresh] = packed_.try_emplace(Key{v.data, v.rows});
      if (!fresh) continue;
      it->second.dtype = DType::kF32;
      todo.push_back({&v, &it->second});
    }
    std::vector<CachedWeight> items(n_packed);
    for (size_t i = 0; i < n_packed; ++i) {
      Packed& p = *todo[i].second;
      p.target = target(*todo[i].first);
      if (p.target == WeightFormat::kInt8) {
        items[i].int8 = &p.int8;
      } else if (p.target == WeightFormat::kInt4) {
        items[i].int4 = &p.int4;
      } else if (p.dtype == DType::kF8E4M3) {
        items[i].fp8 = &p.fp8;
      } else if (p.dtype == DType::kF4E2M1) {
        items[i].fp4 = &p.fp4;
      } else if (p.dtype == DType::kBF16) {
        items[i].bf16 = &p.bf16;
      }
    }
    std::optional<uint64_t> key;
    if (!cache.dir.empty()) key = cache_key(cache.model_key, todo, n_packed);
    std::string file;
    size_t from = 0;  // todo entries still to prepare
    if (key) {
      file = weight_cache_path(cache.dir, *key);
      const Status loaded = load_weight_cache(file, *key, items, pool);
      if (loaded.ok()) from = n_packed;
      if (!loaded.ok() && loaded.code() != StatusCode::kNotFound) {
        fmt::print(stderr, "weight cache: {}; preparing the weights again\n", loaded.message());
      }
    }
    auto run = [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const WeightView& v = *todo[size_t(i)].first;
        Packed& p = *todo[size_t(i)].second;
        if (p.dtype == DType::kF32 && v.dtype == DType::kBF16) {
          p.bf16_rows = reinterpret_cast<const uint16_t*>(v.data);  // read in place
        } else if (p.dtype == DType::kF32 && v.dtype == DType::kF32) {
          p.f32_rows = reinterpret_cast<const float*>(v.data);  // read in place
        } else if (p.dtype == DType::kF32) {
          p.f32.resize(size_t(v.rows * v.cols));
          for (int64_t r = 0; r < v.rows; ++r) v.row_to_f32(r, &p.f32[size_t(r * v.cols)]);
        } else if (p.target != WeightFormat::kFp8) {
          requantize(v, p);
        } else if (v.dtype == DType::kF8E4M3) {
          p.fp8 = pack_fp8_weight(v.data, v.scale_inv, v.rows, v.cols);
        } else if (v.dtype == DType::kBF16) {
          p.bf16 =
              pack_bf16_weight(reinterpret_cast<const uint16_t*>(v.data), v.rows, v.cols, v.cols);
        } else {
          Result<PackedFp4Weight> w = pack_fp4_weight(v, "an FP4 expert");
          // The binder refused UE8M0's NaN: every scale is a power of two.
          CHECK(w.ok(), "packing an FP4 expert");
          p.fp4 = std::move(*w);
        }
        if (p.dtype != DType::kF32) release_file_pages(v.data, v.bytes());
      }
    };
    const int64_t b = int64_t(from), e = int64_t(todo.size());
    pool ? pool->parallel_for(e - b, [&](int64_t i0, int64_t i1) { run(b + i0, b + i1); })
         : run(b, e);
    if (key && from == 0) {
      const Status saved = save_weight_cache(file, *key, items);
      if (!saved.ok()) fmt::print(stderr, "weight cache: {}\n", saved.message());
    }
    if (from == n_packed) {
      for (size_t i = 0; i < n_packed; ++i) {
        release_file_pages(todo[i].first->data, todo[i].first->bytes());
      }
    }
  }

  // Packs one FP4 or FP8 matrix more (an expert installed at run time, docs/eplb.md "Online
  // rebalancing"); the error names what gemm_fp4's packing refused.
  Status add(const WeightView& v) {
    Packed p;
    p.dtype = v.dtype;
    p.target = target(v);
    if (v.dtype == DType::kF4E2M1) {
      // Checked by gemm_fp4's packing (UE8M0's powers of two) whatever the format it runs in.
      ASSIGN_OR_RETURN(p.fp4, pack_fp4_weight(v, "a received FP4 expert"));
      if (p.target != WeightFormat::kFp8) {
        p.fp4 = {};
        requantize(v, p);
      }
    } else if (v.dtype == DType::kF8E4M3 && v.block_rows == 128 && v.block_cols == 128) {
      if (p.target != WeightFormat::kFp8) {
        requantize(v, p);
      } else {
        p.fp8 = pack_fp8_weight(v.data, v.scale_inv, v.rows, v.cols);
      }
    } else {
      return Status::Ok();  // (linear_ref's, as at load)
    }
    packed_[Key{v.data, v.rows}] = std::move(p);
    return Status::Ok();
  }
  void erase(const WeightView& v) { packed_.erase(Key{v.data, v.rows}); }

  // y [m, w.rows] (row stride ldy) = x [m, w.cols] (row stride ldx) times w^T through the packed
  // copy; false when w has none.
  bool linear(const float* x, int64_t m, int64_t ldx, const WeightView& w, float* y, int64_t ldy,
              ThreadPool* pool) const {
    auto it = packed_.find(Key{w.data, w.rows});
    if (it == packed_.end()) return false;
    const Packed& p = it->second;
    if (p.dtype == DType::kF32 && p.bf16_rows) {
      gemm_f32_bf16w(x, m, ldx, p.bf16_rows, w.rows, w.cols, w.cols, y, ldy, pool);
      return true;
    }
    if (p.dtype == DType::kF32) {
      gemm_f32(x, m, ldx, p.f32_rows ? p.f32_rows : p.f32.data(), w.rows, w.cols, w.cols, y, ldy,
               pool);
      return true;
    }
    thread_local std::vector<uint16_t> xb;
    xb.resize(size_t(m * w.cols));
    for (int64_t i = 0; i < m; ++i)
      f32_to_bf16_row_isa(x + i * ldx, w.cols, &xb[size_t(i * w.cols)]);
    const GemmOutput out{y, DType::kF32, ldy};
    if (p.target == WeightFormat::kInt8) {
      gemm_int8(xb.data(), m, w.cols, p.int8, out, pool);
    } else if (p.target == WeightFormat::kInt4) {
      gemm_int4(xb.data(), m, w.cols, p.int4, out, pool);
    } else if (p.dtype == DType::kF8E4M3) {
      gemm_fp8(xb.data(), m, w.cols, p.fp8, out, pool);
    } else if (p.dtype == DType::kF4E2M1) {
      gemm_fp4(xb.data(), m, w.cols, p.fp4, out, pool);
    } else {
      gemm_bf16_packed(xb.data(), m, w.cols, p.bf16, y, ldy, pool);
    }
    return true;
  }

 private:
  using Key = std::pair<const uint8_t*, int64_t>;
  struct Packed;

  // The format v runs in: kFp8 for its own (FP8, FP4 or BF16, packed as it is), else kInt8 or
  // kInt4, requantized. The routed experts take --expert-dtype only (they are 4.25 bits as
  // published: --projection-dtype alone does not double them); v4_supports refuses fp8 for them.
  WeightFormat target(const WeightView& v) const {
    if (v.data == head_) {
      switch (formats_.lm_head) {
        case HeadFormat::kBf16:
          return WeightFormat::kFp8;
        case HeadFormat::kInt8:
          return WeightFormat::kInt8;
        case HeadFormat::kInt4:
          return WeightFormat::kInt4;
      }
    }
    if (v.dtype == DType::kF4E2M1) return formats_.experts.value_or(WeightFormat::kFp8);
    if (v.dtype == DType::kF8E4M3) return formats_.projections;
    return WeightFormat::kFp8;
  }

  // p.int8 or p.int4 (p.target) from v: FP8 through pack_linear (per 1x128 from the 128x128
  // blocks), BF16 and FP4 from their BF16 rows (FP4 times its UE8M0 scale is exact in BF16).
  static void requantize(const WeightView& v, Packed& p) {
    if (v.dtype == DType::kF8E4M3) {
      PackedLinear l = pack_linear(v.data, v.scale_inv, v.rows, v.cols, p.target);
      p.int8 = std::move(l.int8);
      p.int4 = std::move(l.int4);
      return;
    }
    const uint16_t* rows = reinterpret_cast<const uint16_t*>(v.data);
    std::vector<uint16_t> widened;
    if (v.dtype != DType::kBF16) {
      widened.resize(size_t(v.rows * v.cols));
      std::vector<float> row(size_t(v.cols));
      for (int64_t r = 0; r < v.rows; ++r) {
        v.row_to_f32(r, row.data());
        f32_to_bf16_row_isa(row.data(), v.cols, &widened[size_t(r * v.cols)]);
      }
      rows = widened.data();
    }
    if (p.target == WeightFormat::kInt8) {
      p.int8 = pack_int8_weight_bf16(rows, v.rows, v.cols, v.cols, nullptr);
    } else {
      p.int4 = pack_int4_weight_bf16(rows, v.rows, v.cols, v.cols, nullptr);
    }
  }

  // The cache key of the packed matrices (the first n of todo): the model, the layout version
  // and where each lies in the checkpoint; null when one is not in a mapped file.
  static std::optional<uint64_t> cache_key(
      uint64_t model_key, const std::vector<std::pair<const WeightView*, Packed*>>& todo,
      size_t n) {
    XXH3_state_t* st = XXH3_createState();
    XXH3_64bits_reset(st);
    auto add = [&](const auto& v) { XXH3_64bits_update(st, &v, sizeof v); };
    const uint64_t version = 2;  // of V4's packed set (gemm_fp4's tile layout: 1; formats: 2)
    add(version);
    add(model_key);
    const char family[] = "deepseek_v4";
    XXH3_64bits_update(st, family, sizeof family);
    bool ok = true;
    for (size_t i = 0; i < n && ok; ++i) {
      ok = add_weight_place(st, *todo[i].first);
      add(todo[i].first->dtype);
      add(todo[i].second->target);
    }
    const uint64_t key = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    if (!ok) return std::nullopt;
    return key;
  }

  struct Packed {
    DType dtype = DType::kF32;                 // the checkpoint's
    WeightFormat target = WeightFormat::kFp8;  // kFp8: packed as it is (target())
    PackedInt8Weight int8;
    PackedInt4Weight int4;
    PackedFp8Weight fp8;
    PackedFp4Weight fp4;
    PackedBf16Weight bf16;
    // F32 products (dtype kF32): an F32 or BF16 matrix's own rows, read in place (BF16 through
    // gemm_f32_bf16w: an F32 copy's bits at half its bytes), else an F32 copy.
    std::vector<float> f32;
    const float* f32_rows = nullptr;
    const uint16_t* bf16_rows = nullptr;
  };
  WeightFormats formats_;
  const uint8_t* head_;
  std::map<Key, Packed> packed_;
};

class DeepseekV4 final : public CausalLm {
 public:
  DeepseekV4(const ModelConfig& c, const ModelWeights& weights, ThreadPool* pool, bool fast,
             const WeightCacheOptions& cache, Dispatcher* dispatcher, const WeightFormats& formats)
      : c_(c),
        v_(*c.v4),
        w_(*weights.v4),
        pool_(pool),
        fast_(fast),
        dispatcher_(dispatcher && dispatcher->world_size() > 1 ? dispatcher : nullptr),
        packed_(formats, weights.v4->head.data),
        experts_(c, weights, nullptr),
        inv_main_(v4_inv_freq(c, false)),
        inv_compressed_(v4_inv_freq(c, true)) {
    if (fast_) {
      packed_.prepare(fast_views(), f32_views(), pool_, cache);
      experts_.set_packer(ExpertPacker{[this](const MlpWeights& m) -> Status {
                                         for (const WeightView* v : {&m.gate, &m.up, &m.down})
                                           RETURN_IF_ERROR(packed_.add(*v));
                                         return Status::Ok();
                                       },
                                       [this](const MlpWeights& m) {
                                         for (const WeightView* v : {&m.gate, &m.up, &m.down})
                                           packed_.erase(*v);
                                       }});
    }
  }

  const ModelConfig& config() const override { return c_; }
  bool has_mtp() const override { return w_.mtp.has_value(); }
  Status forward_mtp(std::span<const StepSequence> batch, const float* hidden, KvCache& cache,
                     StepOutput* out) override {
    CHECK(has_mtp(), "forward_mtp without the MTP module");
    out->logits.clear();
    out->hidden.clear();
    std::vector<Seq> qs;
    std::vector<std::vector<float>> hs;
    for (const StepSequence& s : batch) {
      qs.push_back({s, cache});
      hs.emplace_back();
      RETURN_IF_ERROR(mtp_streams(s, hidden, &hs.back()));
      hidden += int64_t(s.tokens.size()) * hidden_width();
    }
    RETURN_IF_ERROR(block(c_.num_hidden_layers, qs, hs));
    const V4MtpWeights& m = *w_.mtp;
    head_rows(qs, hs, m.hc_head, m.norm, out);
    return Status::Ok();
  }
  int64_t hidden_width() const override { return v_.hc_mult * c_.hidden_size; }
  int64_t num_layers() const override { return c_.num_hidden_layers + (has_mtp() ? 1 : 0); }
  // (An EP group's ranks run every layer's MoE together: dispatch and combine, docs/deepseek-v4.md
  // "Expert parallelism".)
  bool collective() const override { return dispatcher_ != nullptr; }
  ExpertStore& experts() override { return experts_; }
  void set_tracer(Tracer*) override {}
  void set_choice_observer(V4ChoiceObserver o) { observer_ = std::move(o); }
  void set_overlap_min_tokens(int64_t) override {}

  Status forward(std::span<const StepSequence> batch, KvCache& cache, StepOutput* out) override {
    out->logits.clear();
    out->hidden.clear();
    // Layer by layer over the whole batch: attention per sequence, the MoE over every row of
    // the step at once (one pass over each expert's weights; under EP one dispatch per layer).
    std::vector<Seq> qs;
    std::vector<std::vector<float>> hs;
    for (const StepSequence& s : batch) {
      qs.push_back({s, cache});
      hs.emplace_back();
      RETURN_IF_ERROR(resume_compressors(qs.back()));
      RETURN_IF_ERROR(embed_streams(s, &hs.back()));
    }
    for (int64_t l = 0; l < c_.num_hidden_layers; ++l) RETURN_IF_ERROR(block(l, qs, hs));
    head_rows(qs, hs, w_.hc_head, w_.norm, out);
    return Status::Ok();
  }

 private:
  struct Seq {
    const StepSequence& s;
    KvCache& kv;
    int64_t n() const { return int64_t(s.tokens.size()); }
    int64_t pos(int64_t i) const { return s.start_pos + i; }
  };
  // A step's rows, sequence after sequence: each row's sequence, its index there, its token.
  struct Rows {
    explicit Rows(const std::vector<Seq>& qs) {
      for (size_t i = 0; i < qs.size(); ++i) {
        starts.push_back(int64_t(seq.size()));
        for (int64_t r = 0; r < qs[i].n(); ++r) {
          seq.push_back(int32_t(i));
          local.push_back(r);
          tokens.push_back(qs[i].s.tokens[size_t(r)]);
        }
      }
    }
    int64_t n() const { return int64_t(seq.size()); }
    int64_t first(size_t i) const { return starts[i]; }
    std::vector<int32_t> seq;
    std::vector<int64_t> local, starts;
    std::vector<int32_t> tokens;
  };

  void linear(const float* x, int64_t m, const WeightView& w, float* y) const {
    linear(x, m, w.cols, w, y, w.rows);
  }
  void linear(const float* x, int64_t m, int64_t ldx, const WeightView& w, float* y,
              int64_t ldy) const {
    if (fast_ && packed_.linear(x, m, ldx, w, y, ldy, pool_)) return;
    linear_ref(x, m, ldx, w, y, ldy, pool_);
  }

  // The grouped output projection's slices of wo_a: group g's o_lora_rank rows.
  WeightView wo_a_group(const V4LayerWeights& L, int64_t g) const {
    return L.wo_a.row_slice(g * v_.o_lora_rank, v_.o_lora_rank);
  }
  bool wo_a_sliceable() const { return v_.o_lora_rank % 128 == 0; }

  // The matrices whose products model.py takes in F32 (the router, the compressors, the indexer's
  // head weights, mHC's mixes), read in place: BF16 ones by gemm_f32_bf16w, F32 ones by
  // gemm_f32 (docs/deepseek-v4.md "Fast path").
  std::vector<WeightView> f32_views() const {
    std::vector<WeightView> v;
    for (const V4LayerWeights& L : w_.layers) {
      v.insert(v.end(), {L.gate, L.hc_attn.fn, L.hc_ffn.fn});
      for (const V4CompressorWeights* cw : {L.compressor ? &*L.compressor : nullptr,
                                            L.indexer ? &L.indexer->compressor : nullptr}) {
        if (cw) v.insert(v.end(), {cw->wkv, cw->wgate});
      }
      if (L.indexer) v.push_back(L.indexer->weights_proj);
    }
    return v;
  }

  // Every matrix the fast path packs: the FP8 projections, the FP4 experts and the BF16 head.
  std::vector<WeightView> fast_views() const {
    std::vector<WeightView> v = {w_.head};
    if (w_.mtp) v.insert(v.end(), {w_.mtp->e_proj, w_.mtp->h_proj});
    for (const V4LayerWeights& L : w_.layers) {
      for (const WeightView* w : {&L.wq_a, &L.wq_b, &L.wkv, &L.wo_b}) v.push_back(*w);
      if (wo_a_sliceable()) {
        for (int64_t g = 0; g < v_.o_groups; ++g) v.push_back(wo_a_group(L, g));
      }
      if (L.indexer) v.push_back(L.indexer->wq_b);
      v.insert(v.end(), {L.shared.gate, L.shared.up, L.shared.down});
      for (const auto& e : L.experts) {
        if (e) v.insert(v.end(), {e->gate, e->up, e->down});
      }
    }
    return v;
  }

  // The residual as hc streams [n, hc, D], each the token's embedding.
  Status embed_streams(const StepSequence& s, std::vector<float>* h) const {
    const int64_t n = int64_t(s.tokens.size()), D = c_.hidden_size, hc = v_.hc_mult;
    std::vector<float> e(static_cast<size_t>(n * D));
    RETURN_IF_ERROR(embed(s, e.data()));
    h->resize(size_t(n * hc * D));
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < hc; ++j) {
        std::copy(e.begin() + i * D, e.begin() + (i + 1) * D, h->begin() + (i * hc + j) * D);
      }
    }
    return Status::Ok();
  }

  Status embed(const StepSequence& s, float* e) const {
    const int64_t D = c_.hidden_size;
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      const int32_t id = s.tokens[i];
      if (id < 0 || id >= c_.vocab_size) {
        return InvalidArgument(fmt::format("token id {} outside the vocabulary", id));
      }
      w_.embed.row_to_f32(id, e + int64_t(i) * D);
    }
    return Status::Ok();
  }

  // The rows asked for, in batch order: the streams as hidden rows (what the MTP module takes),
  // and the logits of each sequence's last n_logits through the collapse of the streams, the
  // norm and the head (one GEMM for the batch: the head is read once a step).
  void head_rows(const std::vector<Seq>& qs, const std::vector<std::vector<float>>& hs,
                 const V4HcWeights& hc_head, const std::vector<float>& norm,
                 StepOutput* out) const {
    const int64_t D = c_.hidden_size, W = hidden_width();
    std::vector<float> y;
    for (size_t i = 0; i < qs.size(); ++i) {
      const StepSequence& s = qs[i].s;
      const std::vector<float>& h = hs[i];
      const int64_t n = int64_t(s.tokens.size());
      if (n == 0) continue;
      const int64_t rows = std::min(n, s.hidden_rows());
      out->hidden.insert(out->hidden.end(), h.begin() + (n - rows) * W, h.end());
      const int64_t nl = std::min(rows, s.n_logits);
      for (int64_t r = 0; r < nl; ++r) {
        y.resize(y.size() + size_t(D));
        float* yr = &y[y.size() - size_t(D)];
        hc_collapse(hc_head, &h[size_t((n - nl + r) * W)], yr);
        rms_norm(yr, D, norm.data(), float(c_.rms_norm_eps));
      }
    }
    const int64_t nl = int64_t(y.size()) / D;
    out->logits.resize(size_t(nl * c_.vocab_size));
    if (nl > 0) linear(y.data(), nl, w_.head, out->logits.data());
  }

  // model.py's MTPBlock: the row at position p carries token t_{p+1} and the main model's
  // streams at p (or the module's own output streams at p - 1 when chaining); each stream is
  // hnorm'd and projected by h_proj, the token's enorm'd embedding projected by e_proj is added to
  // every stream (here, for one sequence), then the module's block (its layer: a sliding window
  // only) and its own collapse and norm before the shared head (forward_mtp).
  Status mtp_streams(const StepSequence& s, const float* hidden, std::vector<float>* out) const {
    const int64_t n = int64_t(s.tokens.size()), D = c_.hidden_size, hc = v_.hc_mult;
    const V4MtpWeights& m = *w_.mtp;
    std::vector<float> e(static_cast<size_t>(n * D)), ep(static_cast<size_t>(n * D));
    RETURN_IF_ERROR(embed(s, e.data()));
    for (int64_t i = 0; i < n; ++i) rms_norm(&e[size_t(i * D)], D, m.enorm.data(), eps());
    linear(e.data(), n, m.e_proj, ep.data());
    std::vector<float> h(hidden, hidden + n * hc * D), hp(static_cast<size_t>(n * hc * D));
    for (int64_t r = 0; r < n * hc; ++r) rms_norm(&h[size_t(r * D)], D, m.hnorm.data(), eps());
    linear(h.data(), n * hc, m.h_proj, hp.data());
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < hc; ++j) {
        for (int64_t d = 0; d < D; ++d) {
          h[size_t((i * hc + j) * D + d)] =
              ep[size_t(i * D + d)] + hp[size_t((i * hc + j) * D + d)];
        }
      }
    }
    *out = std::move(h);
    return Status::Ok();
  }

  // ---- mHC --------------------------------------------------------------------------------

  // Streams [n, hc, D] -> x [n, D] (the weighted sum of the streams), post [n, hc] and the
  // doubly stochastic comb [n, hc, hc].
  void hc_pre(const V4HcWeights& w, const float* h, int64_t n, float* x, float* post,
              float* comb) const {
    const int64_t hc = v_.hc_mult, D = c_.hidden_size, nm = (2 + hc) * hc;
    std::vector<float> mixes(static_cast<size_t>(n * nm));
    linear(h, n, w.fn, mixes.data());
    const float eps = float(v_.hc_eps);
    for (int64_t i = 0; i < n; ++i) {
      const float* hi = h + i * hc * D;
      double ss = 0;
      for (int64_t k = 0; k < hc * D; ++k) ss += double(hi[k]) * hi[k];
      const float inv = float(1.0 / std::sqrt(ss / double(hc * D) + c_.rms_norm_eps));
      float* mx = &mixes[size_t(i * nm)];
      for (int64_t k = 0; k < nm; ++k) mx[k] *= inv;
      float pre[16];  // hc_mult <= 16 (checked with the config)
      for (int64_t j = 0; j < hc; ++j) {
        pre[j] = sigmoid(mx[j] * w.scale[0] + w.base[size_t(j)]) + eps;
        post[i * hc + j] = 2.0f * sigmoid(mx[hc + j] * w.scale[1] + w.base[size_t(hc + j)]);
      }
      float* C = comb + i * hc * hc;  // C[j][k]: stream j's share in new stream k
      for (int64_t j = 0; j < hc; ++j) {
        float mmax = kNegInf;
        for (int64_t k = 0; k < hc; ++k) {
          const int64_t at = 2 * hc + j * hc + k;
          C[j * hc + k] = mx[at] * w.scale[2] + w.base[size_t(at)];
          mmax = std::max(mmax, C[j * hc + k]);
        }
        float sum = 0;
        for (int64_t k = 0; k < hc; ++k) sum += (C[j * hc + k] = std::exp(C[j * hc + k] - mmax));
        for (int64_t k = 0; k < hc; ++k) C[j * hc + k] = C[j * hc + k] / sum + eps;
      }
      auto normalize_columns = [&] {
        for (int64_t k = 0; k < hc; ++k) {
          float sum = 0;
          for (int64_t j = 0; j < hc; ++j) sum += C[j * hc + k];
          for (int64_t j = 0; j < hc; ++j) C[j * hc + k] /= sum + eps;
        }
      };
      normalize_columns();
      for (int64_t it = 1; it < v_.hc_sinkhorn_iters; ++it) {
        for (int64_t j = 0; j < hc; ++j) {
          float sum = 0;
          for (int64_t k = 0; k < hc; ++k) sum += C[j * hc + k];
          for (int64_t k = 0; k < hc; ++k) C[j * hc + k] /= sum + eps;
        }
        normalize_columns();
      }
      float* xi = x + i * D;
      std::fill(xi, xi + D, 0.0f);
      for (int64_t j = 0; j < hc; ++j) {
        for (int64_t d = 0; d < D; ++d) xi[d] += pre[j] * hi[j * D + d];
      }
    }
  }

  // h[k] <- post[k] * f + sum_j comb[j][k] * h[j], per token.
  void hc_post(const float* f, const float* post, const float* comb, int64_t n, float* h) const {
    const int64_t hc = v_.hc_mult, D = c_.hidden_size;
    std::vector<float> old(static_cast<size_t>(hc * D));
    for (int64_t i = 0; i < n; ++i) {
      float* hi = h + i * hc * D;
      std::copy(hi, hi + hc * D, old.begin());
      const float* C = comb + i * hc * hc;
      for (int64_t k = 0; k < hc; ++k) {
        for (int64_t d = 0; d < D; ++d) {
          float acc = post[i * hc + k] * f[i * D + d];
          for (int64_t j = 0; j < hc; ++j) acc += C[j * hc + k] * old[size_t(j * D + d)];
          hi[k * D + d] = acc;
        }
      }
    }
  }

  // The final collapse of one token's streams into y [D].
  void hc_collapse(const V4HcWeights& w, const float* h, float* y) const {
    const int64_t hc = v_.hc_mult, D = c_.hidden_size;
    std::vector<float> mixes(static_cast<size_t>(hc));
    linear_ref(h, 1, hc * D, w.fn, mixes.data(), hc, nullptr);
    double ss = 0;
    for (int64_t k = 0; k < hc * D; ++k) ss += double(h[k]) * h[k];
    const float inv = float(1.0 / std::sqrt(ss / double(hc * D) + c_.rms_norm_eps));
    std::fill(y, y + D, 0.0f);
    for (int64_t j = 0; j < hc; ++j) {
      const float pre =
          sigmoid(mixes[size_t(j)] * inv * w.scale[0] + w.base[size_t(j)]) + float(v_.hc_eps);
      for (int64_t d = 0; d < D; ++d) y[d] += pre * h[j * D + d];
    }
  }

  // ---- A block ------------------------------------------------------------------------------

  // Layer l over the batch: attention (its projections over every row of the step, each
  // sequence's queries over its own KV), then the MoE over all the rows.
  Status block(int64_t l, std::vector<Seq>& qs, std::vector<std::vector<float>>& hs) {
    const V4LayerWeights& L = w_.layers[size_t(l)];
    const int64_t D = c_.hidden_size, hc = v_.hc_mult;
    const Rows rows(qs);
    const int64_t n = rows.n();
    std::vector<float> x(static_cast<size_t>(n * D)), f(static_cast<size_t>(n * D)),
        post(static_cast<size_t>(n * hc)), comb(static_cast<size_t>(n * hc * hc));
    // (Each sequence's rows: r0 on, n of them.)
    auto each = [&](auto&& fn) {
      for (size_t i = 0; i < qs.size(); ++i) {
        if (qs[i].n() > 0) fn(i, rows.first(i), qs[i].n());
      }
    };
    each([&](size_t i, int64_t r0, int64_t m) {
      hc_pre(L.hc_attn, hs[i].data(), m, &x[size_t(r0 * D)], &post[size_t(r0 * hc)],
             &comb[size_t(r0 * hc * hc)]);
      for (int64_t r = r0; r < r0 + m; ++r)
        rms_norm(&x[size_t(r * D)], D, L.attn_norm.data(), eps());
    });
    attention(l, qs, rows, x.data(), f.data());
    each([&](size_t i, int64_t r0, int64_t m) {
      float* xi = &x[size_t(r0 * D)];
      float* pi = &post[size_t(r0 * hc)];
      float* ci = &comb[size_t(r0 * hc * hc)];
      hc_post(&f[size_t(r0 * D)], pi, ci, m, hs[i].data());
      hc_pre(L.hc_ffn, hs[i].data(), m, xi, pi, ci);
      for (int64_t r = 0; r < m; ++r) rms_norm(xi + r * D, D, L.ffn_norm.data(), eps());
    });
    RETURN_IF_ERROR(moe(l, rows.tokens, rows.local, x.data(), f.data()));
    each([&](size_t i, int64_t r0, int64_t m) {
      hc_post(&f[size_t(r0 * D)], &post[size_t(r0 * hc)], &comb[size_t(r0 * hc * hc)], m,
              hs[i].data());
    });
    return Status::Ok();
  }

  float eps() const { return float(c_.rms_norm_eps); }

  // ---- The KV cache's parts -----------------------------------------------------------------

  struct Parts {
    size_t latent = 0;
    int64_t compressed = -1, index_key = -1, state = -1;
  };
  Parts parts(const KvCache& kv, int64_t l) const {
    Parts p;
    p.compressed = kv.layout().find_part(l, KvPartKind::kCompressed);
    p.index_key = kv.layout().find_part(l, KvPartKind::kIndexKey);
    p.state = kv.layout().find_part(l, KvPartKind::kState);
    return p;
  }
  // Whether layer l keeps its indexer's keys in FP4 (DeepSeek's rounding, the formats of a
  // BF16 cache) rather than F32 (transformers' arithmetic, an F32 cache's): v4_kv_layout.
  static bool index_fp4(const KvCache& kv, int64_t l) {
    const int64_t p = kv.layout().find_part(l, KvPartKind::kIndexKey);
    return p >= 0 && kv.layout().layer(l).parts[size_t(p)].index_dtype == DType::kF4E2M1;
  }
  // Entry `slot` of block `block_index` of the sequence in layer l's part p.
  static uint8_t* entry(KvCache& kv, const StepSequence& s, int64_t l, int64_t p,
                        int64_t block_index, int64_t slot) {
    CHECK(block_index < int64_t(s.block_table.size()), "position beyond the block table");
    return kv.block_entry(l, size_t(p), s.block_table[size_t(block_index)], slot);
  }
  // Where compressed entry w of ratio r lives: the block of the group's last token.
  static uint8_t* group_entry(KvCache& kv, const StepSequence& s, int64_t l, int64_t p, int64_t r,
                              int64_t w) {
    const int64_t last = w * r + r - 1;
    const int64_t slot = r <= kKvBlockSize ? (w * r % kKvBlockSize) / r : 0;
    return entry(kv, s, l, p, last / kKvBlockSize, slot);
  }

  // ---- Attention ----------------------------------------------------------------------------

  void attention(int64_t l, std::vector<Seq>& qs, const Rows& rows, const float* x, float* out) {
    const V4LayerWeights& L = w_.layers[size_t(l)];
    const int64_t n = rows.n(), Dh = v_.head_dim;
    const int64_t qr = *c_.q_lora_rank, ratio = v_.ratio(l);
    const std::vector<float>& inv = ratio == 0 ? inv_main_ : inv_compressed_;
    const float e = eps();
    auto seq_of = [&](int64_t r) -> Seq& { return qs[size_t(rows.seq[size_t(r)])]; };
    auto pos_of = [&](int64_t r) { return seq_of(r).pos(rows.local[size_t(r)]); };
    // The query latents (q_a and its norm) and the shared KV head of every row.
    std::vector<float> qlat(static_cast<size_t>(n * qr)), kvr(static_cast<size_t>(n * Dh));
    if (n > 0) {
      linear(x, n, L.wq_a, qlat.data());
      linear(x, n, L.wkv, kvr.data());
    }
    for (int64_t i = 0; i < n; ++i) rms_norm(&qlat[size_t(i * qr)], qr, L.q_norm.data(), e);
    // The shared KV head: into the cache (the window reads it back in the cache's format).
    for (int64_t i = 0; i < n; ++i) {
      float* v = &kvr[size_t(i * Dh)];
      rms_norm(v, Dh, L.kv_norm.data(), e);
      rope_tail(v, Dh, inv, pos_of(i));
      Seq& q = seq_of(i);
      q.kv.write(l, q.s.block_table, pos_of(i), v);
    }
    if (ratio != 0) {
      for (size_t s = 0; s < qs.size(); ++s) {
        if (qs[s].n() > 0) compress(l, qs[s], x + rows.first(s) * c_.hidden_size);
      }
    }
    if (n == 0) return;
    // Every KV entry of the step is written: the queries go in chunks of rows (each row's bits
    // are what a one-row product gives), so that a long prefill's per-row buffers (the heads'
    // queries and outputs, 2 x 128 KB a row at V4-Flash's widths) stay a chunk's, not the step's.
    std::vector<std::vector<int64_t>> picks(static_cast<size_t>(n));
    const int64_t chunk = std::max<int64_t>(kQueryChunk, pool_ ? 4 * int64_t(pool_->size()) : 0);
    for (int64_t r0 = 0; r0 < n; r0 += chunk) {
      const int64_t m = std::min(chunk, n - r0);
      attention_rows(l, qs, rows, r0, m, x + r0 * c_.hidden_size, &qlat[size_t(r0 * qr)], &picks,
                     out + r0 * c_.hidden_size);
    }
    if (observer_ && ratio == 4) {
      for (int64_t i = 0; i < n; ++i) observer_(l, 1, rows.local[size_t(i)], picks[size_t(i)]);
    }
  }

  // Rows [r0, r0 + m) of the step's attention (x and qlat their inputs and normalised query
  // latents, out their outputs): the heads' queries (q_b, each head normalised, unweighted, and
  // RoPE'd), the indexer's queries and weights, each query over its window and the compressed
  // entries it sees (one softmax with the sink), and the grouped output projection.
  void attention_rows(int64_t l, std::vector<Seq>& qs, const Rows& rows, int64_t r0, int64_t n,
                      const float* x, const float* qlat, std::vector<std::vector<int64_t>>* picks,
                      float* out) {
    const V4LayerWeights& L = w_.layers[size_t(l)];
    const int64_t H = c_.num_attention_heads, Dh = v_.head_dim, ratio = v_.ratio(l);
    const std::vector<float>& inv = ratio == 0 ? inv_main_ : inv_compressed_;
    const float e = eps();
    auto seq_of = [&](int64_t i) -> Seq& { return qs[size_t(rows.seq[size_t(r0 + i)])]; };
    auto pos_of = [&](int64_t i) { return seq_of(i).pos(rows.local[size_t(r0 + i)]); };
    std::vector<float>& qh = scratch_.qh;
    qh.resize(static_cast<size_t>(n * H * Dh));
    linear(qlat, n, L.wq_b, qh.data());
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t hh = 0; hh < H; ++hh) {
        float* v = &qh[size_t((i * H + hh) * Dh)];
        rms_norm(v, Dh, nullptr, e);
        rope_tail(v, Dh, inv, pos_of(i));
      }
    }
    // The indexer's queries and head weights.
    const int64_t nh = ratio == 4 ? c_.indexer->n_heads : 0,
                  id = ratio == 4 ? c_.indexer->head_dim : 0;
    std::vector<float> iq(static_cast<size_t>(n * nh * id)), iw(static_cast<size_t>(n * nh));
    if (ratio == 4) {
      linear(qlat, n, L.indexer->wq_b, iq.data());
      linear(x, n, L.indexer->weights_proj, iw.data());
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t hh = 0; hh < nh; ++hh) {
          rope_tail(&iq[size_t((i * nh + hh) * id)], id, inv_compressed_, pos_of(i));
        }
      }
    }
    // Per query: the window, then the compressed entries it sees; one softmax with the sink. A
    // query's result does not depend on the others, so a chunk spreads its queries over the
    // threads; a few queries spread each one's work.
    const Parts p = parts(qs[0].kv, l);
    const KvTokenFormat fmt = qs[0].kv.layout().token;
    const float scale = 1.0f / std::sqrt(float(Dh));
    std::vector<float>& o = scratch_.o;
    o.resize(static_cast<size_t>(n * H * Dh));
    auto query = [&](int64_t i, ThreadPool* inner) {
      thread_local std::vector<float> keys, scores;
      Seq& q = seq_of(i);
      const int64_t t = pos_of(i);
      const int64_t first = std::max<int64_t>(0, t - v_.sliding_window + 1);
      int64_t nk = t - first + 1;
      std::vector<int64_t>& picked = (*picks)[size_t(r0 + i)];
      if (ratio == 128) {
        picked.resize(size_t((t + 1) / ratio));
        std::iota(picked.begin(), picked.end(), 0);
      } else if (ratio == 4) {
        picked = index_select(l, q, &iq[size_t(i * nh * id)], &iw[size_t(i * nh)], t, inner);
      }
      keys.resize(size_t((nk + int64_t(picked.size())) * Dh));
      for (int64_t j = 0; j < nk; ++j)
        q.kv.read(l, q.s.block_table, first + j, &keys[size_t(j * Dh)]);
      for (int64_t w : picked) {
        kv_token_load(fmt, group_entry(q.kv, q.s, l, p.compressed, ratio, w),
                      &keys[size_t(nk * Dh)]);
        ++nk;
      }
      if (fast_) {
        attend_fast(L, &qh[size_t(i * H * Dh)], keys.data(), nk, &o[size_t(i * H * Dh)], inner);
        for (int64_t hh = 0; hh < H; ++hh) {
          rope_tail(&o[size_t((i * H + hh) * Dh)], Dh, inv, t, /*inverse=*/true);
        }
        return;
      }
      scores.resize(size_t(nk));
      for (int64_t hh = 0; hh < H; ++hh) {
        const float* qv = &qh[size_t((i * H + hh) * Dh)];
        float m = L.attn_sink[size_t(hh)];
        for (int64_t j = 0; j < nk; ++j) {
          float dot = 0;
          for (int64_t d = 0; d < Dh; ++d) dot += qv[d] * keys[size_t(j * Dh + d)];
          scores[size_t(j)] = dot * scale;
          m = std::max(m, scores[size_t(j)]);
        }
        float denom = std::exp(L.attn_sink[size_t(hh)] - m);
        float* ov = &o[size_t((i * H + hh) * Dh)];
        std::fill(ov, ov + Dh, 0.0f);
        for (int64_t j = 0; j < nk; ++j) {
          const float pj = std::exp(scores[size_t(j)] - m);
          denom += pj;
          for (int64_t d = 0; d < Dh; ++d) ov[d] += pj * keys[size_t(j * Dh + d)];
        }
        for (int64_t d = 0; d < Dh; ++d) ov[d] /= denom;
        rope_tail(ov, Dh, inv, t, /*inverse=*/true);
      }
    };
    if (pool_ && n >= 2 * int64_t(pool_->size())) {
      pool_->parallel_for(n, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) query(i, nullptr);
      });
    } else {
      for (int64_t i = 0; i < n; ++i) query(i, pool_);
    }
    // The grouped output projection: group g's heads through its own o_lora_rank rows of wo_a.
    const int64_t G = v_.o_groups, R = v_.o_lora_rank, gw = H * Dh / G;
    std::vector<float> u(static_cast<size_t>(n * G * R));
    if (fast_ && wo_a_sliceable()) {
      for (int64_t g = 0; g < G; ++g) {
        linear(&o[size_t(g * gw)], n, H * Dh, wo_a_group(L, g), &u[size_t(g * R)], G * R);
      }
      linear(u.data(), n, L.wo_b, out);
      return;
    }
    auto wo_rows = [&](int64_t a, int64_t b) {
      std::vector<float> wr(static_cast<size_t>(gw));
      for (int64_t r = a; r < b; ++r) {
        L.wo_a.row_to_f32(r, wr.data());
        const int64_t g = r / R;
        for (int64_t i = 0; i < n; ++i) {
          const float* og = &o[size_t(i * H * Dh + g * gw)];
          float acc = 0;
          for (int64_t k = 0; k < gw; ++k) acc += og[k] * wr[size_t(k)];
          u[size_t(i * G * R + r)] = acc;
        }
      }
    };
    if (pool_) {
      pool_->parallel_for(G * R, wo_rows, 16);
    } else {
      wo_rows(0, G * R);
    }
    linear(u.data(), n, L.wo_b, out);
  }

  // The fast path's attention of one query's heads q [H][Dh] over keys [nk][Dh] (K = V) with the
  // sinks: the reference's softmax, its two products as F32 GEMMs in gemm_f32_kn's form (each
  // output a k-ordered sum of FMAs, whatever the blocking or the threads): the scores as
  // keys [nk][Dh] times q transposed [Dh][H] (rows of keys over the threads), then the
  // weights [H][nk] times keys [nk][Dh] (columns of the output over the threads). Every head
  // shares each key load, where a dot product per head read the keys once per head.
  void attend_fast(const V4LayerWeights& L, const float* q, const float* keys, int64_t nk, float* o,
                   ThreadPool* pool) const {
    const int64_t H = c_.num_attention_heads, Dh = v_.head_dim;
    const float scale = 1.0f / std::sqrt(float(Dh));
    thread_local std::vector<float> qt, st, s;  // q^T [Dh][H]; scores [nk][H]; weights [H][nk]
    qt.resize(size_t(Dh * H));
    st.resize(size_t(nk * H));
    s.resize(size_t(H * nk));
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t d = 0; d < Dh; ++d) qt[size_t(d * H + h)] = q[h * Dh + d];
    }
    const float* qtp = qt.data();
    float* stp = st.data();
    auto scores = [&](int64_t j0, int64_t j1) {
      gemm_f32_kn(keys + j0 * Dh, j1 - j0, Dh, qtp, H, Dh, H, stp + j0 * H, H, nullptr);
    };
    pool ? pool->parallel_for(nk, scores, 6) : scores(0, nk);
    for (int64_t h = 0; h < H; ++h) {  // softmax with the sink
      float* sh = &s[size_t(h * nk)];
      float m = L.attn_sink[size_t(h)];
      for (int64_t j = 0; j < nk; ++j) m = std::max(m, sh[j] = st[size_t(j * H + h)] * scale);
      float denom = std::exp(L.attn_sink[size_t(h)] - m);
      for (int64_t j = 0; j < nk; ++j) denom += (sh[j] = std::exp(sh[j] - m));
      for (int64_t j = 0; j < nk; ++j) sh[j] /= denom;
    }
    gemm_f32_kn(s.data(), H, nk, keys, Dh, nk, Dh, o, Dh, pool);
  }

  // The compressors of layer l over the step's tokens, in order: each token's kv and gate pooled
  // into the group being filled (and, overlapping, its first half into the next group's), an
  // entry written when a group completes. State comes from the record of the block holding the
  // token before the step and goes to the record of each token's block.
  void compress(int64_t l, Seq& q, const float* x) {
    const V4LayerWeights& L = w_.layers[size_t(l)];
    const int64_t n = q.n(), ratio = v_.ratio(l), Dh = v_.head_dim;
    const Parts p = parts(q.kv, l);
    const int64_t nf = state_floats(c_, ratio);
    std::vector<float> st(static_cast<size_t>(nf));
    const int64_t t0 = q.pos(0);
    if (t0 > 0) {  // resume_compressors made it the state after t0 - 1
      std::memcpy(st.data(), entry(q.kv, q.s, l, p.state, (t0 - 1) / kKvBlockSize, 0),
                  size_t(nf) * 4);
    } else {
      clear_state(ratio, st.data());
    }
    struct Site {  // a compressor: the main one, and a compressed sparse layer's indexer's
      const V4CompressorWeights* w;
      int64_t d;
      bool overlap;
      float* state;
      int64_t part;
      std::vector<float> a, z;
    };
    std::vector<Site> sites;
    sites.push_back({&*L.compressor, Dh, ratio == 4, st.data(), p.compressed, {}, {}});
    if (ratio == 4) {
      sites.push_back({&L.indexer->compressor,
                       c_.indexer->head_dim,
                       true,
                       st.data() + 6 * Dh,
                       p.index_key,
                       {},
                       {}});
    }
    for (Site& site : sites) {
      const int64_t width = (site.overlap ? 2 : 1) * site.d;
      site.a.resize(size_t(n * width));
      site.z.resize(size_t(n * width));
      linear(x, n, site.w->wkv, site.a.data());
      linear(x, n, site.w->wgate, site.z.data());
    }
    const KvTokenFormat fmt = q.kv.layout().token;
    std::vector<float> e;
    std::vector<std::pair<int64_t, std::vector<float>>> snaps;  // (position, state after it)
    // Only a verify step (the last token and its drafts: the MTP module loaded, a few rows) can
    // be followed by a step that starts earlier.
    const bool keep_snapshots = has_mtp() && n <= kSnapshotRows;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = q.pos(i), j = t % ratio;
      for (size_t si = 0; si < sites.size(); ++si) {
        Site& site = sites[si];
        const int64_t d = site.d, width = (site.overlap ? 2 : 1) * d;
        float* ai = &site.a[size_t(i * width)];
        float* zi = &site.z[size_t(i * width)];
        for (int64_t k = 0; k < width; ++k) zi[k] += site.w->ape[size_t(j * width + k)];
        Pool cur(site.state, d), next(site.state + 3 * d, d);
        if (site.overlap) {
          cur.add(ai + d, zi + d);  // the token's own group: its second half
          next.add(ai, zi);         // the next group's: its first half
        } else {
          cur.add(ai, zi);
        }
        if (j != ratio - 1) continue;
        // The group is whole: its entry, normalised, rotated to its first token's position.
        e.resize(size_t(d));
        cur.result(e.data());
        rms_norm(e.data(), d, site.w->norm.data(), eps());
        rope_tail(e.data(), d, inv_compressed_, t - ratio + 1);
        uint8_t* dst = group_entry(q.kv, q.s, l, site.part, ratio, t / ratio);
        if (si == 0) {
          kv_token_store(fmt, e.data(), dst);
        } else if (index_fp4(q.kv, l)) {  // the indexer's key as model.py rounds it
          hadamard_rotate(e.data(), d);
          fp4_index_quantize(e.data(), d, dst);
        } else {
          std::memcpy(dst, e.data(), size_t(d) * 4);  // the indexer's key, F32
        }
        if (site.overlap) {
          cur.copy_from(next);
          next.clear();
        } else {
          cur.clear();
        }
      }
      if (keep_snapshots && n - i <= kSnapshotRows) {  // where a rejected draft's successor
                                                       // may resume
        snaps.emplace_back(t, std::vector<float>(st.begin(), st.end()));
      }
      if (t % kKvBlockSize == kKvBlockSize - 1 || i == n - 1) {  // the block's record
        uint8_t* rec = entry(q.kv, q.s, l, p.state, t / kKvBlockSize, 0);
        std::memcpy(rec, st.data(), size_t(nf) * 4);
        const int64_t at = t % kKvBlockSize;
        std::memcpy(rec + nf * 4, &at, kStateTail);
      }
    }
    // The snapshots by the block whose record their rows wrote, under the record's bytes.
    for (size_t a = 0; a < snaps.size();) {
      const int64_t bi = snaps[a].first / kKvBlockSize;
      size_t b = a;
      while (b < snaps.size() && snaps[b].first / kKvBlockSize == bi) ++b;
      const uint8_t* rec = entry(q.kv, q.s, l, p.state, bi, 0);
      const std::pair<int64_t, int32_t> key{l, q.s.block_table[size_t(bi)]};
      Snapshots& set = snapshots_[key];
      set.serial = ++snapshot_serial_;
      set.record_hash = XXH3_64bits(rec, size_t(nf * 4 + kStateTail));
      set.rows.assign(std::make_move_iterator(snaps.begin() + int64_t(a)),
                      std::make_move_iterator(snaps.begin() + int64_t(b)));
      snapshot_order_.push_back({key, set.serial});
      a = b;
    }
    while (int64_t(snapshot_order_.size()) > kMaxSnapshotSets * c_.num_hidden_layers) {
      const auto& [key, serial] = snapshot_order_.front();
      const auto it = snapshots_.find(key);
      if (it != snapshots_.end() && it->second.serial == serial) snapshots_.erase(it);
      snapshot_order_.pop_front();
    }
  }

  // Before a step from position t0 > 0: every compressed layer's record in the block of t0 - 1
  // holds the state after t0 - 1. A verify step whose drafts were rejected left the state after
  // its last draft there; the snapshot of t0 - 1 that step kept (its record's bytes unchanged
  // since) goes back in. Records of whole blocks (imported, prefix hits) hold their last
  // position's state already.
  Status resume_compressors(Seq& q) {
    const int64_t t0 = q.pos(0);
    if (t0 == 0) return Status::Ok();
    const int64_t bi = (t0 - 1) / kKvBlockSize;
    for (int64_t l = 0; l < c_.num_hidden_layers; ++l) {
      const int64_t ratio = v_.ratio(l);
      if (ratio == 0) continue;
      const int64_t nf = state_floats(c_, ratio);
      uint8_t* rec = entry(q.kv, q.s, l, parts(q.kv, l).state, bi, 0);
      int64_t after;  // within the block
      std::memcpy(&after, rec + nf * 4, kStateTail);
      const auto it = snapshots_.find({l, q.s.block_table[size_t(bi)]});
      if (after == (t0 - 1) % kKvBlockSize) {  // nothing rejected: the snapshots are done with
        if (it != snapshots_.end()) snapshots_.erase(it);
        continue;
      }
      const std::vector<float>* state = nullptr;
      if (it != snapshots_.end() && after > (t0 - 1) % kKvBlockSize &&
          it->second.record_hash == XXH3_64bits(rec, size_t(nf * 4 + kStateTail))) {
        for (const auto& [pos, st] : it->second.rows) {
          if (pos == t0 - 1) state = &st;
        }
      }
      if (!state) {
        return Internal(fmt::format(
            "DeepSeek-V4 layer {}: the compressor state for position {} is gone (the block's "
            "record holds position {})",
            l, t0 - 1, bi * kKvBlockSize + after));
      }
      std::memcpy(rec, state->data(), size_t(nf) * 4);
      const int64_t at = (t0 - 1) % kKvBlockSize;
      std::memcpy(rec + nf * 4, &at, kStateTail);
      snapshots_.erase(it);
    }
    return Status::Ok();
  }

  void clear_state(int64_t ratio, float* st) const {
    const int64_t Dh = v_.head_dim;
    Pool(st, Dh).clear();
    if (ratio != 4) return;
    Pool(st + 3 * Dh, Dh).clear();
    const int64_t di = c_.indexer->head_dim;
    Pool(st + 6 * Dh, di).clear();
    Pool(st + 6 * Dh + 3 * di, di).clear();
  }

  // The lightning indexer of a compressed sparse layer for the query at position t: the
  // index_topk entries (of those wholly at or before t) with the largest
  // sum_h w[h] * ReLU(q[h] . k), in entry order. iq_row: the query's indexer heads [nh][d] (RoPE
  // applied), w_row: their weights [nh]; `pool` (may be null) splits the fast path's scoring.
  std::vector<int64_t> index_select(int64_t l, Seq& q, const float* iq_row, const float* w_row,
                                    int64_t t, ThreadPool* pool) {
    const IndexerConfig& ix = *c_.indexer;
    const int64_t nh = ix.n_heads, d = ix.head_dim, valid = (t + 1) / 4;
    std::vector<int64_t> all(static_cast<size_t>(valid));
    std::iota(all.begin(), all.end(), 0);
    if (valid <= ix.topk) return all;
    const float* iq = iq_row;
    std::vector<float> wgt(w_row, w_row + nh);
    const float ws = 1.0f / std::sqrt(float(d) * float(nh));
    const Parts p = parts(q.kv, l);
    std::vector<float> score(static_cast<size_t>(valid));
    constexpr int64_t kPerBlock = kKvBlockSize / 4;  // a block's keys, contiguous
    const int64_t nb = (valid + kPerBlock - 1) / kPerBlock;
    if (index_fp4(q.kv, l)) {
      // model.py's arithmetic: the query's heads rotated and rounded to FP4 as the keys are;
      // the reference path at the kernels' scalar level, the fast path at the CPU's.
      for (float& v : wgt) v *= ws;
      std::vector<float> rq(iq, iq + nh * d);
      for (int64_t hh = 0; hh < nh; ++hh) hadamard_rotate(&rq[size_t(hh * d)], d);
      Fp4IndexQuery fq;
      fp4_index_query(rq.data(), wgt.data(), nh, d, fq);
      const int64_t ld = q.kv.layout().layer(l).parts[size_t(p.index_key)].entry_bytes();
      const Isa isa = fast_ ? active_isa() : Isa::kScalar;
      auto blocks = [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b) {
          const int64_t w0 = b * kPerBlock, cnt = std::min(kPerBlock, valid - w0);
          fp4_index_scores(fq, group_entry(q.kv, q.s, l, p.index_key, 4, w0), cnt, ld,
                           &score[size_t(w0)], isa);
        }
      };
      pool ? pool->parallel_for(nb, blocks, 16) : blocks(0, nb);
    } else if (fast_) {  // relu_scores_f32 over each block's keys, blocks on the threads
      for (float& v : wgt) v *= ws;
      std::vector<float> iqt(size_t(nh * d));
      relu_scores_transpose(iq, nh, d, iqt.data());
      auto blocks = [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b) {
          const int64_t w0 = b * kPerBlock, cnt = std::min(kPerBlock, valid - w0);
          const float* k =
              reinterpret_cast<const float*>(group_entry(q.kv, q.s, l, p.index_key, 4, w0));
          relu_scores_f32(iqt.data(), wgt.data(), nh, k, cnt, d, d, &score[size_t(w0)]);
        }
      };
      pool ? pool->parallel_for(nb, blocks, 16) : blocks(0, nb);
    } else {
      for (int64_t w = 0; w < valid; ++w) {
        const float* k =
            reinterpret_cast<const float*>(group_entry(q.kv, q.s, l, p.index_key, 4, w));
        float sum = 0;
        for (int64_t hh = 0; hh < nh; ++hh) {
          float dot = 0;
          for (int64_t j = 0; j < d; ++j) dot += iq[size_t(hh * d + j)] * k[j];
          sum += wgt[size_t(hh)] * ws * std::max(dot, 0.0f);
        }
        score[size_t(w)] = sum;
      }
    }
    // The top k without a sort (ties to the earlier entry), ascending.
    const std::vector<int32_t> top = top_k_positions(score, ix.topk);
    return std::vector<int64_t>(top.begin(), top.end());
  }

  // ---- MoE ----------------------------------------------------------------------------------

  // The MoE over the step's rows x [n, D] (tokens: their ids, for a hash layer's table;
  // row_in_seq: each row's index in its sequence, for the observer) -> out [n, D]: the shared
  // expert, plus each row's routed experts weighted; in an EP group the routed part through the
  // dispatcher (the experts of this rank over the rows sent to it).
  Status moe(int64_t l, std::span<const int32_t> tokens, std::span<const int64_t> row_in_seq,
             const float* x, float* out) {
    const V4LayerWeights& L = w_.layers[size_t(l)];
    const int64_t n = int64_t(tokens.size()), D = c_.hidden_size, E = c_.n_routed_experts,
                  k = c_.num_experts_per_tok;
    std::vector<float> logits(static_cast<size_t>(n * E));
    if (n > 0) linear(x, n, L.gate, logits.data());
    // Each row's experts and weights, [n, k].
    std::vector<int32_t> ids(static_cast<size_t>(n * k));
    std::vector<float> wts(static_cast<size_t>(n * k));
    std::vector<int32_t> order(static_cast<size_t>(E));
    std::vector<float> s(static_cast<size_t>(E));
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t e = 0; e < E; ++e) s[size_t(e)] = std::sqrt(softplus(logits[size_t(i * E + e)]));
      int32_t* idx = &ids[size_t(i * k)];
      if (!L.tid2eid.empty()) {  // a hash layer: the token's own experts
        const int32_t id = tokens[size_t(i)];
        for (int64_t j = 0; j < k; ++j) idx[j] = L.tid2eid[size_t(id * k + j)];
      } else {
        std::iota(order.begin(), order.end(), 0);
        std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
          const float sa = s[size_t(a)] + L.gate_bias[size_t(a)];
          const float sb = s[size_t(b)] + L.gate_bias[size_t(b)];
          return sa != sb ? sa > sb : a < b;
        });
        std::copy(order.begin(), order.begin() + k, idx);
        if (observer_) {
          std::vector<int64_t> picked(idx, idx + k);
          std::sort(picked.begin(), picked.end());
          observer_(l, 0, row_in_seq[size_t(i)], picked);
        }
      }
      float sum = 0;
      for (int64_t j = 0; j < k; ++j) sum += s[size_t(idx[j])];
      for (int64_t j = 0; j < k; ++j) {
        const float wgt = c_.norm_topk_prob ? s[size_t(idx[j])] / sum : s[size_t(idx[j])];
        wts[size_t(i * k + j)] = wgt * float(c_.routed_scaling_factor);
      }
    }
    if (n > 0) swiglu(L.shared, x, n, out);
    if (dispatcher_) return moe_ep(l, x, n, ids, wts, out);
    // Rows per expert, in row order; each expert over its rows, its weighted output summed per
    // row in expert order, then added to the shared expert's (as an EP group's combine sums,
    // so that one with F32 dispatch gives these bits).
    std::vector<std::vector<std::pair<int64_t, float>>> routed(static_cast<size_t>(E));
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < k; ++j) {
        routed[size_t(ids[size_t(i * k + j)])].push_back({i, wts[size_t(i * k + j)]});
      }
    }
    std::vector<float> xs, ys, sum(static_cast<size_t>(n * D), 0.0f);
    for (int64_t e = 0; e < E; ++e) {
      const auto& rows = routed[size_t(e)];
      if (rows.empty()) continue;
      const MlpWeights* held = experts_.held(L.experts, int32_t(e));
      CHECK(held != nullptr, "a routed expert this process does not hold");
      const int64_t m = int64_t(rows.size());
      xs.resize(size_t(m * D));
      ys.resize(size_t(m * D));
      for (int64_t r = 0; r < m; ++r) {
        std::copy(x + rows[size_t(r)].first * D, x + (rows[size_t(r)].first + 1) * D,
                  xs.begin() + r * D);
      }
      swiglu(*held, xs.data(), m, ys.data());
      for (int64_t r = 0; r < m; ++r) {
        float* o = &sum[size_t(rows[size_t(r)].first * D)];
        const float wgt = rows[size_t(r)].second;
        for (int64_t d = 0; d < D; ++d) o[d] += wgt * ys[size_t(r * D + d)];
      }
    }
    for (int64_t i = 0; i < n * D; ++i) out[i] += sum[size_t(i)];
    return Status::Ok();
  }

  // The routed part across the EP group (ep/dispatcher.h): every rank calls it once per MoE
  // layer, with no rows too. Its MoE layers are the model's layers (the MTP module's the last).
  Status moe_ep(int64_t l, const float* x, int64_t n, const std::vector<int32_t>& ids,
                const std::vector<float>& wts, float* out) {
    const V4LayerWeights& L = w_.layers[size_t(l)];
    const int64_t D = c_.hidden_size, k = c_.num_experts_per_tok;
    ASSIGN_OR_RETURN(ExpertBatch b, dispatcher_->dispatch(l, x, n, D, ids.data(), wts.data(), k));
    std::vector<float> y(static_cast<size_t>(b.n_rows() * D)), xs;
    for (size_t sg = 0; sg < b.experts.size(); ++sg) {
      const int64_t m = b.segment_rows(sg), r0 = b.segment_begin(sg);
      if (m == 0) continue;
      const int32_t e = b.experts[sg];
      const MlpWeights* held = experts_.held(L.experts, e);
      if (!held) {
        return Internal(
            fmt::format("layer {}: rows for expert {}, which this rank does not hold", l, e));
      }
      const float* xe = nullptr;
      if (b.has_bf16_rows()) {  // (what the fast path's GEMMs round to anyway)
        xs.resize(size_t(m * D));
        for (int64_t r = 0; r < m; ++r) bf16_to_f32_row(b.bf16_row(r0 + r), D, &xs[size_t(r * D)]);
        xe = xs.data();
      } else {
        xe = b.x.data() + r0 * D;
      }
      swiglu(*held, xe, m, &y[size_t(r0 * D)]);
    }
    std::vector<float> routed(static_cast<size_t>(n * D));
    RETURN_IF_ERROR(dispatcher_->combine(b, y.data(), routed.data()));
    for (int64_t i = 0; i < n * D; ++i) out[i] += routed[size_t(i)];
    return Status::Ok();
  }

  // y = down(silu(min(gate x, limit)) * clamp(up x, -limit, limit)).
  void swiglu(const MlpWeights& w, const float* x, int64_t m, float* y) const {
    const int64_t I = w.gate.rows;
    std::vector<float> g(static_cast<size_t>(m * I)), u(static_cast<size_t>(m * I));
    linear(x, m, w.gate, g.data());
    linear(x, m, w.up, u.data());
    const float lim = float(v_.swiglu_limit);
    for (int64_t k = 0; k < m * I; ++k) {
      float gk = g[size_t(k)], uk = u[size_t(k)];
      if (lim > 0) {
        gk = std::min(gk, lim);
        uk = std::clamp(uk, -lim, lim);
      }
      g[size_t(k)] = silu(gk) * uk;
    }
    linear(g.data(), m, w.down, y);
  }

  const ModelConfig& c_;
  const V4Config& v_;
  const V4Weights& w_;
  ThreadPool* pool_;
  bool fast_;
  Dispatcher* dispatcher_;  // an EP group's (more than one rank), else null: experts all here
  PackedViews packed_;
  V4ChoiceObserver observer_;
  // The compressors' states after each row of a verify step, per (layer, block id) whose record
  // those rows wrote: what resume_compressors puts back when drafts were rejected, and drops
  // when the next step has resumed. Bounded: what finished sequences leave goes oldest first past
  // kMaxSnapshotSets sequences' worth.
  static constexpr int64_t kSnapshotRows = 16;  // more than any verify step's rows
  static constexpr int64_t kMaxSnapshotSets = 512;
  struct Snapshots {
    uint64_t serial = 0;  // of the step that kept them
    uint64_t record_hash = 0;
    std::vector<std::pair<int64_t, std::vector<float>>> rows;
  };
  std::map<std::pair<int64_t, int32_t>, Snapshots> snapshots_;
  std::deque<std::pair<std::pair<int64_t, int32_t>, uint64_t>> snapshot_order_;
  uint64_t snapshot_serial_ = 0;
  ExpertStore experts_;
  std::vector<float> inv_main_, inv_compressed_;
  // A query chunk's heads' queries and outputs, kept between calls (attention_rows): fresh
  // buffers of this size would be page-faulted in at every layer of every step.
  static constexpr int64_t kQueryChunk = 128;
  struct {
    std::vector<float> qh, o;
  } scratch_;
};

}  // namespace

KvLayout v4_kv_layout(const ModelConfig& c, DType kv_dtype, bool mtp) {
  const V4Config& v = *c.v4;
  // FP8: model.py's rounding of the non-RoPE values, per 64 with a UE8M0 scale.
  const KvTokenFormat token{kv_dtype, v.head_dim - c.qk_rope_head_dim, c.qk_rope_head_dim,
                            kv_dtype == DType::kF8E4M3 ? KvFp8Layout::kV4 : KvFp8Layout::kFlashMla};
  std::vector<KvLayerFormat> layers;
  const int64_t n = c.num_hidden_layers + (mtp ? 1 : 0);
  for (int64_t l = 0; l < n; ++l) {
    KvLayerFormat f;
    f.window = v.sliding_window;
    f.parts.push_back(KvPart::latent(token));
    const int64_t r = v.ratio(l);
    if (r != 0) f.parts.push_back(KvPart::compressed(token, r));
    // The indexer's keys: FP4 as DeepSeek's model.py rounds them (kernels/index_fp4.h), or, in
    // an F32 cache (the reference format), F32 as transformers' deepseek_v4 keeps them.
    if (r == 4) {
      f.parts.push_back(KvPart::index_key(c.indexer->head_dim, 4,
                                          kv_dtype == DType::kF32 ? DType::kF32 : DType::kF4E2M1));
    }
    if (r != 0) f.parts.push_back(KvPart::state(state_floats(c, r) * 4 + kStateTail));
    layers.push_back(std::move(f));
  }
  return KvLayout(std::move(layers));
}

void set_v4_choice_observer(CausalLm& model, V4ChoiceObserver observer) {
  static_cast<DeepseekV4&>(model).set_choice_observer(std::move(observer));
}

std::unique_ptr<CausalLm> make_deepseek_v4(const ModelConfig& config, const ModelWeights& weights,
                                           ThreadPool* pool, bool fast,
                                           const WeightCacheOptions& cache, Dispatcher* dispatcher,
                                           const WeightFormats& formats) {
  return std::make_unique<DeepseekV4>(config, weights, pool, fast, cache, dispatcher, formats);
}

}  // namespace moeserve
