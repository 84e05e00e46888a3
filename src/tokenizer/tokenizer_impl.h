// Tokenizer::Impl: the loaded tables of a Tokenizer, shared by the loader (tokenizer_load.cpp)
// and the runtime (tokenizer.cpp). Internal to src/tokenizer; immutable once built.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/string_id_map.h"
#include "tokenizer/tokenizer.h"

namespace moeserve {

struct Tokenizer::Impl {
  // Per id (index = id): decoder bytes, vocabulary form, flags.
  std::string bytes_blob, form_blob;
  std::vector<uint32_t> bytes_off, form_off;  // size vocab_size + 1
  enum : uint8_t { kKnown = 1, kSpecial = 2 };
  std::vector<uint8_t> flags;
  StringIdMap form_to_id;  // vocabulary form -> id (added tokens override)

  BpeModel bpe;
  PreTokenizer pre;
  AddedTokenMatcher raw_added;         // "normalized": false, matched on the raw text
  AddedTokenMatcher normalized_added;  // "normalized": true, matched after normalization

  std::string bos_token, eos_token, chat_template;
  std::optional<int32_t> bos_id, eos_id;
  bool add_bos = false;

  void encode_plain(std::string_view text, PreTokenizer::Scratch& scratch, std::vector<Span>& words,
                    std::vector<int32_t>& ids) const {
    pre.split(text, scratch, words);
    for (const Span& w : words) bpe.encode_word(text.substr(w.begin, w.end - w.begin), ids);
  }

  void encode_unsplit(std::string_view text, PreTokenizer::Scratch& scratch,
                      std::vector<Span>& words, std::vector<int32_t>& ids) const {
    size_t pos = 0;
    AddedTokenMatcher::Match m;
    while (normalized_added.find(text, pos, &m)) {
      encode_plain(text.substr(pos, m.begin - pos), scratch, words, ids);
      ids.push_back(m.id);
      pos = m.end;
    }
    encode_plain(text.substr(pos), scratch, words, ids);
  }
};

}  // namespace moeserve
