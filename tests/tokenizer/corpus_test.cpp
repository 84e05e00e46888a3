// The tokenizer against Hugging Face tokenizers on the committed corpus (>= 1 MB, many scripts,
// code, numbers, whitespace, emoji, combining marks, special-token strings, every BMP code point).
#include <gtest/gtest.h>

#include <set>
#include <thread>

#include "fixtures.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/utf8.h"

namespace moeserve {
namespace {

using testing::deepseek_v3;
using testing::load_corpus;

const std::vector<testing::CorpusLine>& corpus() {
  static const auto c = load_corpus();
  return c;
}

std::string show(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size() && i < 40; ++i) s += std::to_string(ids[i]) + " ";
  return s;
}

TEST(Corpus, IsLargeAndVaried) {
  size_t bytes = 0;
  std::set<std::string> kinds;
  for (const auto& l : corpus()) {
    bytes += l.text.size();
    kinds.insert(l.kind);
  }
  EXPECT_GE(bytes, 1u << 20);
  EXPECT_GE(kinds.size(), 12u);
}

TEST(Corpus, IdsMatchHuggingFaceOnEveryLine) {
  const Tokenizer& tok = deepseek_v3();
  size_t mismatches = 0, ids = 0;
  for (size_t i = 0; i < corpus().size(); ++i) {
    const auto& l = corpus()[i];
    const std::vector<int32_t> got = tok.encode(l.text, /*add_bos=*/false);
    ids += got.size();
    if (got != l.ids) {
      if (++mismatches <= 5) {
        ADD_FAILURE() << "line " << i << " (" << l.kind << "): got " << show(got) << "\nwant "
                      << show(l.ids);
      }
    }
  }
  EXPECT_EQ(mismatches, 0u) << "of " << corpus().size() << " lines";
  EXPECT_GT(ids, 100000u);
}

// One Tokenizer shared by threads (as the server does): the word cache is the only mutable
// state, and concurrent use must not change any result.
TEST(Corpus, ConcurrentEncodingGivesTheSameIds) {
  const Tokenizer& tok = deepseek_v3();
  constexpr size_t kThreads = 4;
  std::vector<size_t> mismatches(kThreads, 0);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = t; i < corpus().size(); i += kThreads / 2) {  // lines overlap across threads
        if (tok.encode(corpus()[i].text, false) != corpus()[i].ids) ++mismatches[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (size_t t = 0; t < kThreads; ++t) EXPECT_EQ(mismatches[t], 0u) << "thread " << t;
}

TEST(Corpus, WithBosIsBosThenTheSameIds) {
  const Tokenizer& tok = deepseek_v3();
  ASSERT_EQ(tok.bos_id(), 0);
  for (size_t i = 0; i < corpus().size(); i += 7) {
    std::vector<int32_t> want = {0};
    want.insert(want.end(), corpus()[i].ids.begin(), corpus()[i].ids.end());
    ASSERT_EQ(tok.encode(corpus()[i].text, /*add_bos=*/true), want) << "line " << i;
  }
}

TEST(Corpus, DecodeOfEncodeIsIdentity) {
  const Tokenizer& tok = deepseek_v3();
  for (size_t i = 0; i < corpus().size(); ++i) {
    const auto& l = corpus()[i];
    ASSERT_EQ(tok.decode(l.ids, /*skip_special=*/false), l.text)
        << "line " << i << " (" << l.kind << ")";
  }
}

TEST(Corpus, StreamingDetokenizationEqualsFullDecode) {
  const Tokenizer& tok = deepseek_v3();
  for (bool skip : {false, true}) {
    for (size_t i = 0; i < corpus().size(); ++i) {
      const auto& l = corpus()[i];
      IncrementalDetokenizer detok(tok, skip);
      std::string streamed;
      for (int32_t id : l.ids) {
        const std::string piece = detok.push(id);
        ASSERT_TRUE(utf8::is_valid(piece)) << "line " << i << ": broken UTF-8 piece";
        streamed += piece;
      }
      streamed += detok.finish();
      ASSERT_EQ(streamed, tok.decode(l.ids, skip)) << "line " << i << " skip=" << skip;
    }
  }
}

}  // namespace
}  // namespace moeserve
