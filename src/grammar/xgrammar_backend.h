// XGrammarBackend: engine/grammar.h's GrammarBackend on xgrammar (docs/structured-outputs.md).
// The vocabulary xgrammar matches against is the tokenizer's bytes per token; special tokens and
// ids past the tokenizer (the model's padding rows) are never allowed, EOS only where the
// grammar has ended.
#pragma once

#include <cstdint>
#include <memory>

#include "engine/grammar.h"
#include "tokenizer/tokenizer.h"

namespace moeserve {

struct XGrammarOptions {
  // Longest run of whitespace between JSON tokens; bounded so that a model (a random-weight one
  // above all) cannot fill max_tokens with blanks.
  int max_whitespace = 16;
  int compile_threads = 2;
  int64_t cache_bytes = 256ll << 20;  // compiled grammars kept
};

class XGrammarBackend final : public GrammarBackend {
 public:
  // vocab_size: the model's (at least the tokenizer's). The tokenizer needs an EOS token.
  static Result<std::unique_ptr<XGrammarBackend>> create(const Tokenizer& tok, int64_t vocab_size,
                                                         XGrammarOptions options = {});
  ~XGrammarBackend() override;

  Status check(const GrammarSpec& spec) override;
  Result<std::unique_ptr<TokenConstraint>> start(const GrammarSpec& spec) override;

 private:
  struct Impl;
  explicit XGrammarBackend(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeserve
