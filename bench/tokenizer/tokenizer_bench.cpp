// tokenizer-bench: single-thread encode throughput of the native tokenizer on the committed
// corpus (line by line, as requests arrive) and on adversarial inputs, plus the load time of
// tokenizer.json. Prints one JSON object per line; bench/tokenizer/vs_hf.py runs HF tokenizers on
// the same inputs in the same run and prints the ratios.
//
// Usage: tokenizer-bench [--tokenizer DIR] [--corpus FILE] [--quick]
// Run from the repository root (defaults are repository paths).
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "inputs.h"
#include "tokenizer/tokenizer.h"

using namespace moeserve;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// FNV-1a over the ids, so vs_hf.py can check both tokenizers produced the same output.
uint64_t fnv(const std::vector<int32_t>& ids, uint64_t h = 1469598103934665603ull) {
  for (int32_t id : ids) {
    h ^= static_cast<uint32_t>(id);
    h *= 1099511628211ull;
  }
  return h;
}

// Best of `reps` timings of fn(); fn returns (ids count, hash).
template <typename F>
void report(const std::string& name, size_t bytes, int reps, F fn) {
  double best = 1e30;
  std::pair<size_t, uint64_t> r{};
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    r = fn();
    best = std::min(best, seconds_since(t0));
  }
  std::printf(
      "{\"input\": \"%s\", \"bytes\": %zu, \"seconds\": %.6f, \"mb_per_s\": %.3f, "
      "\"ids\": %zu, \"hash\": \"%016llx\"}\n",
      name.c_str(), bytes, best, bytes / best / 1e6, r.first,
      static_cast<unsigned long long>(r.second));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "assets/tokenizer/deepseek-v3",
              corpus_path = "tests/data/tokenizer/corpus.jsonl";
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--tokenizer" && i + 1 < argc)
      dir = argv[++i];
    else if (a == "--corpus" && i + 1 < argc)
      corpus_path = argv[++i];
    else if (a == "--quick")
      quick = true;
    else {
      std::fprintf(stderr, "usage: tokenizer-bench [--tokenizer DIR] [--corpus FILE] [--quick]\n");
      return 2;
    }
  }
  const auto t0 = Clock::now();
  auto tok = Tokenizer::load(dir);
  const double load_s = seconds_since(t0);
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", tok.status().to_string().c_str());
    return 1;
  }
  std::printf("{\"input\": \"load\", \"seconds\": %.6f}\n", load_s);

  std::vector<std::string> lines;
  {
    std::ifstream f(corpus_path);
    if (!f) {
      std::fprintf(stderr, "%s: cannot open\n", corpus_path.c_str());
      return 1;
    }
    for (std::string l; std::getline(f, l);) {
      if (!l.empty()) lines.push_back(nlohmann::json::parse(l)["text"].get<std::string>());
    }
  }
  size_t corpus_bytes = 0;
  for (const auto& l : lines) corpus_bytes += l.size();
  const int reps = quick ? 1 : 3;
  report("corpus", corpus_bytes, reps, [&] {
    size_t n = 0;
    uint64_t h = 1469598103934665603ull;
    for (const auto& l : lines) {
      const auto ids = tok->encode(l, false);
      n += ids.size();
      h = fnv(ids, h);
    }
    return std::make_pair(n, h);
  });
  const size_t mb = size_t{1} << 20;
  for (const std::string kind : {"repeated_char", "one_word", "digits", "spaces"}) {
    // Two sizes: linear time means equal MB/s at both.
    for (const size_t n : {mb / 4, mb}) {
      const std::string s = bench::adversarial(kind, n);
      report(kind + "_" + std::to_string(n >> 10) + "k", n, reps, [&] {
        const auto ids = tok->encode(s, false);
        return std::make_pair(ids.size(), fnv(ids));
      });
    }
  }
  return 0;
}
