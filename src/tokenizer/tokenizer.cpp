#include "tokenizer/tokenizer.h"

#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace moeserve {

void Tokenizer::encode_append(std::string_view text, std::vector<int32_t>& ids) const {
  const Impl& im = *impl_;
  std::string repaired;
  if (!utf8::is_valid(text)) {
    repaired = utf8::lossy(text);
    text = repaired;
  }
  PreTokenizer::Scratch scratch(im.pre);
  std::vector<Span> words;
  size_t pos = 0;
  AddedTokenMatcher::Match m;
  while (im.raw_added.find(text, pos, &m)) {
    im.encode_unsplit(text.substr(pos, m.begin - pos), scratch, words, ids);
    ids.push_back(m.id);
    pos = m.end;
  }
  im.encode_unsplit(text.substr(pos), scratch, words, ids);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 2);
  if (add_bos && impl_->bos_id) ids.push_back(*impl_->bos_id);
  encode_append(text, ids);
  return ids;
}

std::optional<std::string_view> Tokenizer::token_bytes(int32_t id) const {
  const Impl& im = *impl_;
  if (id < 0 || static_cast<size_t>(id) >= im.flags.size() || !im.flags[id]) return std::nullopt;
  return std::string_view(im.bytes_blob)
      .substr(im.bytes_off[id], im.bytes_off[id + 1] - im.bytes_off[id]);
}

std::optional<std::string_view> Tokenizer::id_to_token(int32_t id) const {
  const Impl& im = *impl_;
  if (id < 0 || static_cast<size_t>(id) >= im.flags.size() || !im.flags[id]) return std::nullopt;
  return std::string_view(im.form_blob)
      .substr(im.form_off[id], im.form_off[id + 1] - im.form_off[id]);
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  return impl_->form_to_id.find(token);
}

bool Tokenizer::is_special(int32_t id) const {
  const Impl& im = *impl_;
  return id >= 0 && static_cast<size_t>(id) < im.flags.size() && (im.flags[id] & Impl::kSpecial);
}

int32_t Tokenizer::vocab_size() const {
  return static_cast<int32_t>(impl_->flags.size());
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (skip_special && is_special(id)) continue;
    if (auto b = token_bytes(id)) bytes.append(*b);
  }
  return utf8::lossy(bytes);
}

std::optional<int32_t> Tokenizer::bos_id() const {
  return impl_->bos_id;
}
std::optional<int32_t> Tokenizer::eos_id() const {
  return impl_->eos_id;
}
const std::string& Tokenizer::bos_token() const {
  return impl_->bos_token;
}
const std::string& Tokenizer::eos_token() const {
  return impl_->eos_token;
}
const std::string& Tokenizer::chat_template() const {
  return impl_->chat_template;
}
bool Tokenizer::default_add_bos() const {
  return impl_->add_bos;
}
const BpeModel& Tokenizer::bpe() const {
  return impl_->bpe;
}

}  // namespace moeserve
