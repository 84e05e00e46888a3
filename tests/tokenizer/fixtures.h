// Readers for the committed fixtures in tests/data/tokenizer/ (written by
// tools/gen_tokenizer_fixtures.py from Hugging Face tokenizers and jinja2). Test-only.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace moeserve::testing {

inline const char* kTokenizerDir = "assets/tokenizer/deepseek-v3";
inline const char* kDataDir = "tests/data/tokenizer";

inline std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot open " << path;
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> rows;
  std::istringstream in(read_all(path));
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) rows.push_back(nlohmann::json::parse(line));
  }
  return rows;
}

struct CorpusLine {
  std::string kind, text;
  std::vector<int32_t> ids;  // Hugging Face's, without BOS
};

// corpus.jsonl + corpus_ids.bin (per line: count, then ids; unsigned LEB128 varints).
inline std::vector<CorpusLine> load_corpus() {
  std::vector<CorpusLine> lines;
  for (const auto& row : read_jsonl(std::string(kDataDir) + "/corpus.jsonl")) {
    lines.push_back({row["kind"].get<std::string>(), row["text"].get<std::string>(), {}});
  }
  const std::string bin = read_all(std::string(kDataDir) + "/corpus_ids.bin");
  size_t pos = 0;
  auto next = [&]() -> uint64_t {
    uint64_t v = 0;
    for (int shift = 0; pos < bin.size(); shift += 7) {
      const auto b = static_cast<uint8_t>(bin[pos++]);
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) break;
    }
    return v;
  };
  for (CorpusLine& l : lines) {
    const uint64_t n = next();
    for (uint64_t i = 0; i < n; ++i) l.ids.push_back(static_cast<int32_t>(next()));
  }
  EXPECT_EQ(pos, bin.size()) << "corpus_ids.bin does not match corpus.jsonl";
  return lines;
}

// The real DeepSeek-V3 tokenizer, loaded once per test binary.
inline const Tokenizer& deepseek_v3() {
  static const Tokenizer tok = [] {
    auto t = Tokenizer::load(kTokenizerDir);
    if (!t.ok()) {
      ADD_FAILURE() << t.status().to_string();
      std::abort();
    }
    return std::move(t).value();
  }();
  return tok;
}

}  // namespace moeserve::testing
