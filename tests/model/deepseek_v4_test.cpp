// DeepSeek-V4 (model/deepseek_v4.h) against Hugging Face transformers' deepseek_v4, an
// implementation no one here wrote: a tiny checkpoint in DeepSeek's published format (FP8 with
// UE8M0 scales, FP4 experts, hash-routed layers, sliding-window, compressed sparse and heavily
// compressed layers, MTP tensors) and transformers' top-5 logprobs at every prompt position and
// over 12 greedy decode steps with its cache. Fixture: tools/gen_v4_fixture.py ->
// tests/data/v4/tiny/.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include <nlohmann/json.hpp>

#include "cache/kv_cache.h"
#include "core/thread_pool.h"
#include "engine/engine_core.h"
#include "model/checkpoint.h"
#include "model/deepseek_v4.h"
#include "model/expert_store.h"
#include "model/family.h"
#include "model/make_model.h"

namespace moeserve {
namespace {

// The window pages of the blocks these tests take (docs/kv-cache.md, "The window pool"): held
// for the caches' lives (no test here releases blocks).
std::vector<int32_t>* window_holds() {
  static std::vector<int32_t> holds;
  return &holds;
}

using json = nlohmann::json;

constexpr char kDir[] = "tests/data/v4/tiny";
constexpr float kTol = 2e-3f;  // the reference path (issue: within 2e-3 of transformers)

struct Top {
  int32_t id;
  float logprob;
};

std::vector<std::vector<Top>> tops(const json& rows) {
  std::vector<std::vector<Top>> out;
  for (const json& r : rows) {
    std::vector<Top> t;
    for (const json& e : r) t.push_back({e["id"].get<int32_t>(), e["logprob"].get<float>()});
    out.push_back(std::move(t));
  }
  return out;
}

struct Fixture {
  std::vector<int32_t> prompt, tokens;
  std::vector<std::vector<Top>> prompt_top, decode_top;
};

Fixture load_fixture() {
  std::ifstream in(std::string(kDir) + "/expected.json");
  const json j = json::parse(in);
  const json& p = j["prompts"][0];
  Fixture f;
  f.prompt = p["prompt_ids"].get<std::vector<int32_t>>();
  f.tokens = p["tokens"].get<std::vector<int32_t>>();
  f.prompt_top = tops(p["prompt_top_logprobs"]);
  f.decode_top = tops(p["top_logprobs"]);
  return f;
}

std::vector<float> log_softmax(const float* z, int64_t n) {
  float m = *std::max_element(z, z + n);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(double(z[i] - m));
  const float lse = m + float(std::log(sum));
  std::vector<float> out(z, z + n);
  for (float& x : out) x -= lse;
  return out;
}

// The largest |ours - transformers'| over a row's recorded top-5.
float row_error(const std::vector<float>& lp, const std::vector<Top>& top) {
  float e = 0;
  for (const Top& t : top) e = std::max(e, std::fabs(lp[size_t(t.id)] - t.logprob));
  return e;
}

// The discrete choices a model reports (set_v4_choice_observer), in order.
using Choices = std::vector<std::tuple<int64_t, int, std::vector<int64_t>>>;
V4ChoiceObserver record(Choices* out) {
  return [out](int64_t layer, int kind, int64_t, std::span<const int64_t> picked) {
    out->emplace_back(layer, kind, std::vector<int64_t>(picked.begin(), picked.end()));
  };
}

class V4Model : public ::testing::Test {
 protected:
  void open(DType kv_dtype, bool fast = false, bool mtp = false) {
    LoadOptions lo;
    lo.mtp = mtp;
    auto ck = Checkpoint::open(kDir, lo);
    ASSERT_TRUE(ck.ok()) << ck.status().to_string();
    ck_ = std::move(*ck);
    const ModelConfig& c = ck_->config();
    ASSERT_TRUE(c.v4);
    EXPECT_EQ(model_family(c).name, "deepseek_v4");
    ForwardOptions o;
    o.compute = fast ? ComputePath::kFast : ComputePath::kReference;
    ASSERT_TRUE(model_family(c).supports(c, o).ok());
    model_ = make_deepseek_v4(c, ck_->weights(), &pool_, fast);
    cache_ = std::make_unique<KvCache>(v4_kv_layout(c, kv_dtype, false), 16);
    ASSERT_TRUE(cache_->allocate(8, &table_, window_holds()));
  }
  // Runs tokens at start_pos; logits of the last n_logits.
  std::vector<float> run(std::span<const int32_t> tokens, int64_t start_pos, int64_t n_logits) {
    StepSequence s;
    s.tokens = tokens;
    s.start_pos = start_pos;
    s.block_table = table_;
    s.n_logits = n_logits;
    StepOutput out;
    Status st = model_->forward(std::span<const StepSequence>(&s, 1), *cache_, &out);
    EXPECT_TRUE(st.ok()) << st.to_string();
    return out.logits;
  }
  int64_t vocab() const { return ck_->config().vocab_size; }

  ThreadPool pool_{2};
  std::unique_ptr<Checkpoint> ck_;
  std::unique_ptr<CausalLm> model_;
  std::unique_ptr<KvCache> cache_;
  std::vector<int32_t> table_;
};

// The whole prompt in one step: every position's top-5 within 2e-3 of transformers'.
TEST_F(V4Model, EveryPromptPositionMatchesTransformers) {
  open(DType::kF32);
  const Fixture f = load_fixture();
  ASSERT_EQ(f.prompt.size(), 300u);
  const int64_t n = int64_t(f.prompt.size());
  std::vector<float> logits = run(f.prompt, 0, n);
  ASSERT_EQ(int64_t(logits.size()), n * vocab());
  float worst = 0;
  int64_t worst_at = -1;
  for (int64_t t = 0; t < n; ++t) {
    const std::vector<float> lp = log_softmax(&logits[size_t(t * vocab())], vocab());
    const float e = row_error(lp, f.prompt_top[size_t(t)]);
    if (e > worst) worst = e, worst_at = t;
  }
  EXPECT_LT(worst, kTol) << "at position " << worst_at;
  std::printf("V4 prompt (300 positions): max |dlogprob| %.2e at %ld\n", worst, long(worst_at));
}

// The fast path (FP8 projections through gemm_fp8, FP4 experts through gemm_fp4, BF16 matrices
// through gemm_bf16, activations rounded to BF16 on the way in) against transformers, one
// position at a time from the reference path's exact prefix (the reference run's blocks before
// position t's imported, the rest of the prefix run by the reference path: no earlier position
// carries the fast path's rounding), every 5th position. A position where the fast path made
// another discrete choice than the reference path in any layer (a near-tied expert or indexer pick
// that its rounding flipped; this random checkpoint's margins reach 9e-5 / 5e-5) measures that
// flip, not the kernels: left out and counted, at most a quarter. The rest measure 0.075
// (2026-12-07) against the issue's 5e-2: this random checkpoint amplifies the BF16 rounding of the
// GEMMs' inputs (each source alone: the head 0.020, the FP8 projections 0.044, the FP4 experts
// 0.067, the same figure as the reference path with only the experts' inputs rounded to BF16,
// i.e. the rounding, not gemm_fp4; docs/deepseek-v4.md "Fast path"), as V3's random fixtures do
// (hf_reference_test.cpp: 0.08-0.15). Held to twice the measured; a missing term or a wrong
// weight is off by whole units here.
TEST_F(V4Model, FastPathMatchesTransformersFromExactPrefixes) {
  open(DType::kF32);  // the reference model and its full-prompt cache
  const Fixture f = load_fixture();
  const int64_t n = int64_t(f.prompt.size());
  run(f.prompt, 0, 1);
  std::unique_ptr<CausalLm> fast = make_deepseek_v4(ck_->config(), ck_->weights(), &pool_, true);
  Choices fast_choices, ref_choices;
  set_v4_choice_observer(*fast, record(&fast_choices));
  set_v4_choice_observer(*model_, record(&ref_choices));
  // Position t's logits from `m` after the reference path's prefix: the reference run's blocks
  // before t's block, the rest of the prefix run by the reference model.
  auto step_at = [&](CausalLm& m, int64_t t) {
    KvCache c(cache_->layout(), 16);
    std::vector<int32_t> table;
    const int64_t t0 = t / kKvBlockSize * kKvBlockSize;
    for (int64_t b = 0; b < t0 / kKvBlockSize; ++b) {
      EXPECT_TRUE(
          c.import_bytes(cache_->export_block(table_[size_t(b)]).bytes, &table, window_holds()));
    }
    EXPECT_TRUE(c.allocate(1, &table, window_holds()));
    auto forward = [&](CausalLm& model, int64_t from, int64_t count) {
      StepSequence s;
      s.tokens = std::span<const int32_t>(f.prompt).subspan(size_t(from), size_t(count));
      s.start_pos = from;
      s.block_table = table;
      s.n_logits = 1;
      StepOutput out;
      EXPECT_TRUE(model.forward(std::span<const StepSequence>(&s, 1), c, &out).ok());
      return out.logits;
    };
    if (t > t0) {
      set_v4_choice_observer(*model_, nullptr);
      forward(*model_, t0, t - t0);
      set_v4_choice_observer(*model_, record(&ref_choices));
    }
    return forward(m, t, 1);
  };
  float worst = 0;
  int64_t measured = 0, flipped = 0;
  for (int64_t t = 5; t < n; t += 5) {
    fast_choices.clear();
    ref_choices.clear();
    const std::vector<float> logits = step_at(*fast, t);
    step_at(*model_, t);
    if (fast_choices != ref_choices) {
      ++flipped;
      continue;
    }
    ++measured;
    const std::vector<float> lp = log_softmax(logits.data(), vocab());
    worst = std::max(worst, row_error(lp, f.prompt_top[size_t(t)]));
  }
  std::printf(
      "V4 fast path, %ld positions from exact prefixes: max |dlogprob| %.2e, %ld left out "
      "(a choice flipped)\n",
      long(measured), worst, long(flipped));
  EXPECT_LE(flipped * 4, measured + flipped);
  EXPECT_LT(worst, 0.15f);
}

// The fast path's batch and chunking do not change a row's bits: the prompt in one step and in
// chunks (the GEMMs' rows are independent; attention, compressors and indexer are per token).
TEST_F(V4Model, FastPathChunksGiveTheWholePromptsBits) {
  open(DType::kF32, /*fast=*/true);
  const Fixture f = load_fixture();
  const int64_t n = int64_t(f.prompt.size());
  const std::vector<float> whole = run(f.prompt, 0, n);
  open(DType::kF32, /*fast=*/true);
  std::vector<float> chunked;
  int64_t pos = 0;
  for (int64_t len : {37, 91, 5, 1, 166}) {
    const std::vector<float> part =
        run(std::span<const int32_t>(f.prompt).subspan(size_t(pos), size_t(len)), pos, len);
    chunked.insert(chunked.end(), part.begin(), part.end());
    pos += len;
  }
  ASSERT_EQ(pos, n);
  ASSERT_EQ(chunked.size(), whole.size());
  EXPECT_TRUE(std::equal(whole.begin(), whole.end(), chunked.begin()));
}

// DeepSeek's FP4 index keys and queries (a BF16 cache: the Hadamard rotation and model.py's FP4
// rounding, kernels/index_fp4.h) against transformers' F32 ones (an F32 cache), the reference
// path on both over the whole prompt: the rounding moves near-tied picks, not the selection. Of
// the rows whose context exceeds the top-k, the share of the F32 picks the FP4 indexer also picks
// is measured (2026-12-07: 0.872) against what picks at random would share (0.273); with the
// queries left unrotated it is 0.285, chance.
TEST_F(V4Model, Fp4IndexKeysPickWhatF32KeysPick) {
  const Fixture f = load_fixture();
  const int64_t n = int64_t(f.prompt.size());
  std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>> picks[2];
  for (int i = 0; i < 2; ++i) {
    open(i == 0 ? DType::kF32 : DType::kBF16);
    set_v4_choice_observer(
        *model_, [&, i](int64_t layer, int kind, int64_t row, std::span<const int64_t> picked) {
          if (kind == 1) picks[i][{layer, row}].assign(picked.begin(), picked.end());
        });
    run(f.prompt, 0, 1);
  }
  const int64_t topk = ck_->config().indexer->topk;
  double shared = 0, chance = 0;
  int64_t rows = 0;
  for (const auto& [key, a] : picks[0]) {
    if (int64_t(a.size()) < topk) continue;  // the context fits: every entry is attended
    const std::vector<int64_t>& b = picks[1].at(key);
    ASSERT_EQ(b.size(), a.size());
    std::vector<int64_t> both;
    std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
    shared += double(both.size()) / double(topk);
    chance += double(topk) / double((key.second + 1) / 4);
    ++rows;
  }
  ASSERT_GT(rows, 50);
  std::printf(
      "V4 FP4 indexer over %ld rows of %ld positions: shares %.3f of the F32 picks "
      "(chance %.3f)\n",
      long(rows), long(n), shared / double(rows), chance / double(rows));
  EXPECT_GT(shared / double(rows), 0.8);
}

// The prompt in chunks that end inside windows, 4-token groups and a 128-token group and cross
// block boundaries, then 12 greedy steps: the compressors resume from the blocks' state
// records, and the tokens and top-5 equal transformers' decode with its cache.
TEST_F(V4Model, ChunkedPrefillAndDecodeMatchTransformers) {
  open(DType::kF32);
  const Fixture f = load_fixture();
  std::vector<int32_t> seq = f.prompt;
  int64_t pos = 0;
  std::vector<float> last;
  for (int64_t chunk : {37, 91, 1, 99, 72}) {  // to 37, 128, 129, 228, 300
    last = run(std::span<const int32_t>(seq).subspan(size_t(pos), size_t(chunk)), pos, 1);
    pos += chunk;
  }
  ASSERT_EQ(pos, int64_t(f.prompt.size()));
  float worst = 0;
  for (size_t step = 0; step < f.tokens.size(); ++step) {
    const std::vector<float> lp = log_softmax(last.data(), vocab());
    const int32_t greedy = int32_t(std::max_element(lp.begin(), lp.end()) - lp.begin());
    ASSERT_EQ(greedy, f.tokens[step]) << "step " << step;
    worst = std::max(worst, row_error(lp, f.decode_top[step]));
    seq.push_back(greedy);
    last = run(std::span<const int32_t>(seq).subspan(size_t(pos), 1), pos, 1);
    ++pos;
  }
  EXPECT_LT(worst, kTol);
  std::printf("V4 chunked prefill + 12 decode steps: max |dlogprob| %.2e\n", worst);
}

// A block is all a later step needs: the prompt's first 256 positions (4 blocks, ending inside
// a 128-token group's successor and inside windows) exported from one cache and imported into
// another, the rest of the prompt run there gives the bits of the whole prompt run at once (the
// compressors resume from the imported blocks' state records: what a prefix hit, the disk tier
// and a PD hand-off move).
TEST_F(V4Model, ImportedBlocksResumeToTheSameBits) {
  open(DType::kBF16);
  const Fixture f = load_fixture();
  const int64_t n = int64_t(f.prompt.size()), cut = 4 * kKvBlockSize;
  const std::vector<float> whole = run(f.prompt, 0, n - cut);
  run(std::span<const int32_t>(f.prompt).first(size_t(cut)), 0, 1);
  KvCache other(cache_->layout(), 16);
  std::vector<int32_t> table;
  for (int64_t b = 0; b < cut / kKvBlockSize; ++b) {
    ASSERT_TRUE(
        other.import_bytes(cache_->export_block(table_[size_t(b)]).bytes, &table, window_holds()));
  }
  ASSERT_TRUE(other.allocate(4, &table, window_holds()));
  StepSequence s;
  s.tokens = std::span<const int32_t>(f.prompt).subspan(size_t(cut));
  s.start_pos = cut;
  s.block_table = table;
  s.n_logits = n - cut;
  StepOutput out;
  ASSERT_TRUE(model_->forward(std::span<const StepSequence>(&s, 1), other, &out).ok());
  ASSERT_EQ(out.logits.size(), whole.size());
  EXPECT_TRUE(std::equal(whole.begin(), whole.end(), out.logits.begin()));
}

// Speculative decoding's verify steps (the last token and three drafts in one step) with some
// drafts rejected: the next step resumes the compressors from the state after the last accepted
// position (the step's snapshots), not after the last draft that the block's record holds. From
// position 250, through a 4-token group boundary at every step, the 256-token 128-group and the
// block boundaries at 256 and 320, accepting 0 to 3 drafts in turn: every accepted row's logits
// have the bits of one-token decode steps, on both paths (the MTP module loaded: only then are
// there drafts, and snapshots kept). Without the module, a step that starts before its record's
// position is an error naming the position, not a wrong state.
TEST_F(V4Model, RejectedDraftsRollTheCompressorsBack) {
  const Fixture f = load_fixture();
  constexpr int64_t kStart = 250, kSteps = 90;
  for (bool fast : {false, true}) {
    open(DType::kBF16, fast);
    std::vector<int32_t> seq(f.prompt.begin(), f.prompt.begin() + kStart);
    std::vector<float> last = run(seq, 0, 1);
    std::vector<std::vector<float>> plain;  // logits after each generated position
    for (int64_t k = 0; k < kSteps; ++k) {
      const std::vector<float> lp = log_softmax(last.data(), vocab());
      seq.push_back(int32_t(std::max_element(lp.begin(), lp.end()) - lp.begin()));
      last = run(std::span<const int32_t>(seq).subspan(seq.size() - 1), int64_t(seq.size()) - 1, 1);
      plain.push_back(last);
    }
    open(DType::kBF16, fast, /*mtp=*/true);
    run(std::span<const int32_t>(seq).first(kStart), 0, 1);
    int64_t k = 0, verified = 0, rejected = 0;
    for (int64_t step = 0; k + 4 <= kSteps; ++step) {
      const int64_t accept = step % 4;  // drafts accepted this step: 0, 1, 2, 3, 0, ...
      std::vector<int32_t> rows(seq.begin() + kStart + k, seq.begin() + kStart + k + 4);
      if (accept < 3) rows[size_t(accept + 1)] = (rows[size_t(accept + 1)] + 1) % int32_t(vocab());
      const std::vector<float> got = run(rows, kStart + k, 4);
      for (int64_t r = 0; r <= accept; ++r) {
        const std::vector<float>& want = plain[size_t(k + r)];
        ASSERT_TRUE(std::equal(want.begin(), want.end(), got.begin() + r * vocab()))
            << (fast ? "fast" : "reference") << " path, position " << kStart + k + r << " (step "
            << step << ", row " << r << ")";
        ++verified;
      }
      rejected += accept < 3;
      k += accept + 1;
    }
    EXPECT_GT(rejected, 15);
    EXPECT_GT(verified, 60);
  }
  open(DType::kBF16, true);
  run(std::span<const int32_t>(f.prompt).first(kStart + 4), 0, 1);
  StepSequence early{std::span<const int32_t>(f.prompt).subspan(kStart + 1, 1), kStart + 1, table_,
                     1};
  StepOutput out;
  const Status st = model_->forward({&early, 1}, *cache_, &out);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("position 250 is gone"), std::string::npos) << st.message();
}

// The MTP module against DeepSeek's own inference/model.py (MTPBlock; transformers leaves the
// module out), tools/gen_v4_mtp_fixture.py with model.py's quantization simulation off: the main
// model's streams at every prompt position, then the module over rows 0..199 in one step (row p
// carries token t_{p+1} and the streams at p) and one row at a time to position 298; each row's
// top-5 log-probabilities of t_{p+2}. The reference path within 2e-3 (1.3e-5 measured). The fast
// path's module from the reference path's streams (as the fast path is judged from exact
// prefixes above: this random checkpoint's streams part by whole units once a choice flips in an
// earlier position), a step where the module routed a row to other experts than the reference
// path left out and counted: 0.037 measured, held to the fast path's bound (above).
TEST(V4Mtp, ModuleMatchesDeepSeeksModelPy) {
  std::ifstream in(std::string(kDir) + "/mtp_expected.json");
  ASSERT_TRUE(in.good()) << "mtp_expected.json (tools/gen_v4_mtp_fixture.py)";
  const json fx = json::parse(in);
  const Fixture f = load_fixture();
  const int64_t n = int64_t(f.prompt.size()), prefill = fx["prefill_rows"].get<int64_t>();
  LoadOptions lo;
  lo.mtp = true;
  auto ck = Checkpoint::open(kDir, lo);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  const ModelConfig& c = (*ck)->config();
  ThreadPool pool(2);
  std::unique_ptr<CausalLm> ref = make_deepseek_v4(c, (*ck)->weights(), &pool, false);
  std::unique_ptr<CausalLm> fast = make_deepseek_v4(c, (*ck)->weights(), &pool, true);
  ASSERT_TRUE(ref->has_mtp());
  ASSERT_EQ(ref->num_layers(), c.num_hidden_layers + 1);
  const int64_t W = ref->hidden_width();
  ASSERT_EQ(W, c.v4->hc_mult * c.hidden_size);
  const int32_t blocks = int32_t((n + kKvBlockSize - 1) / kKvBlockSize);
  KvCache kv_ref(v4_kv_layout(c, DType::kF32, /*mtp=*/true), blocks);
  KvCache kv_fast(v4_kv_layout(c, DType::kF32, /*mtp=*/true), blocks);
  std::vector<int32_t> table, table_fast;
  ASSERT_TRUE(kv_ref.allocate(blocks, &table, window_holds()));
  ASSERT_TRUE(kv_fast.allocate(blocks, &table_fast, window_holds()));
  StepSequence s{f.prompt, 0, table, 1};
  s.n_hidden = n;
  StepOutput main;
  ASSERT_TRUE(ref->forward({&s, 1}, kv_ref, &main).ok());
  ASSERT_EQ(int64_t(main.hidden.size()), n * W);
  Choices ref_choices, fast_choices;
  set_v4_choice_observer(*ref, record(&ref_choices));
  set_v4_choice_observer(*fast, record(&fast_choices));
  float worst_ref = 0, worst_fast = 0;
  int64_t rows = 0, flipped = 0;
  // One module step of both paths over positions [pos, pos + tokens), the streams from pos.
  auto step = [&](std::span<const int32_t> tokens, int64_t pos, const json& want) {
    ASSERT_EQ(want["position"].get<int64_t>(), pos + int64_t(tokens.size()) - 1);
    std::vector<Top> top;
    for (const json& e : want["top"])
      top.push_back({e["id"].get<int32_t>(), e["logprob"].get<float>()});
    StepSequence one{tokens, pos, table, 1}, one_fast{tokens, pos, table_fast, 1};
    StepOutput a, b;
    ref_choices.clear();
    fast_choices.clear();
    ASSERT_TRUE(ref->forward_mtp({&one, 1}, &main.hidden[size_t(pos * W)], kv_ref, &a).ok());
    ASSERT_TRUE(fast->forward_mtp({&one_fast, 1}, &main.hidden[size_t(pos * W)], kv_fast, &b).ok());
    ASSERT_EQ(ref_choices.size(), tokens.size());  // the module's layer routes each row
    ++rows;
    worst_ref = std::max(worst_ref, row_error(log_softmax(a.logits.data(), c.vocab_size), top));
    if (fast_choices != ref_choices) {
      ++flipped;
      return;
    }
    worst_fast = std::max(worst_fast, row_error(log_softmax(b.logits.data(), c.vocab_size), top));
  };
  const std::span<const int32_t> ids(f.prompt);
  step(ids.subspan(1, size_t(prefill)), 0, fx["rows"][0]);
  for (int64_t p = prefill; p + 1 < n; ++p) {
    step(ids.subspan(size_t(p + 1), 1), p, fx["rows"][size_t(p - prefill + 1)]);
  }
  ASSERT_EQ(size_t(rows), fx["rows"].size());
  std::printf(
      "V4 MTP module, %ld steps against model.py: reference max |dlogprob| %.2e, fast %.2e (%ld "
      "left out: a routing choice flipped)\n",
      long(rows), worst_ref, worst_fast, long(flipped));
  EXPECT_LT(worst_ref, kTol);
  EXPECT_LT(worst_fast, 0.15f);
  EXPECT_LE(flipped * 4, rows);
}

// The trained tiny V4 as the build lays it out, and transformers' outputs on it.
void open_trained_v4(json* fx, std::unique_ptr<Checkpoint>* ck) {
  std::ifstream in("tests/data/v4/tiny-v4/expected.json");
  ASSERT_TRUE(in.good()) << "tests/data/v4/tiny-v4/expected.json";
  *fx = json::parse(in);
  auto opened = Checkpoint::open(std::string(MOESERVE_MODELS_DIR) + "/tiny-v4");
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  *ck = std::move(*opened);
}

// A fixture prompt in one step into kv's blocks (allocated into table): every position's error
// against the recorded top-5 appended to errs; the logits returned.
std::vector<float> prompt_step(CausalLm& m, const ModelConfig& c, const json& p, KvCache& kv,
                               std::vector<int32_t>& table, std::vector<float>* errs) {
  const std::vector<int32_t> prompt = p["prompt_ids"].get<std::vector<int32_t>>();
  const auto prompt_top = tops(p["prompt_top_logprobs"]);
  const int64_t n = int64_t(prompt.size());
  EXPECT_TRUE(kv.allocate(8, &table, window_holds()));
  StepSequence s{prompt, 0, table, n};
  StepOutput out;
  EXPECT_TRUE(m.forward({&s, 1}, kv, &out).ok());
  if (out.logits.size() != size_t(n * c.vocab_size)) return {};
  for (int64_t i = 0; i < n; ++i) {
    errs->push_back(row_error(log_softmax(&out.logits[size_t(i * c.vocab_size)], c.vocab_size),
                              prompt_top[size_t(i)]));
  }
  return std::move(out.logits);
}

// The trained tiny V4 (assets/models/tiny-v4, tools/train_tiny_v4.py) against transformers'
// deepseek_v4 on it (tools/gen_v4_trained_fixture.py): three 300-token prompts cut from held-out
// files, the top-5 at every prompt position (one step), then 40 steps teacher-forced on
// transformers' greedy tokens. The reference path (F32 cache, F32 index keys): every row within
// 2e-3 (3.9e-4 measured, 2026-12-07). The fast path as served: greedy tokens transformers'
// wherever transformers' top-2 gap exceeds 0.1, and the median row within 4e-2. Measured
// (median / p99 / max over the 1,020 rows): F32 cache 3.7e-3 / 2.0e-2 / 0.33, BF16 cache with
// DeepSeek's FP4 index keys 8.9e-3 / 0.21 / 0.53, FP8 cache 1.9e-2 / 0.22 / 0.71. The tails are
// discrete choices (the indexer's picks, the router's) that rounding moved, and their effect on
// the positions after them (FastPathFromExactPrefixes below takes them apart); this model's
// indexer is untrained (its picks are its initial weights', near-tied, and not trained for FP4
// as DeepSeek's are).
TEST(V4Trained, PathsMatchTransformers) {
  json fx;
  std::unique_ptr<Checkpoint> ck;
  ASSERT_NO_FATAL_FAILURE(open_trained_v4(&fx, &ck));
  const ModelConfig& c = ck->config();
  ThreadPool pool(2);
  struct Case {
    bool fast;
    DType kv;
    const char* name;
  };
  for (const Case& k : {Case{false, DType::kF32, "reference, F32 cache"},
                        Case{true, DType::kF32, "fast, F32 cache"},
                        Case{true, DType::kBF16, "fast, BF16 cache + FP4 index keys"},
                        Case{true, DType::kF8E4M3, "fast, FP8 cache + FP4 index keys"}}) {
    std::unique_ptr<CausalLm> m = make_deepseek_v4(c, ck->weights(), &pool, k.fast);
    std::vector<float> errs;
    int64_t greedy_checked = 0;
    for (const json& p : fx["prompts"]) {
      const std::vector<int32_t> tokens = p["tokens"].get<std::vector<int32_t>>();
      const auto decode_top = tops(p["top_logprobs"]);
      const int64_t n = int64_t(p["prompt_ids"].size());
      KvCache kv(v4_kv_layout(c, k.kv, false), 8);
      std::vector<int32_t> table;
      StepOutput out;
      out.logits = prompt_step(*m, c, p, kv, table, &errs);
      ASSERT_FALSE(out.logits.empty());
      std::vector<float> last(out.logits.end() - c.vocab_size, out.logits.end());
      for (size_t step = 0; step < tokens.size(); ++step) {
        const std::vector<float> lp = log_softmax(last.data(), c.vocab_size);
        errs.push_back(row_error(lp, decode_top[step]));
        const std::vector<Top>& t = decode_top[step];
        if (t[0].logprob - t[1].logprob > 0.1f) {  // no near-tie: the same greedy token
          EXPECT_EQ(int32_t(std::max_element(lp.begin(), lp.end()) - lp.begin()), tokens[step])
              << k.name << ", " << p["file"].get<std::string>() << ", step " << step;
          ++greedy_checked;
        }
        StepSequence one{std::span<const int32_t>(&tokens[step], 1), n + int64_t(step), table, 1};
        ASSERT_TRUE(m->forward({&one, 1}, kv, &out).ok());
        last = out.logits;
      }
    }
    std::sort(errs.begin(), errs.end());
    const float median = errs[errs.size() / 2], p99 = errs[errs.size() * 99 / 100];
    std::printf(
        "V4 trained, %s: |dlogprob| median %.2e, p99 %.2e, max %.2e (%zu rows, %ld greedy "
        "tokens)\n",
        k.name, median, p99, errs.back(), errs.size(), long(greedy_checked));
    if (!k.fast) {
      EXPECT_LT(errs.back(), kTol);
    } else {
      EXPECT_LT(median, 4e-2f) << k.name;
    }
    EXPECT_GT(greedy_checked, 60) << k.name;
  }
}

// The fast path's own error on trained weights: at every 10th position of the trained fixture's
// prompts, from the reference path's exact prefix (F32 cache: transformers' index arithmetic), the
// fast path's top-5 against transformers', a position where the fast path made another discrete
// choice than the reference path (an indexer pick or a routed expert) left out and counted:
// 84 positions within 1.9e-2 (the issue's 5e-2), 3 left out (2026-12-07).
TEST(V4Trained, FastPathFromExactPrefixes) {
  json fx;
  std::unique_ptr<Checkpoint> ck;
  ASSERT_NO_FATAL_FAILURE(open_trained_v4(&fx, &ck));
  const ModelConfig& c = ck->config();
  ThreadPool pool(2);
  std::unique_ptr<CausalLm> ref = make_deepseek_v4(c, ck->weights(), &pool, false);
  std::unique_ptr<CausalLm> fast = make_deepseek_v4(c, ck->weights(), &pool, true);
  Choices ref_choices, fast_choices;
  float worst = 0;
  int64_t measured = 0, flipped = 0;
  for (const json& p : fx["prompts"]) {
    const std::vector<int32_t> prompt = p["prompt_ids"].get<std::vector<int32_t>>();
    const auto prompt_top = tops(p["prompt_top_logprobs"]);
    const int64_t n = int64_t(prompt.size());
    auto run = [&](CausalLm& m, KvCache& kv, std::span<const int32_t> table, int64_t from,
                   int64_t count) {
      StepSequence s{std::span<const int32_t>(prompt).subspan(size_t(from), size_t(count)), from,
                     table, 1};
      StepOutput out;
      EXPECT_TRUE(m.forward({&s, 1}, kv, &out).ok());
      return out.logits;
    };
    for (int64_t t = 10; t < n; t += 10) {
      KvCache kv(v4_kv_layout(c, DType::kF32, false), 8);
      std::vector<int32_t> table;
      ASSERT_TRUE(kv.allocate(8, &table, window_holds()));
      set_v4_choice_observer(*ref, nullptr);
      run(*ref, kv, table, 0, t);   // the exact prefix
      KvCache kv2(kv.layout(), 8);  // the same blocks, for the reference step at t
      std::vector<int32_t> table2;
      for (int64_t b = 0; b <= (t - 1) / kKvBlockSize; ++b) {
        ASSERT_TRUE(
            kv2.import_bytes(kv.export_block(table[size_t(b)]).bytes, &table2, window_holds()));
      }
      ASSERT_TRUE(kv2.allocate(int32_t(8 - table2.size()), &table2, window_holds()));
      ref_choices.clear();
      fast_choices.clear();
      set_v4_choice_observer(*ref, record(&ref_choices));
      set_v4_choice_observer(*fast, record(&fast_choices));
      const std::vector<float> logits = run(*fast, kv, table, t, 1);
      run(*ref, kv2, table2, t, 1);
      set_v4_choice_observer(*fast, nullptr);
      if (fast_choices != ref_choices) {
        ++flipped;
        continue;
      }
      ++measured;
      worst = std::max(worst,
                       row_error(log_softmax(logits.data(), c.vocab_size), prompt_top[size_t(t)]));
    }
  }
  std::printf(
      "V4 trained, fast path from exact prefixes: %ld positions, max |dlogprob| %.2e, %ld "
      "left out (a choice flipped)\n",
      long(measured), worst, long(flipped));
  EXPECT_LT(worst, 5e-2f);
  EXPECT_LE(flipped * 4, measured + flipped);
}

// The requantizing options on V4 (docs/deepseek-v4.md "Requantized weights"): the trained tiny
// V4's three fixture prompts in one step each (F32 cache), every position's top-5 against
// transformers', beside the fast path as published (FP8 projections, FP4 experts, BF16 head).
// Each option changes the logits (it took effect) and keeps the median row within twice its
// measured error. Measured (median / p99 / max, 2026-12-07): as published 3.6e-3 / 1.7e-2 /
// 0.33; --lm-head-dtype int8 1.5e-2 / 3.8e-2 / 0.33; --projection-dtype int8 1.4e-2 / 0.12 /
// 0.51; --expert-dtype int8 2.2e-2 / 0.14 / 0.65; all three int8 2.8e-2 / 0.16 / 0.47;
// --expert-dtype int4 0.10 / 0.43 / 0.91; all three int4 0.22 / 0.65 / 1.0. (INT8 and INT4
// hold one scale per 128 inputs of a row where FP4 holds one per 32: a block's small groups lose
// their precision.)
TEST(V4Trained, RequantizedWeightsStayNearThePublishedFormats) {
  json fx;
  std::unique_ptr<Checkpoint> ck;
  ASSERT_NO_FATAL_FAILURE(open_trained_v4(&fx, &ck));
  const ModelConfig& c = ck->config();
  ThreadPool pool(2);
  struct Case {
    const char* name;
    WeightFormats formats;
    float median_bound;
  };
  WeightFormats int8_all{WeightFormat::kInt8, HeadFormat::kInt8, WeightFormat::kInt8};
  WeightFormats int4_all{WeightFormat::kInt4, HeadFormat::kInt4, WeightFormat::kInt4};
  const std::vector<Case> cases = {
      {"as published", {}, 0},
      {"--lm-head-dtype int8", {WeightFormat::kFp8, HeadFormat::kInt8, std::nullopt}, 3e-2f},
      {"--projection-dtype int8", {WeightFormat::kInt8, HeadFormat::kBf16, std::nullopt}, 3e-2f},
      {"--expert-dtype int8",
       {WeightFormat::kFp8, HeadFormat::kBf16, WeightFormat::kInt8},
       4.5e-2f},
      {"all three int8", int8_all, 6e-2f},
      {"--expert-dtype int4", {WeightFormat::kFp8, HeadFormat::kBf16, WeightFormat::kInt4}, 0.21f},
      {"all three int4", int4_all, 0.45f}};
  std::vector<float> plain;
  for (const Case& k : cases) {
    std::unique_ptr<CausalLm> m =
        make_deepseek_v4(c, ck->weights(), &pool, true, {}, nullptr, k.formats);
    std::vector<float> errs, all_logits;
    for (const json& p : fx["prompts"]) {
      KvCache kv(v4_kv_layout(c, DType::kF32, false), 8);
      std::vector<int32_t> table;
      const std::vector<float> logits = prompt_step(*m, c, p, kv, table, &errs);
      ASSERT_FALSE(logits.empty());
      all_logits.insert(all_logits.end(), logits.begin(), logits.end());
    }
    std::sort(errs.begin(), errs.end());
    const float median = errs[errs.size() / 2], p99 = errs[errs.size() * 99 / 100];
    std::printf("V4 trained, fast path, %s: |dlogprob| median %.2e, p99 %.2e, max %.2e\n", k.name,
                median, p99, errs.back());
    if (plain.empty()) {
      plain = all_logits;
      continue;
    }
    EXPECT_NE(all_logits, plain) << k.name << " left the logits as they were";
    EXPECT_LT(median, k.median_bound) << k.name;
  }
}

// DeepSeek-V4-Flash's config.json as DeepSeek publishes it parses, and its KV layout stores the
// bytes per token docs/deepseek-v4.md works out (BF16: every position's 512-value window entry in
// all 43 layers, the compressed entries and FP4 index keys of the 21 compressed sparse and 20
// heavily compressed layers, and a state record per block).
TEST(V4Config, FlashParsesAndItsKvBytesAreTheDocumentedOnes) {
  std::string ratios = "[0, 0";
  for (int i = 0; i < 20; ++i) ratios += ", 4, 128";
  ratios += ", 4, 0]";
  const std::string text =
      R"({"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
    "vocab_size": 129280, "hidden_size": 4096, "num_hidden_layers": 43, "num_attention_heads": 64,
    "num_key_value_heads": 1, "head_dim": 512, "qk_rope_head_dim": 64, "q_lora_rank": 1024,
    "o_groups": 8, "o_lora_rank": 1024, "sliding_window": 128, "compress_ratios": )" +
      ratios + R"(, "compress_rope_theta": 160000, "rope_theta": 10000,
    "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                     "beta_fast": 32, "beta_slow": 1},
    "index_n_heads": 64, "index_head_dim": 128, "index_topk": 512, "hc_mult": 4,
    "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-6, "n_routed_experts": 256,
    "num_experts_per_tok": 6, "n_shared_experts": 1, "moe_intermediate_size": 2048,
    "scoring_func": "sqrtsoftplus", "norm_topk_prob": true, "routed_scaling_factor": 1.5,
    "topk_method": "noaux_tc", "num_hash_layers": 3, "swiglu_limit": 10.0,
    "num_nextn_predict_layers": 1, "max_position_embeddings": 1048576, "expert_dtype": "fp4",
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                            "weight_block_size": [128, 128], "activation_scheme": "dynamic"}})";
  auto c = parse_model_config(text, "flash/config.json");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  int csa = 0, hca = 0;
  for (int64_t l = 0; l < c->num_hidden_layers; ++l) {
    csa += c->v4->ratio(l) == 4;
    hca += c->v4->ratio(l) == 128;
  }
  EXPECT_EQ(csa, 21);
  EXPECT_EQ(hca, 20);
  EXPECT_EQ(c->v4->ratio(43), 0);  // the MTP layer
  const KvLayout layout = v4_kv_layout(*c, DType::kBF16, false);
  ASSERT_TRUE(kv_layout_status(layout).ok());
  // Per token: 43 x 1,024 (window entries) + 21 x (256 + 68 / 4 + 15,360 / 64) + 20 x (1,024 /
  // 64 + 6,144 / 64): a 128-token entry has a slot in each of its two blocks, used in the second;
  // an FP4 index key is 64 bytes of e2m1 pairs and 4 exponent bytes per 4 tokens; and per block
  // each state record's 8 bytes saying where in the block its position lies.
  EXPECT_EQ(layout.block_bytes(),
            size_t(64 * (43 * 1024 + 21 * (256 + 17 + 240) + 20 * (16 + 96)) + 41 * 8));
  // The main region, what a long context costs per token once the window pool holds the window
  // entries and state records (docs/kv-cache.md, "The window pool"): 6,053 bytes a token.
  EXPECT_EQ(layout.main_bytes(), size_t(64 * (21 * (256 + 17) + 20 * 16)));
  EXPECT_EQ(layout.window_bytes(), size_t(43 * 64 * 1024 + 21 * 15368 + 20 * 6152));
  EXPECT_EQ(v4_kv_layout(*c, DType::kF8E4M3, false).main_bytes(),
            size_t(21 * (16 * 583 + 16 * 68) + 20 * 583));  // 3,600 bytes a token
  // FP8 (model.py's rounding): 583-byte entries (448 e4m3 values, 7 UE8M0 scales, 64 BF16 RoPE
  // values); 35,634 bytes per token.
  EXPECT_EQ(v4_kv_layout(*c, DType::kF8E4M3, false).block_bytes(),
            size_t(43 * 64 * 583 + 21 * (16 * 583 + 16 * 68 + 15360 + 8) + 20 * (583 + 6144 + 8)));
  // The F32 cache (the reference format) keeps F32 index keys: 512 bytes per 4 tokens.
  EXPECT_EQ(v4_kv_layout(*c, DType::kF32, false).block_bytes(),
            size_t(64 * (43 * 2048 + 21 * (512 + 128 + 240) + 20 * (32 + 96)) + 41 * 8));

  // A ratio V4 does not have is refused by name.
  std::string bad = text;
  bad.replace(bad.find("[0, 0"), 5, "[0, 16");
  auto b = parse_model_config(bad, "flash/config.json");
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("compress_ratios"), std::string::npos)
      << b.status().message();
}

// make-model's V4 presets are configs DeepSeek's format expresses: they read back to themselves
// through config.json, with every layer kind and the MTP layer's ratio.
TEST(V4Config, MakeModelPresetsRoundTripThroughConfigJson) {
  for (const char* preset : {"v4-tiny", "v4-flash-bench"}) {
    MakeModelOptions mo;
    mo.preset = preset;
    auto c = make_model_config(mo);
    ASSERT_TRUE(c.ok()) << preset << ": " << c.status().to_string();
    ASSERT_TRUE(c->v4 && c->quant && c->quant->ue8m0 && c->v4->fp4_experts) << preset;
    auto back = parse_model_config(model_config_to_json(*c), "config.json");
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    EXPECT_EQ(model_config_to_json(*back), model_config_to_json(*c)) << preset;
    EXPECT_EQ(back->v4->compress_ratios, c->v4->compress_ratios);
    EXPECT_EQ(int64_t(back->v4->compress_ratios.size()), back->num_hidden_layers + 1);
  }
}

}  // namespace
}  // namespace moeserve

namespace moeserve {
namespace {

// A million tokens of context (issue 48: "test the bound with a tiny model at the full context
// length"): make-model's v4-tiny (max_position_embeddings 1,048,576, as V4's) cut to one heavily
// compressed and one compressed sparse layer, its KV cache holding all 16,384 blocks of the
// context (each a copy of a block the model wrote) with a window pool of 5 pages: only the
// blocks the last position's sliding window reads keep their window entries, as a sequence
// that got there would (docs/kv-cache.md, "The window pool"). At the last block the
// reference and the fast path both run the block's first position over all 262,128 indexer keys
// and 8,191 compressed entries, with the same choices and logprobs within the fast path's bound;
// the fast path then runs the block to the last position, 1,048,575; and the engine takes a
// prompt that ends there and refuses one a token longer.
TEST(V4LongContext, RunsAtTheLastOfAMillionPositions) {
  const std::string dir = (std::filesystem::path(::testing::TempDir()) /
                           ("moeserve_v4_1m_" + std::to_string(::getpid())))
                              .string();
  MakeModelOptions mo;
  mo.preset = "v4-tiny";
  mo.overrides = {"num_hidden_layers=2", "num_hash_layers=1", "compress_ratios=[128,4,0]",
                  "head_dim=64", "qk_rope_head_dim=32"};
  ThreadPool pool(2);
  Result<uint64_t> made = make_model(mo, dir, &pool);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  auto ck = Checkpoint::open(dir);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  const ModelConfig& c = (*ck)->config();
  constexpr int64_t kMillion = 1048576;
  ASSERT_EQ(c.max_position_embeddings, kMillion);
  const int64_t last_block = kMillion / kKvBlockSize - 1;
  const KvLayout layout = v4_kv_layout(c, DType::kBF16, false);
  KvCache cache(layout, int32_t(last_block + 3), 0, /*window_pages=*/5);
  ASSERT_EQ(cache.window_blocks(), 2);
  std::unique_ptr<CausalLm> ref = make_deepseek_v4(c, (*ck)->weights(), &pool, false);
  std::unique_ptr<CausalLm> fast = make_deepseek_v4(c, (*ck)->weights(), &pool, true);
  std::vector<int32_t> ids(static_cast<size_t>(kKvBlockSize));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(100 + 37 * i);
  auto forward = [&](CausalLm& m, std::span<const int32_t> tokens, int64_t pos,
                     std::vector<int32_t>& table) {
    StepSequence s{tokens, pos, table, 1};
    StepOutput out;
    EXPECT_TRUE(m.forward({&s, 1}, cache, &out).ok());
    return out.logits;
  };
  std::vector<int32_t> seed;
  ASSERT_TRUE(cache.allocate(1, &seed, window_holds()));
  forward(*ref, ids, 0, seed);
  std::vector<int32_t> table;
  const std::vector<uint8_t> seed_bytes = cache.export_block(seed[0]).bytes;
  for (int64_t b = 0; b < last_block; ++b) {
    ASSERT_TRUE(cache.import_bytes(seed_bytes, &table, window_holds(), b >= last_block - 2)) << b;
  }
  // Per block the main region (compressed entries, index keys, states: 8,656 bytes here) and
  // for 5 blocks the window region (16,384 bytes): every block's window kept would be 0.27 GB
  // more.
  EXPECT_EQ(cache.num_windows_available(), 5 - 3);
  EXPECT_GT(layout.window_bytes(), layout.main_bytes());
  std::vector<int32_t> ref_table = table, fast_table = table;
  ASSERT_TRUE(cache.allocate(1, &ref_table, window_holds()));
  ASSERT_TRUE(cache.allocate(1, &fast_table, window_holds()));
  Choices ref_choices, fast_choices;
  set_v4_choice_observer(*ref, record(&ref_choices));
  set_v4_choice_observer(*fast, record(&fast_choices));
  const int64_t p0 = last_block * kKvBlockSize;  // 1,048,512
  const std::span<const int32_t> first(ids.data(), 1);
  const std::vector<float> a = forward(*ref, first, p0, ref_table);
  const std::vector<float> b = forward(*fast, first, p0, fast_table);
  // The CSA layer's indexer pick and its top-k routing (the HCA layer routes by hash).
  ASSERT_EQ(ref_choices.size(), 2u);
  EXPECT_EQ(std::get<1>(ref_choices[0]), 1);
  EXPECT_EQ(std::get<2>(ref_choices[0]).size(), size_t(c.indexer->topk));
  EXPECT_EQ(fast_choices, ref_choices);
  const std::vector<float> la = log_softmax(a.data(), c.vocab_size);
  const std::vector<float> lb = log_softmax(b.data(), c.vocab_size);
  float worst = 0;
  for (int64_t v = 0; v < c.vocab_size; ++v) {
    ASSERT_TRUE(std::isfinite(la[size_t(v)]) && std::isfinite(lb[size_t(v)])) << v;
    worst = std::max(worst, std::fabs(la[size_t(v)] - lb[size_t(v)]));
  }
  EXPECT_LT(worst, 0.15f);  // the fast path's bound on random weights (above)
  std::printf("V4 at position %ld: fast vs reference max |dlogprob| %.2e\n", long(p0), worst);
  // The rest of the block, to the last position.
  const std::vector<float> z =
      forward(*fast, std::span<const int32_t>(ids).subspan(1), p0 + 1, fast_table);
  ASSERT_EQ(int64_t(z.size()), c.vocab_size);
  EXPECT_TRUE(std::all_of(z.begin(), z.end(), [](float v) { return std::isfinite(v); }));
  // The engine's bound: prompt + max_tokens up to the model's 1,048,576 positions.
  std::vector<int32_t> prompt(size_t(kMillion - 1), 5);
  EXPECT_TRUE(validate_prompt(c, prompt, 1, c.max_position_embeddings).ok());
  prompt.push_back(5);
  EXPECT_FALSE(validate_prompt(c, prompt, 1, c.max_position_embeddings).ok());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace moeserve

namespace moeserve {
namespace {

// The fast path's packed matrices through the weight cache (docs/memory.md): the first model
// writes the file, the next maps its FP8 projections, FP4 experts and BF16 head from it, and both
// give the bits of a model without a cache; a damaged file is prepared again, to the same bits.
// Each set of formats (the published ones; INT8 projections and experts with an INT4 head,
// docs/deepseek-v4.md "Requantized weights") in a file of its own.
class V4WeightCache : public ::testing::TestWithParam<bool> {};

TEST_P(V4WeightCache, MappedMatricesGiveTheSameBits) {
  const WeightFormats formats =
      GetParam() ? WeightFormats{WeightFormat::kInt8, HeadFormat::kInt4, WeightFormat::kInt8}
                 : WeightFormats{};
  auto ck = Checkpoint::open(kDir);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  const ModelConfig& c = (*ck)->config();
  const Fixture f = load_fixture();
  const std::vector<int32_t> prompt(f.prompt.begin(), f.prompt.begin() + 100);
  ThreadPool pool(2);
  auto logits = [&](const WeightCacheOptions& cache) {
    std::unique_ptr<CausalLm> m =
        make_deepseek_v4(c, (*ck)->weights(), &pool, true, cache, nullptr, formats);
    KvCache kv(v4_kv_layout(c, DType::kF32, false), 4);
    std::vector<int32_t> table;
    EXPECT_TRUE(kv.allocate(2, &table, window_holds()));
    StepSequence s{prompt, 0, table, int64_t(prompt.size())};
    StepOutput out;
    EXPECT_TRUE(m->forward({&s, 1}, kv, &out).ok());
    return out.logits;
  };
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) /
      ("moeserve_v4_wc_" + std::to_string(::getpid()) + (GetParam() ? "_q" : ""));
  std::filesystem::remove_all(dir);
  const WeightCacheOptions cache{dir.string(), 0x5eed};
  const std::vector<float> plain = logits({});
  EXPECT_EQ(logits(cache), plain);  // writes the file
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files.push_back(e.path());
  ASSERT_EQ(files.size(), 1u);
  const auto written = std::filesystem::last_write_time(files[0]);
  EXPECT_EQ(logits(cache), plain);  // maps it
  EXPECT_EQ(std::filesystem::last_write_time(files[0]), written) << "a mapped file is kept";
  {  // 4 KiB inverted from the middle: entries are 4 KiB aligned, so the bytes of one change
    std::fstream io(files[0], std::ios::in | std::ios::out | std::ios::binary);
    const auto mid = std::streamoff(std::filesystem::file_size(files[0]) / 2);
    std::vector<char> bytes(4096);
    io.seekg(mid);
    io.read(bytes.data(), std::streamsize(bytes.size()));
    for (char& b : bytes) b = char(~b);
    io.seekp(mid);
    io.write(bytes.data(), std::streamsize(bytes.size()));
  }
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(logits(cache), plain);  // prepared again
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("checksum mismatch"), std::string::npos) << err;
  EXPECT_EQ(logits(cache), plain);  // the rewritten file
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Formats, V4WeightCache, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "requantized" : "published"; });

// Online EPLB's migration (docs/eplb.md "Online rebalancing") on V4's FP4 experts: every expert
// exported in the wire format, dropped and installed again (packed for gemm_fp4 on arrival)
// gives the logits' bits back; one installed in another's place changes them (installed experts
// are what the MoE reads); bytes whose scale is not UE8M0's power of two, or cut short, are
// refused by name and the expert held before stays.
// With --expert-dtype int8 as well: a received expert is requantized as the held ones were.
class V4Eplb : public ::testing::TestWithParam<bool> {};

TEST_P(V4Eplb, ReinstalledFp4ExpertsKeepTheBitsAndBadOnesAreRefused) {
  const WeightFormats formats =
      GetParam() ? WeightFormats{WeightFormat::kFp8, HeadFormat::kBf16, WeightFormat::kInt8}
                 : WeightFormats{};
  auto ck = Checkpoint::open(kDir);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  const ModelConfig& c = (*ck)->config();
  const Fixture f = load_fixture();
  const std::vector<int32_t> prompt(f.prompt.begin(), f.prompt.begin() + 100);
  ThreadPool pool(2);
  std::unique_ptr<CausalLm> m =
      make_deepseek_v4(c, (*ck)->weights(), &pool, true, {}, nullptr, formats);
  auto logits = [&] {
    KvCache kv(v4_kv_layout(c, DType::kBF16, false), 4);
    std::vector<int32_t> table, holds;
    EXPECT_TRUE(kv.allocate(2, &table, &holds));
    StepSequence s{prompt, 0, table, 4};
    StepOutput out;
    EXPECT_TRUE(m->forward({&s, 1}, kv, &out).ok());
    return out.logits;
  };
  auto bytes_of = [&](int64_t layer, int32_t e) {
    auto blob = m->experts().export_expert(layer, e);
    EXPECT_TRUE(blob.ok()) << blob.status().to_string();
    std::vector<uint8_t> b(blob.ok() ? blob->size() : 0);
    if (blob.ok()) blob->copy(0, b.size(), b.data());
    return b;
  };
  const std::vector<float> plain = logits();
  const int32_t E = int32_t(c.n_routed_experts);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    for (int32_t e = 0; e < E; ++e) {
      std::vector<uint8_t> b = bytes_of(l, e);
      m->experts().drop_expert(l, e);
      EXPECT_FALSE(m->experts().has_expert(l, e));
      const Status st = m->experts().install_expert(l, e, std::move(b));
      ASSERT_TRUE(st.ok()) << st.to_string();
      EXPECT_TRUE(m->experts().expert_received(l, e));
    }
  }
  EXPECT_EQ(logits(), plain);

  const int64_t l = 3;  // a top-k layer
  const std::vector<uint8_t> e0 = bytes_of(l, 0), e1 = bytes_of(l, 1);
  ASSERT_TRUE(m->experts().install_expert(l, 0, e1).ok());
  EXPECT_NE(logits(), plain) << "an expert installed in another's place was not read";
  ASSERT_TRUE(m->experts().install_expert(l, 0, e0).ok());
  EXPECT_EQ(logits(), plain);

  // The header (8 bytes, 3 x 56), then gate's FP4 codes, then its F32 scales.
  const size_t gate_codes = size_t(c.moe_intermediate_size * c.hidden_size / 2);
  std::vector<uint8_t> bad = e0;
  const float three = 3.0f;
  std::memcpy(bad.data() + 8 + 3 * 56 + gate_codes, &three, 4);
  Status st = m->experts().install_expert(l, 0, bad);
  EXPECT_NE(st.message().find("is not a power of two"), std::string::npos) << st.to_string();
  st = m->experts().install_expert(l, 0, std::vector<uint8_t>(e0.begin(), e0.end() - 4));
  EXPECT_EQ(st.code(), StatusCode::kCorrupt) << st.to_string();
  EXPECT_TRUE(m->experts().has_expert(l, 0));
  EXPECT_EQ(logits(), plain);
}

INSTANTIATE_TEST_SUITE_P(Formats, V4Eplb, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "int8_experts" : "fp4"; });

}  // namespace
}  // namespace moeserve
