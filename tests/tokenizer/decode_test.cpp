// Decoding against Hugging Face: random id sequences (broken UTF-8 across tokens, special and
// unknown ids) with and without skip_special_tokens, plus streaming on the same sequences.
#include <gtest/gtest.h>

#include "fixtures.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/utf8.h"

namespace moeserve {
namespace {

using testing::deepseek_v3;

TEST(Decode, MatchesHuggingFaceWithAndWithoutSpecialTokens) {
  const Tokenizer& tok = deepseek_v3();
  const auto rows = testing::read_jsonl(std::string(testing::kDataDir) + "/decode.jsonl");
  ASSERT_GE(rows.size(), 100u);
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto ids = rows[i]["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok.decode(ids, false), rows[i]["text"].get<std::string>()) << "row " << i;
    EXPECT_EQ(tok.decode(ids, true), rows[i]["text_skip"].get<std::string>()) << "row " << i;
  }
}

TEST(Decode, StreamingOfBrokenSequencesEqualsFullDecodeAndStaysValid) {
  const Tokenizer& tok = deepseek_v3();
  const auto rows = testing::read_jsonl(std::string(testing::kDataDir) + "/decode.jsonl");
  for (bool skip : {false, true}) {
    for (size_t i = 0; i < rows.size(); ++i) {
      const auto ids = rows[i]["ids"].get<std::vector<int32_t>>();
      IncrementalDetokenizer d(tok, skip);
      std::string all;
      for (int32_t id : ids) {
        const std::string piece = d.push(id);
        ASSERT_TRUE(utf8::is_valid(piece)) << "row " << i;
        all += piece;
      }
      all += d.finish();
      EXPECT_EQ(all, tok.decode(ids, skip)) << "row " << i;
      EXPECT_EQ(d.pending_bytes(), 0u);
    }
  }
}

TEST(Decode, SkipSpecialDropsOnlySpecialTokens) {
  const Tokenizer& tok = deepseek_v3();
  const int32_t user = *tok.token_to_id("<｜User｜>");  // added, not special
  EXPECT_TRUE(tok.is_special(0));
  EXPECT_TRUE(tok.is_special(1));
  EXPECT_FALSE(tok.is_special(user));
  std::vector<int32_t> ids = {0, user};
  const auto hi = tok.encode("hi", false);
  ids.insert(ids.end(), hi.begin(), hi.end());
  ids.push_back(1);
  EXPECT_EQ(tok.decode(ids, false), "<｜begin▁of▁sentence｜><｜User｜>hi<｜end▁of▁sentence｜>");
  EXPECT_EQ(tok.decode(ids, true), "<｜User｜>hi");
}

TEST(Decode, HoldsBackASplitCharacterUntilComplete) {
  const Tokenizer& tok = deepseek_v3();
  // "é" is two bytes; find two byte tokens that spell it.
  const std::string e = "\xC3\xA9";
  std::vector<int32_t> ids;
  for (char c : e) {
    for (int32_t id = 0; id < tok.vocab_size(); ++id) {
      auto b = tok.token_bytes(id);
      if (b && *b == std::string(1, c)) {
        ids.push_back(id);
        break;
      }
    }
  }
  ASSERT_EQ(ids.size(), 2u);
  IncrementalDetokenizer d(tok, false);
  EXPECT_EQ(d.push(ids[0]), "");
  EXPECT_EQ(d.pending_bytes(), 1u);
  EXPECT_EQ(d.push(ids[1]), e);
  // A truncated character at the end becomes U+FFFD, as in decode().
  EXPECT_EQ(d.push(ids[0]), "");
  EXPECT_EQ(d.finish(), "\xEF\xBF\xBD");
}

}  // namespace
}  // namespace moeserve
