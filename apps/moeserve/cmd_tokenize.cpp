// `moeserve tokenize`: UTF-8 text on stdin -> a JSON array of token ids on stdout (--bos puts
// the BOS id first). With --jsonl, each stdin line is a JSON string and each output line its
// id array. Input that is not valid UTF-8 is an error naming the byte offset (the library
// itself would repair it with U+FFFD; here the user should know).
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace moeserve::cli {
namespace {

struct TokenizeArgs {
  std::string dir;
  bool bos = false;
  bool jsonl = false;
};

std::string ids_json(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(ids[i]);
  }
  return s + "]";
}

int run_tokenize(const TokenizeArgs& args) {
  auto tok = Tokenizer::load(args.dir);
  if (!tok.ok()) {
    fmt::print(stderr, "moeserve tokenize: {}\n", tok.status().message());
    return 1;
  }
  if (!args.jsonl) {
    const std::string text((std::istreambuf_iterator<char>(std::cin)),
                           std::istreambuf_iterator<char>());
    if (auto bad = utf8::first_invalid(text)) {
      fmt::print(stderr, "moeserve tokenize: stdin is not valid UTF-8 (byte {})\n", *bad);
      return 1;
    }
    fmt::print("{}\n", ids_json(tok->encode(text, args.bos)));
    return 0;
  }
  size_t line_no = 0;
  for (std::string line; std::getline(std::cin, line);) {
    ++line_no;
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_string()) {
      fmt::print(stderr, "moeserve tokenize: line {}: expected one JSON string\n", line_no);
      return 1;
    }
    // nlohmann validates UTF-8 only when dumping; check here for a clear message.
    const std::string& text = j.get_ref<const std::string&>();
    if (auto bad = utf8::first_invalid(text)) {
      fmt::print(stderr, "moeserve tokenize: line {}: string is not valid UTF-8 (byte {})\n",
                 line_no, *bad);
      return 1;
    }
    fmt::print("{}\n", ids_json(tok->encode(text, args.bos)));
  }
  return 0;
}

}  // namespace

Subcommand add_tokenize_command(CLI::App& parent) {
  auto args = std::make_shared<TokenizeArgs>();
  auto* app = parent.add_subcommand("tokenize", "Text on stdin -> token ids (JSON) on stdout");
  app->add_option("--tokenizer", args->dir,
                  "directory with tokenizer.json (and tokenizer_config.json)")
      ->required();
  app->add_flag("--bos", args->bos, "put the BOS token first");
  app->add_flag("--jsonl", args->jsonl, "one JSON string per input line -> one id array per line");
  return {app, [args] { return run_tokenize(*args); }};
}

}  // namespace moeserve::cli
