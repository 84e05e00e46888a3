// Loading: the real files, the lookups the engine uses, and clear errors for bad input.
#include <gtest/gtest.h>

#include "fixtures.h"

namespace moeserve {
namespace {

TEST(Tokenizer, LoadsTheRealDeepSeekV3Files) {
  const Tokenizer& tok = testing::deepseek_v3();
  EXPECT_EQ(tok.vocab_size(), 128815);
  EXPECT_EQ(tok.bos_id(), 0);
  EXPECT_EQ(tok.eos_id(), 1);
  EXPECT_EQ(tok.bos_token(), "<｜begin▁of▁sentence｜>");
  EXPECT_TRUE(tok.default_add_bos());
  EXPECT_FALSE(tok.chat_template().empty());
  EXPECT_EQ(tok.token_to_id("<｜Assistant｜>"), 128804);
  EXPECT_EQ(tok.id_to_token(128804), "<｜Assistant｜>");
  EXPECT_EQ(tok.token_to_id("Ġthe"), tok.encode(" the", false).at(0));
  EXPECT_EQ(tok.token_bytes(tok.encode(" the", false).at(0)), " the");
  EXPECT_EQ(tok.token_bytes(128814), "<｜tool▁sep｜>");
  EXPECT_EQ(tok.token_bytes(-1), std::nullopt);
  EXPECT_EQ(tok.token_bytes(200000), std::nullopt);
}

TEST(Tokenizer, SpecialTokenStringsInTextBecomeTheirIds) {
  const Tokenizer& tok = testing::deepseek_v3();
  const auto ids = tok.encode("<｜User｜>hi<｜end▁of▁sentence｜>", true);
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(ids.front(), 0);
  EXPECT_EQ(ids[1], 128803);
  EXPECT_EQ(ids.back(), 1);
}

TEST(Tokenizer, EmptyTextGivesNoIdsOrOnlyBos) {
  const Tokenizer& tok = testing::deepseek_v3();
  EXPECT_TRUE(tok.encode("", false).empty());
  EXPECT_EQ(tok.encode("", true), std::vector<int32_t>{0});
}

TEST(Tokenizer, LoadErrorsAreStatuses) {
  auto missing = Tokenizer::load("/nonexistent/dir");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  auto garbage = Tokenizer::from_json("{not json", "");
  ASSERT_FALSE(garbage.ok());
  EXPECT_EQ(garbage.status().code(), StatusCode::kCorrupt);
  auto no_model = Tokenizer::from_json(R"({"added_tokens": []})", "");
  ASSERT_FALSE(no_model.ok());
  EXPECT_EQ(no_model.status().code(), StatusCode::kCorrupt);
  auto wordpiece = Tokenizer::from_json(R"({"model": {"type": "WordPiece", "vocab": {}}})", "");
  ASSERT_FALSE(wordpiece.ok());
  EXPECT_EQ(wordpiece.status().code(), StatusCode::kUnimplemented);
  auto bad_regex = Tokenizer::from_json(
      R"({"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(["}, "behavior": "Isolated"},
          "decoder": {"type": "ByteLevel"}, "model": {"type": "BPE", "vocab": {}, "merges": []}})",
      "");
  ASSERT_FALSE(bad_regex.ok());
  EXPECT_NE(bad_regex.status().message().find("regex"), std::string::npos);
}

// A tiny hand-made tokenizer: a Split behavior other than Isolated, merges and added tokens.
// The expected values are what HF tokenizers 0.23 gives for the same file.
TEST(Tokenizer, SmallSyntheticTokenizerSplitsAndMerges) {
  const char* tj = R"({
    "normalizer": null,
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"String": "-"}, "behavior": "MergedWithPrevious", "invert": false},
      {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]},
    "decoder": {"type": "ByteLevel"},
    "added_tokens": [{"id": 9, "content": "<x>", "special": true, "normalized": false}],
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "-": 2, "ab": 3, "ab-": 4, "<x>": 9},
              "merges": ["a b", "ab -"]}})";
  auto t = Tokenizer::from_json(tj, "");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  // "ab-ab--a" -> words "ab-", "ab-", "-", "a" (MergedWithPrevious: the second '-' of "--"
  // stays alone).
  EXPECT_EQ(t->encode("ab-ab--a", false), (std::vector<int32_t>{4, 4, 2, 0}));
  EXPECT_EQ(t->encode("a<x>b", false), (std::vector<int32_t>{0, 9, 1}));
  EXPECT_EQ(t->decode(std::vector<int32_t>{4, 9, 0}, false), "ab-<x>a");
  EXPECT_EQ(t->decode(std::vector<int32_t>{4, 9, 0}, true), "ab-a");
}

}  // namespace
}  // namespace moeserve
