// Self-consistency of the forward pass: the two attention forms, batching and chunked prefill
// must not change results. (Agreement with Hugging Face is hf_reference_test.cpp.)
#include "model/deepseek.h"

#include <gtest/gtest.h>

#include <cmath>

#include "cache/block_allocator.h"
#include "engine/generator.h"
#include "test_models.h"

namespace moeserve {
namespace {

struct Harness {
  explicit Harness(const std::string& dir, AttentionMode mode = AttentionMode::kAbsorbed,
                   DType kv = DType::kF32)
      : ck(std::move(Checkpoint::open(dir).value())),
        pool(2),
        dispatcher(ck->config().n_routed_experts),
        model(ck->config(), ck->weights(), dispatcher, &pool, mode),
        cache(ck->config().num_hidden_layers, ck->config().kv_cache_dim(), 64, kv),
        blocks(64),
        gen(model, cache, blocks) {}

  std::vector<GenerateResult> run(const std::vector<GenerateRequest>& reqs, int64_t chunk = 0) {
    auto r = gen.generate(reqs, chunk);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(blocks.num_free(), blocks.num_blocks());  // everything released
    return r.ok() ? *r : std::vector<GenerateResult>{};
  }

  std::unique_ptr<Checkpoint> ck;
  ThreadPool pool;
  LocalDispatcher dispatcher;
  DeepseekModel model;
  LatentKvCache cache;
  BlockAllocator blocks;
  Generator gen;
};

std::vector<int32_t> prompt(int n, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back((i * 37 + salt * 101 + 11) % 1000);
  return p;
}

GenerateRequest request(std::vector<int32_t> p, int64_t max_tokens = 8) {
  GenerateRequest r;
  r.prompt = std::move(p);
  r.max_tokens = max_tokens;
  r.top_logprobs = 5;
  r.ignore_eos = true;
  return r;
}

// Same tokens, and logprobs of the recorded top tokens within tol.
void expect_same(const GenerateResult& a, const GenerateResult& b, float tol) {
  ASSERT_EQ(a.tokens, b.tokens);
  ASSERT_EQ(a.top_logprobs.size(), b.top_logprobs.size());
  for (size_t s = 0; s < a.top_logprobs.size(); ++s) {
    for (size_t k = 0; k < a.top_logprobs[s].size(); ++k) {
      EXPECT_EQ(a.top_logprobs[s][k].id, b.top_logprobs[s][k].id) << "step " << s;
      EXPECT_NEAR(a.top_logprobs[s][k].logprob, b.top_logprobs[s][k].logprob, tol) << "step " << s;
    }
  }
}

class DeepseekTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::string dir() {
    return GetParam() == "v3" ? testing::small_model_dir("fwd_v3", "tiny")
                              : testing::small_model_dir("fwd_v2", "v2-lite-tiny");
  }
};

TEST_P(DeepseekTest, NaiveAndAbsorbedAttentionAgree) {
  Harness absorbed(dir(), AttentionMode::kAbsorbed), naive(dir(), AttentionMode::kNaive);
  for (int n : {1, 9, 70}) {
    auto a = absorbed.run({request(prompt(n, n))});
    auto b = naive.run({request(prompt(n, n))});
    expect_same(a[0], b[0], 1e-4f);
  }
}

TEST_P(DeepseekTest, BatchedEqualsUnbatched) {
  Harness h(dir());
  std::vector<GenerateRequest> reqs = {request(prompt(1, 1)), request(prompt(13, 2), 5),
                                       request(prompt(70, 3)), request(prompt(13, 2), 5)};
  auto batched = h.run(reqs);
  ASSERT_EQ(batched.size(), reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto alone = h.run({reqs[i]});
    expect_same(batched[i], alone[0], 1e-4f);
  }
}

TEST_P(DeepseekTest, ChunkedPrefillEqualsWholePrompt) {
  Harness h(dir());
  auto whole = h.run({request(prompt(100, 4))});
  for (int64_t chunk : {1, 7, 64}) {
    auto chunked = h.run({request(prompt(100, 4))}, chunk);
    expect_same(whole[0], chunked[0], 1e-4f);
  }
}

TEST_P(DeepseekTest, Bf16CacheStaysClose) {
  Harness f32(dir()), bf16(dir(), AttentionMode::kAbsorbed, DType::kBF16);
  auto a = f32.run({request(prompt(30, 5), 1)});
  auto b = bf16.run({request(prompt(30, 5), 1)});
  for (size_t k = 0; k < 5; ++k) {
    EXPECT_NEAR(a[0].top_logprobs[0][k].logprob, b[0].top_logprobs[0][k].logprob, 5e-2);
  }
}

TEST_P(DeepseekTest, RejectsBadTokenAndContext) {
  Harness h(dir());
  auto r = h.gen.generate({request({5, 1000})});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("1000"), std::string::npos);
  EXPECT_EQ(h.blocks.num_free(), h.blocks.num_blocks());
  auto too_long = h.gen.generate({request(prompt(10, 1), 1 << 20)});
  EXPECT_FALSE(too_long.ok());
  auto empty = h.gen.generate({request({})});
  EXPECT_FALSE(empty.ok());
}

INSTANTIATE_TEST_SUITE_P(Variants, DeepseekTest, ::testing::Values("v3", "v2"));

TEST(Sampling, SeededSamplingIsReproducible) {
  Harness h(testing::small_model_dir("fwd_v3", "tiny"));
  GenerateRequest r = request(prompt(5, 9), 12);
  r.sampling = {0.8f, 0.9f, 50};
  r.seed = 42;
  auto a = h.run({r});
  auto b = h.run({r});
  EXPECT_EQ(a[0].tokens, b[0].tokens);
  r.seed = 43;
  auto c = h.run({r});
  EXPECT_NE(a[0].tokens, c[0].tokens);
}

}  // namespace
}  // namespace moeserve
