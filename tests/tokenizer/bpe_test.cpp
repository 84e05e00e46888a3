// The two BPE merge implementations (simple for short words, heap for long ones) must agree;
// both are also checked against Hugging Face through the corpus test.
#include <gtest/gtest.h>

#include <random>

#include "fixtures.h"
#include "tokenizer/bpe.h"

namespace moeserve {
namespace {

TEST(Bpe, SimpleAndHeapMergesAgreeOnCorpusWords) {
  const BpeModel& bpe = testing::deepseek_v3().bpe();
  std::mt19937 rng(7);
  size_t checked = 0;
  for (const auto& line : testing::load_corpus()) {
    const std::string& t = line.text;
    if (t.empty()) continue;
    // Random windows of the raw text: not real pre-tokenized words, but any byte string is a
    // valid BPE input, and these include long multi-script stretches.
    for (int k = 0; k < 3; ++k) {
      const size_t b = rng() % t.size();
      const size_t n = 1 + rng() % std::min<size_t>(120, t.size() - b);
      std::vector<int32_t> a, h;
      bpe.encode_word_simple(std::string_view(t).substr(b, n), a);
      bpe.encode_word_heap(std::string_view(t).substr(b, n), h);
      ASSERT_EQ(a, h) << "window " << b << "+" << n << " of a " << line.kind << " line";
      ++checked;
    }
  }
  EXPECT_GT(checked, 5000u);
}

TEST(Bpe, LongRepetitiveWordsAgree) {
  const BpeModel& bpe = testing::deepseek_v3().bpe();
  for (const std::string unit : {"a", "ab", "abc", " ", "\xE4\xB8\xAD", "0", "xy z"}) {
    std::string w;
    for (int i = 0; i < 500; ++i) w += unit;
    std::vector<int32_t> a, h;
    bpe.encode_word_simple(w, a);
    bpe.encode_word_heap(w, h);
    EXPECT_EQ(a, h) << "unit '" << unit << "'";
  }
}

}  // namespace
}  // namespace moeserve
