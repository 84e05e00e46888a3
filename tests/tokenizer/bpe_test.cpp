// The three BPE merge implementations (simple for short words, heap for long ones, rank buckets
// for very long ones) must agree; all are also checked against Hugging Face through the corpus
// test (its long_words lines take the heap and bucket paths).
#include <gtest/gtest.h>

#include <random>

#include "fixtures.h"
#include "tokenizer/bpe.h"

namespace moeserve {
namespace {

TEST(Bpe, SimpleAndHeapMergesAgreeOnCorpusWords) {
  const BpeModel& bpe = testing::deepseek_v3().bpe();
  ASSERT_TRUE(bpe.ranks_monotone());  // DeepSeek's merges are in training order
  std::mt19937 rng(7);
  size_t checked = 0;
  for (const auto& line : testing::load_corpus()) {
    const std::string& t = line.text;
    if (t.empty()) continue;
    // Random windows of the raw text: not real pre-tokenized words, but any byte string is a
    // valid BPE input, and these include long multi-script stretches.
    for (int rep = 0; rep < 3; ++rep) {
      const size_t b = rng() % t.size();
      const size_t n = 1 + rng() % std::min<size_t>(120, t.size() - b);
      std::vector<int32_t> a, h, k;
      bpe.encode_word_simple(std::string_view(t).substr(b, n), a);
      bpe.encode_word_heap(std::string_view(t).substr(b, n), h);
      bpe.encode_word_buckets(std::string_view(t).substr(b, n), k);
      ASSERT_EQ(a, h) << "window " << b << "+" << n << " of a " << line.kind << " line";
      ASSERT_EQ(a, k) << "window " << b << "+" << n << " of a " << line.kind << " line";
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
    std::vector<int32_t> a, h, k;
    bpe.encode_word_simple(w, a);
    bpe.encode_word_heap(w, h);
    bpe.encode_word_buckets(w, k);
    EXPECT_EQ(a, h) << "unit '" << unit << "'";
    EXPECT_EQ(a, k) << "unit '" << unit << "'";
  }
}

TEST(Bpe, WholeCorpusLinesAsOneWordAgreeBetweenHeapAndBuckets) {
  const BpeModel& bpe = testing::deepseek_v3().bpe();
  size_t checked = 0;
  for (const auto& line : testing::load_corpus()) {
    if (line.text.size() < 500) continue;
    std::vector<int32_t> h, k;
    bpe.encode_word_heap(line.text, h);
    bpe.encode_word_buckets(line.text, k);
    ASSERT_EQ(h, k) << line.kind;
    ++checked;
  }
  EXPECT_GT(checked, 300u);
}

TEST(Bpe, NonMonotoneMergesAreDetected) {
  // "ab" is made by rank 1 but used by rank 0: the bucket path must not be allowed.
  std::vector<std::optional<int32_t>> bytes(256);
  bytes['a'] = 0;
  bytes['b'] = 1;
  bytes['c'] = 2;
  auto m = BpeModel::build(bytes, {{3, 2, 4}, {0, 1, 3}}, {}, false);  // (ab,c)->abc, (a,b)->ab
  ASSERT_TRUE(m.ok());
  EXPECT_FALSE(m->ranks_monotone());
  std::vector<int32_t> out;
  m->encode_word(std::string(3000, 'a') + "bc", out);  // long: must still be right (heap path)
  EXPECT_EQ(out.back(), 4);
}

}  // namespace
}  // namespace moeserve
