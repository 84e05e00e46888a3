// `moeserve detokenize`: a JSON array of token ids on stdin -> the decoded text on stdout,
// exactly (no newline added). --skip-special drops special tokens (BOS, EOS, ...). An id that is
// not in the vocabulary is an error (the library's decode() would skip it, as HF does).
#include <climits>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::cli {
namespace {

struct DetokenizeArgs {
  std::string dir;
  bool skip_special = false;
};

int run_detokenize(const DetokenizeArgs& args) {
  auto tok = Tokenizer::load(args.dir);
  if (!tok.ok()) {
    fmt::print(stderr, "moeserve detokenize: {}\n", tok.status().message());
    return 1;
  }
  const std::string in((std::istreambuf_iterator<char>(std::cin)),
                       std::istreambuf_iterator<char>());
  auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_array()) {
    fmt::print(stderr, "moeserve detokenize: stdin: expected a JSON array of token ids\n");
    return 1;
  }
  std::vector<int32_t> ids;
  for (size_t i = 0; i < j.size(); ++i) {
    const auto& v = j[i];
    const int64_t id = v.is_number_integer() ? v.get<int64_t>() : -1;
    if (id < 0 || id > INT32_MAX || !tok->token_bytes(static_cast<int32_t>(id))) {
      fmt::print(stderr, "moeserve detokenize: element {} ({}) is not a token id (0..{})\n", i,
                 v.dump(), tok->vocab_size() - 1);
      return 1;
    }
    ids.push_back(static_cast<int32_t>(id));
  }
  const std::string text = tok->decode(ids, args.skip_special);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

}  // namespace

Subcommand add_detokenize_command(CLI::App& parent) {
  auto args = std::make_shared<DetokenizeArgs>();
  auto* app =
      parent.add_subcommand("detokenize", "Token ids (JSON array) on stdin -> text on stdout");
  app->add_option("--tokenizer", args->dir,
                  "directory with tokenizer.json (and tokenizer_config.json)")
      ->required();
  app->add_flag("--skip-special", args->skip_special, "leave out special tokens (BOS, EOS, ...)");
  return {app, [args] { return run_detokenize(*args); }};
}

}  // namespace moeserve::cli
