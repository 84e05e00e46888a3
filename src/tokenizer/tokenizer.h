// Tokenizer: a byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json (+ the
// tokenizer_config.json beside it), producing the same ids as Hugging Face `tokenizers`.
//
// Pipeline of encode(), as HF runs it:
//   1. split the text on added tokens (leftmost-longest; first the tokens matched on raw text
//      "normalized": false, then the "normalized": true ones in what is left);
//   2. each remaining piece: normalizer (the DeepSeek files have an empty one), pre-tokenizer
//      (Split regexes, ByteLevel), then BPE on every word.
// decode() maps ids to bytes (ByteLevel decoder) and repairs invalid UTF-8 with U+FFFD the way
// HF does (String::from_utf8_lossy).
//
// Invalid UTF-8 input to encode() is not an error: each maximal invalid subpart is replaced by
// U+FFFD first (the same text Python's bytes.decode("utf-8", "replace") would hand to HF).
// Callers that must reject such input check utf8::first_invalid() themselves.
//
// A loaded Tokenizer is immutable: every method is const and thread-safe. Copies are cheap and
// share the loaded tables.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace moeserve {

class BpeModel;

class Tokenizer {
 public:
  // Loads dir/tokenizer.json (required) and dir/tokenizer_config.json (optional: BOS/EOS tokens
  // and the chat template).
  static Result<Tokenizer> load(const std::string& dir);
  // The same from file contents (config_json may be empty). `origin` names them in errors.
  static Result<Tokenizer> from_json(std::string_view tokenizer_json, std::string_view config_json,
                                     const std::string& origin = "tokenizer.json");

  // add_bos puts bos_id() first (nothing when tokenizer_config.json names no BOS token).
  std::vector<int32_t> encode(std::string_view text, bool add_bos) const;
  // Appends to `ids` (no BOS); for callers that build prompts piece by piece.
  void encode_append(std::string_view text, std::vector<int32_t>& ids) const;

  // Ids that are not in the vocabulary are skipped (as HF does); skip_special also drops the
  // added tokens marked "special" (BOS, EOS, ...).
  std::string decode(std::span<const int32_t> ids, bool skip_special) const;

  // Raw bytes of one token as the decoder emits them (may be a partial UTF-8 sequence), or
  // nullopt for an unknown id.
  std::optional<std::string_view> token_bytes(int32_t id) const;
  // Vocabulary form of a token (byte-level alphabet for BPE tokens, literal for added tokens).
  std::optional<std::string_view> id_to_token(int32_t id) const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  bool is_special(int32_t id) const;
  // One past the largest id.
  int32_t vocab_size() const;

  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  // tokenizer_config.json fields ("" / nullopt when absent).
  const std::string& bos_token() const;
  const std::string& eos_token() const;
  const std::string& chat_template() const;
  // tokenizer_config.json "add_bos_token" (what HF's encode(add_special_tokens=True) does).
  bool default_add_bos() const;

  // The BPE model, for tests and benches that compare its two merge implementations.
  const BpeModel& bpe() const;

 private:
  friend struct TokenizerLoader;
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

}  // namespace moeserve
