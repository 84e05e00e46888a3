#include "bench_v4.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "cache/kv_cache.h"
#include "model/checkpoint.h"
#include "model/deepseek_v4.h"
#include "model/deepseek_v4_weights.h"

namespace moeserve::bench {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The format a matrix runs in with the requantizing options, as the model's packing picks it
// (docs/deepseek-v4.md "Requantized weights"): kFp8 for its own.
struct Formats {
  WeightFormats options;
  const uint8_t* head = nullptr;  // the lm_head's bytes
  WeightFormat of(const WeightView& w) const {
    if (w.data == head) {
      return options.lm_head == HeadFormat::kInt8   ? WeightFormat::kInt8
             : options.lm_head == HeadFormat::kInt4 ? WeightFormat::kInt4
                                                    : WeightFormat::kFp8;
    }
    if (w.dtype == DType::kF4E2M1) return options.experts.value_or(WeightFormat::kFp8);
    if (w.dtype == DType::kF8E4M3) return options.projections;
    return WeightFormat::kFp8;
  }
};

// A matrix's bytes as the fast path reads them (FP8 with its F32 block scales; FP4 with a scale
// byte per 32; F32/BF16 as stored; requantized INT8 with an F32 per 128, INT4 with two).
double view_bytes(const WeightView& w, WeightFormat f) {
  const double n = double(w.rows) * double(w.cols);
  if (f == WeightFormat::kInt8) return n * (1 + 4.0 / 128);
  if (f == WeightFormat::kInt4) return n * (0.5 + 8.0 / 128);
  if (w.dtype == DType::kF4E2M1) return double(w.rows) * double(w.cols) * (0.5 + 1.0 / 32);
  double b = double(w.rows) * double(w.cols) * double(dtype_size(w.dtype));
  if (w.dtype == DType::kF8E4M3) {
    b += double((w.rows + w.block_rows - 1) / w.block_rows) * double(w.scale_cols()) * 4.0;
  }
  return b;
}
double macs(const WeightView& w) {
  return double(w.rows) * double(w.cols);
}

// What a step of `batch` tokens costs outside attention: weight bytes (every matrix but the
// routed experts once; of those, the expected distinct experts the batch's top-k picks touch,
// E (1 - (1 - k/E)^batch), at their average size: top-k for one token) and multiply-adds (each
// token's, its k experts at their average size).
// Requantized matrices' multiply-adds count as 8-bit ones (VNNI).
struct Cost {
  double bytes = 0, gemm_macs = 0, f32_macs = 0, int8_macs = 0;
  const Formats* formats = nullptr;
  void add(const WeightView& w) {
    const WeightFormat f = formats ? formats->of(w) : WeightFormat::kFp8;
    bytes += view_bytes(w, f);
    (f == WeightFormat::kFp8 ? gemm_macs : int8_macs) += macs(w);
  }
};

Cost weights_per_step(const ModelConfig& c, const V4Weights& w, const Formats& fm, bool with_head,
                      int64_t batch) {
  const double b = double(batch);
  Cost k, dense;  // dense: every matrix but the routed experts, read once, run per token
  k.formats = dense.formats = &fm;
  k.bytes += b * double(c.hidden_size) * 2;  // embedding rows
  if (with_head) dense.add(w.head);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const V4LayerWeights& L = w.layers[size_t(l)];
    for (const WeightView* v : {&L.hc_attn.fn, &L.hc_ffn.fn, &L.wq_a, &L.wq_b, &L.wkv, &L.wo_a,
                                &L.wo_b, &L.gate, &L.shared.gate, &L.shared.up, &L.shared.down}) {
      dense.add(*v);
    }
    for (const auto* cw :
         {L.compressor ? &*L.compressor : nullptr, L.indexer ? &L.indexer->compressor : nullptr}) {
      if (cw) dense.add(cw->wkv), dense.add(cw->wgate);
    }
    if (L.indexer) dense.add(L.indexer->wq_b), dense.add(L.indexer->weights_proj);
    Cost experts;
    experts.formats = &fm;
    int n = 0;
    for (const auto& e : L.experts) {
      if (e) experts.add(e->gate), experts.add(e->up), experts.add(e->down), ++n;
    }
    const double share = n > 0 ? double(c.num_experts_per_tok) / n : 0;
    k.bytes += experts.bytes * (1 - std::pow(1 - share, b));
    k.gemm_macs += experts.gemm_macs * share * b;
    k.int8_macs += experts.int8_macs * share * b;
  }
  k.bytes += dense.bytes;
  k.gemm_macs += dense.gemm_macs * b;
  k.int8_macs += dense.int8_macs * b;
  return k;
}
Cost weights_per_token(const ModelConfig& c, const V4Weights& w, const Formats& fm,
                       bool with_head) {
  return weights_per_step(c, w, fm, with_head, 1);
}

// Attention's reads and F32 multiply-adds for the query at position t (K = V: scores and
// weighted sums over the same keys), per layer kind.
Cost attention_at(const ModelConfig& c, const KvLayout& layout, int64_t t) {
  const V4Config& v = *c.v4;
  const double entry = double(layout.token.bytes());  // a window or compressed entry
  const double H = double(c.num_attention_heads), Dh = double(v.head_dim);
  Cost k;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const int64_t r = v.ratio(l);
    double keys = double(std::min<int64_t>(t + 1, v.sliding_window));
    if (r == 128) keys += double((t + 1) / 128);
    if (r == 4) {
      const double entries = double((t + 1) / 4), ih = double(c.indexer->n_heads);
      const double id = double(c.indexer->head_dim);
      const KvPart& keys_part =
          layout.layer(l).parts[size_t(layout.find_part(l, KvPartKind::kIndexKey))];
      k.bytes += entries * double(keys_part.entry_bytes());  // the index keys (FP4: 68 B)
      // FP4 keys score as 8-bit integer dot products (kernels/index_fp4.h), F32 ones in F32.
      (keys_part.index_dtype == DType::kF4E2M1 ? k.int8_macs : k.f32_macs) += entries * ih * id;
      keys += std::min<double>(entries, double(c.indexer->topk));
    }
    k.bytes += keys * entry;
    k.f32_macs += 2 * keys * H * Dh;
  }
  return k;
}

struct Roof {
  double t_mem, t_compute;
  double t() const { return std::max(t_mem, t_compute); }
};
Roof roofline(const Cost& k, const Ceilings& ceil) {
  const double f32_peak = ceil.bf16_peak_gflops / 2;  // an FMA lane does half a BF16 pair
  // A VNNI lane does four 8-bit products where a BF16 one does two.
  const double int8_peak = ceil.bf16_peak_gflops * 2;
  return {k.bytes / (ceil.dram_read_gbps * 1e9), 2 * k.gemm_macs / (ceil.gemm_peak_gflops() * 1e9) +
                                                     2 * k.f32_macs / (f32_peak * 1e9) +
                                                     2 * k.int8_macs / (int8_peak * 1e9)};
}

}  // namespace

int run_v4_bench(const V4BenchOptions& o, const Ceilings& ceil, const ThreadPool& outer) {
  auto ck = Checkpoint::open(o.model_dir);
  if (!ck.ok()) {
    fmt::print(stderr, "{}\n", ck.status().to_string());
    return 1;
  }
  const ModelConfig& c = (*ck)->config();
  if (!c.v4) {
    fmt::print(stderr, "{}: not a DeepSeek-V4 checkpoint\n", o.model_dir);
    return 1;
  }
  ThreadPool pool(outer.size());
  const double t_load = now_s();
  std::unique_ptr<CausalLm> model =
      make_deepseek_v4(c, (*ck)->weights(), &pool, /*fast=*/true, {}, nullptr, o.formats);
  const Formats fm{o.formats, (*ck)->weights().v4->head.data};
  auto positive = [](std::vector<int64_t> v) {  // --batches 0 / --prefill 0: none
    std::erase_if(v, [](int64_t x) { return x <= 0; });
    return v;
  };
  const std::vector<int64_t> batches = positive(o.batches), prefills = positive(o.prefill);
  const double pack_s = now_s() - t_load;
  const KvLayout layout = v4_kv_layout(c, DType::kBF16, false);
  int64_t longest = 0, longest_prefill = 0;
  for (int64_t t : o.contexts) longest = std::max(longest, t);
  for (int64_t t : prefills) longest_prefill = std::max(longest_prefill, t);
  int64_t batch_blocks = 0;  // the batched decode's sequences, each its own copies
  for (int64_t b : batches) batch_blocks += b * (o.batch_context / kKvBlockSize + 1);
  const int64_t blocks = (longest + longest_prefill) / kKvBlockSize + 4 + batch_blocks;
  // The window pool (docs/kv-cache.md, "The window pool"): pages for the prefill's blocks, the
  // seed and the decode's new block, and the two blocks before each context's end, whose window
  // entries the decode step reads; the copies behind them keep none, as a sequence's would not.
  int64_t batch_pages = 0;
  for (int64_t b : batches) batch_pages = std::max(batch_pages, b * 3);
  const int64_t window_pages =
      longest_prefill / kKvBlockSize + 4 + 2 * int64_t(o.contexts.size()) + 2 + batch_pages;
  if (!o.json) {
    fmt::print(
        "v4 bench: {}  {} layers, {} threads, packed in {:.1f} s; KV {} blocks of {} bytes and {} "
        "window pages of {} ({:.2f} GB); DRAM {:.1f} GB/s, BF16 peak {:.0f} GFLOP/s\n",
        o.model_dir, c.num_hidden_layers, pool.size(), pack_s, blocks, layout.main_bytes(),
        window_pages, layout.window_bytes(),
        (double(blocks) * double(layout.main_bytes()) +
         double(window_pages) * double(layout.window_bytes())) /
            1e9,
        ceil.dram_read_gbps, ceil.bf16_peak_gflops);
  }
  KvCache cache(layout, int32_t(blocks), 0, int32_t(window_pages));
  std::vector<int32_t> holds;  // (held for the bench's life)
  // One block the model wrote (64 tokens), copied into as many blocks as the longest context.
  std::vector<int32_t> seed;
  if (!cache.allocate(1, &seed, &holds)) return 1;
  std::vector<int32_t> tokens(size_t(std::max<int64_t>(kKvBlockSize, 1)));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(1 + (i * 7919) % 1000);
  StepOutput out;
  {
    StepSequence s{tokens, 0, seed, 1};
    Status st = model->forward({&s, 1}, cache, &out);
    if (!st.ok()) return fmt::print(stderr, "{}\n", st.to_string()), 1;
  }
  std::vector<int32_t> table;
  const std::vector<uint8_t> seed_bytes = cache.export_block(seed[0]).bytes;
  for (int64_t b = 0; b < longest / kKvBlockSize; ++b) {
    const bool window = std::any_of(o.contexts.begin(), o.contexts.end(), [&](int64_t t) {
      return b < t / kKvBlockSize && b >= t / kKvBlockSize - cache.window_blocks();
    });
    if (!cache.import_bytes(seed_bytes, &table, &holds, window)) {
      fmt::print(stderr, "the KV cache holds {} blocks, fewer than the context needs\n", blocks);
      return 1;
    }
  }
  std::vector<int32_t> extra;
  if (!cache.allocate(1, &extra, &holds)) return 1;
  const Cost weights = weights_per_token(c, *(*ck)->weights().v4, fm, true);
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  if (!o.json) {
    fmt::print("{:<8} {:>9} {:>10} {:>10} {:>10} {:>8} {:>8}  {:<7} {}\n", "case", "context", "ms",
               "MB read", "GFLOP", "roof ms", "share", "bound", "DRAM GB/s");
  }
  auto report = [&](const char* kind, int64_t ctx, double t, const Cost& k, const Ceilings& at) {
    const Roof r = roofline(k, at);
    const double gflop = 2 * (k.gemm_macs + k.f32_macs + k.int8_macs) / 1e9;
    const char* bound = r.t_mem >= r.t_compute ? "memory" : "compute";
    if (o.json) {
      rows.push_back({{"case", kind},
                      {"context", ctx},
                      {"seconds", t},
                      {"bytes", k.bytes},
                      {"gflop", gflop},
                      {"roofline_seconds", r.t()},
                      {"roofline_share", r.t() / t},
                      {"dram_read_gbps", at.dram_read_gbps},
                      {"bound", bound}});
    } else {
      fmt::print("{:<8} {:>9} {:>10.2f} {:>10.1f} {:>10.2f} {:>8.2f} {:>8.3f}  {:<7} {:.1f}\n",
                 kind, ctx, t * 1e3, k.bytes / 1e6, gflop, r.t() * 1e3, r.t() / t, bound,
                 at.dram_read_gbps);
    }
    std::fflush(stdout);
  };
  for (int64_t ctx : o.contexts) {
    std::vector<int32_t> t(table.begin(), table.begin() + ctx / kKvBlockSize);
    t.push_back(extra[0]);
    const int32_t id = 42;
    StepSequence s{std::span<const int32_t>(&id, 1), ctx / kKvBlockSize * kKvBlockSize, t, 1};
    // The DRAM reading around the case (it drifts within minutes): the better of before and after.
    const double dram_before = measure_dram_read_gbps(pool, 1, 0.3);
    double best = 1e30;
    for (int rep = 0; rep <= o.repeats; ++rep) {  // the first run warms up, untimed
      const double t0 = now_s();
      Status st = model->forward({&s, 1}, cache, &out);
      if (!st.ok()) return fmt::print(stderr, "{}\n", st.to_string()), 1;
      if (rep > 0) best = std::min(best, now_s() - t0);
    }
    Cost k = weights;
    const Cost a = attention_at(c, layout, s.start_pos);
    k.bytes += a.bytes;
    k.f32_macs += a.f32_macs;
    k.int8_macs += a.int8_macs;
    Ceilings here = ceil;
    here.dram_read_gbps = std::max(dram_before, measure_dram_read_gbps(pool, 1, 0.3));
    report("decode", s.start_pos, best, k, here);
  }
  // Batched decode: `b` sequences at o.batch_context each (their own copies of the seed block,
  // window pages for the blocks their windows read), one token each: the MoE runs the step's
  // rows at once, so the routed experts are read once per step.
  for (int64_t b : batches) {
    const int64_t ctx = o.batch_context;
    std::vector<std::vector<int32_t>> tables(static_cast<size_t>(b)), bholds(tables.size());
    std::vector<StepSequence> seqs;
    std::vector<int32_t> ids(static_cast<size_t>(b));
    for (int64_t i = 0; i < b; ++i) {
      ids[size_t(i)] = int32_t(42 + i);
      std::vector<int32_t>& t = tables[size_t(i)];
      for (int64_t blk = 0; blk < ctx / kKvBlockSize; ++blk) {
        const bool window = blk >= ctx / kKvBlockSize - cache.window_blocks();
        if (!cache.import_bytes(seed_bytes, &t, &bholds[size_t(i)], window)) {
          fmt::print(stderr, "the KV cache holds {} blocks, fewer than the batch needs\n", blocks);
          return 1;
        }
      }
      if (!cache.allocate(1, &t, &bholds[size_t(i)])) return 1;
    }
    for (int64_t i = 0; i < b; ++i) {
      seqs.push_back({std::span<const int32_t>(&ids[size_t(i)], 1),
                      ctx / kKvBlockSize * kKvBlockSize, tables[size_t(i)], 1});
    }
    const double dram_before = measure_dram_read_gbps(pool, 1, 0.3);
    double best = 1e30;
    for (int rep = 0; rep <= o.repeats; ++rep) {
      const double t0 = now_s();
      Status st = model->forward(seqs, cache, &out);
      if (!st.ok()) return fmt::print(stderr, "{}\n", st.to_string()), 1;
      if (rep > 0) best = std::min(best, now_s() - t0);
    }
    Cost k = weights_per_step(c, *(*ck)->weights().v4, fm, true, b);
    const Cost a = attention_at(c, layout, ctx / kKvBlockSize * kKvBlockSize);
    k.bytes += double(b) * a.bytes;
    k.f32_macs += double(b) * a.f32_macs;
    k.int8_macs += double(b) * a.int8_macs;
    Ceilings here = ceil;
    here.dram_read_gbps = std::max(dram_before, measure_dram_read_gbps(pool, 1, 0.3));
    report(fmt::format("decode-b{}", b).c_str(), ctx, best, k, here);
    if (!o.json) {
      fmt::print("  batch {}: {:.1f} tokens/s ({:.2f} ms a step)\n", b, double(b) / best,
                 best * 1e3);
    }
    for (size_t i = 0; i < tables.size(); ++i) cache.release(tables[i], bholds[i]);
  }
  // Prefill: the prompt in chunks of 2048 (as the scheduler chunks it), from position 0.
  for (int64_t n : prefills) {
    std::vector<int32_t> prompt(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) prompt[size_t(i)] = int32_t(1 + (i * 7919) % 5000);
    std::vector<int32_t> ptable, pholds;
    if (!cache.allocate(int32_t(n / kKvBlockSize + 1), &ptable, &pholds)) return 1;
    const double t0 = now_s();
    for (int64_t p = 0; p < n; p += 2048) {
      const int64_t len = std::min<int64_t>(2048, n - p);
      StepSequence s{std::span<const int32_t>(prompt).subspan(size_t(p), size_t(len)), p, ptable,
                     p + len == n ? 1 : 0};
      Status st = model->forward({&s, 1}, cache, &out);
      if (!st.ok()) return fmt::print(stderr, "{}\n", st.to_string()), 1;
    }
    const double t = now_s() - t0;
    cache.release(ptable, pholds);
    Cost k = weights_per_token(c, *(*ck)->weights().v4, fm, false);
    k.gemm_macs *= double(n);
    k.int8_macs *= double(n);
    k.f32_macs = 0;
    for (int64_t i = 0; i < n; ++i) {
      const Cost a = attention_at(c, layout, i);
      k.f32_macs += a.f32_macs;
      k.int8_macs += a.int8_macs;
    }
    const WeightView& head = (*ck)->weights().v4->head;
    (fm.of(head) == WeightFormat::kFp8 ? k.gemm_macs : k.int8_macs) += macs(head);
    report("prefill", n, t, k, ceil);
  }
  if (o.json) fmt::print("{}\n", nlohmann::ordered_json{{"v4", rows}}.dump());
  return 0;
}

}  // namespace moeserve::bench
