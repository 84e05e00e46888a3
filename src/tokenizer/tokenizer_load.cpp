#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer_impl.h"

namespace moeserve {

using json = nlohmann::json;

namespace {

Result<std::string> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return NotFound(path + ": cannot open");
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return IOError(path + ": read failed");
  return std::move(ss).str();
}

// A token field of tokenizer_config.json: a string or an AddedToken object {"content": ...}.
std::string token_field(const json& cfg, const char* key) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return "";
}

Status parse_pre_tokenizer(const json& j, PreTokenizer& pre) {
  if (j.is_null()) return Status::Ok();
  const std::string type = j.value("type", "");
  if (type == "Sequence") {
    for (const json& sub : j.at("pretokenizers")) RETURN_IF_ERROR(parse_pre_tokenizer(sub, pre));
    return Status::Ok();
  }
  if (type == "Split") {
    const json& pat = j.at("pattern");
    std::string regex;
    if (pat.contains("Regex")) {
      regex = pat["Regex"].get<std::string>();
    } else if (pat.contains("String")) {
      regex = "\\Q" + pat["String"].get<std::string>() + "\\E";
    } else {
      return Corrupt("pre_tokenizer Split: pattern is neither Regex nor String");
    }
    const std::string b = j.value("behavior", "");
    SplitBehavior behavior;
    if (b == "Isolated")
      behavior = SplitBehavior::kIsolated;
    else if (b == "Removed")
      behavior = SplitBehavior::kRemoved;
    else if (b == "MergedWithPrevious")
      behavior = SplitBehavior::kMergedWithPrevious;
    else if (b == "MergedWithNext")
      behavior = SplitBehavior::kMergedWithNext;
    else if (b == "Contiguous")
      behavior = SplitBehavior::kContiguous;
    else
      return Corrupt("pre_tokenizer Split: unknown behavior '" + b + "'");
    ASSIGN_OR_RETURN(Regex re, Regex::compile(regex));
    pre.add_step({std::move(re), behavior, j.value("invert", false)});
    return Status::Ok();
  }
  if (type == "ByteLevel") {
    if (j.value("add_prefix_space", false)) {
      return Unimplemented("pre_tokenizer ByteLevel with add_prefix_space=true");
    }
    if (j.value("use_regex", true)) {
      ASSIGN_OR_RETURN(Regex re, Regex::compile(kGpt2SplitPattern));
      pre.add_step({std::move(re), SplitBehavior::kIsolated, false});
    }
    return Status::Ok();
  }
  return Unimplemented("pre_tokenizer type '" + type + "'");
}

Status check_normalizer(const json& j) {
  if (j.is_null()) return Status::Ok();
  if (j.value("type", "") == "Sequence") {
    for (const json& sub : j.at("normalizers")) RETURN_IF_ERROR(check_normalizer(sub));
    return Status::Ok();
  }
  return Unimplemented("normalizer type '" + j.value("type", "") + "'");
}

Status check_decoder(const json& j) {
  const std::string type = j.is_null() ? "null" : j.value("type", "");
  if (type == "ByteLevel") return Status::Ok();
  if (type == "Sequence") {
    for (const json& sub : j.at("decoders")) RETURN_IF_ERROR(check_decoder(sub));
    return Status::Ok();
  }
  return Unimplemented("decoder type '" + type + "' (only ByteLevel)");
}

// What HF's ByteLevel decoder makes of a token string: its bytes if every character is in the
// byte-level alphabet, else the string's own UTF-8 (added tokens such as <｜User｜>).
std::string decoder_bytes(const std::string& form) {
  if (auto raw = byte_level::to_bytes(form)) return *std::move(raw);
  return form;
}

// The model's vocabulary and merges (95% of a tokenizer.json) as read by StreamingReader.
struct VocabAndMerges {
  std::vector<std::pair<std::string, int64_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;  // "a b" strings are split later
  std::vector<uint8_t> merge_is_pair;                       // 1: given as ["a", "b"]
  bool saw_vocab = false, saw_merges = false;
};

// SAX handler that builds an ordinary json DOM for everything except model.vocab and
// model.merges, which it streams into flat vectors: a DOM of 128k-entry std::map nodes made
// loading several times slower than the 0.5 s budget.
class StreamingReader : public nlohmann::json_sax<json> {
 public:
  json root;
  VocabAndMerges vm;
  std::string error;

  bool null() override { return value(json(nullptr)); }
  bool boolean(bool v) override { return value(json(v)); }
  bool number_integer(number_integer_t v) override {
    if (mode_ == Mode::kVocab) {
      vm.vocab.emplace_back(std::move(key_), v);
      return true;
    }
    return value(json(v));
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (mode_ == Mode::kVocab) {
      vm.vocab.emplace_back(std::move(key_), static_cast<int64_t>(v));
      return true;
    }
    return value(json(v));
  }
  bool number_float(number_float_t v, const string_t&) override { return value(json(v)); }
  bool string(string_t& v) override {
    if (mode_ == Mode::kMerges) {
      vm.merges.emplace_back(std::move(v), std::string());
      vm.merge_is_pair.push_back(0);
      return true;
    }
    if (mode_ == Mode::kMergePair) {
      if (pair_n_ == 0)
        vm.merges.back().first = std::move(v);
      else if (pair_n_ == 1)
        vm.merges.back().second = std::move(v);
      ++pair_n_;
      return true;
    }
    return value(json(std::move(v)));
  }
  bool binary(binary_t&) override { return fail("binary values are not JSON"); }
  bool key(string_t& k) override {
    key_ = std::move(k);
    return true;
  }
  bool start_object(std::size_t) override {
    if (mode_ != Mode::kDom) return fail("unexpected object in model.vocab/merges");
    if (at_model() && key_ == "vocab") {
      mode_ = Mode::kVocab;
      vm.saw_vocab = true;
      return true;
    }
    return open(json::object());
  }
  bool end_object() override {
    if (mode_ == Mode::kVocab) {
      mode_ = Mode::kDom;
      return true;
    }
    return close();
  }
  bool start_array(std::size_t) override {
    if (mode_ == Mode::kMerges) {
      mode_ = Mode::kMergePair;
      pair_n_ = 0;
      vm.merges.emplace_back();
      vm.merge_is_pair.push_back(1);
      return true;
    }
    if (mode_ != Mode::kDom) return fail("unexpected array in model.vocab/merges");
    if (at_model() && key_ == "merges") {
      mode_ = Mode::kMerges;
      vm.saw_merges = true;
      return true;
    }
    return open(json::array());
  }
  bool end_array() override {
    if (mode_ == Mode::kMergePair) {
      mode_ = Mode::kMerges;
      if (pair_n_ != 2) return fail("a merge given as an array must have two strings");
      return true;
    }
    if (mode_ == Mode::kMerges) {
      mode_ = Mode::kDom;
      return true;
    }
    return close();
  }
  bool parse_error(std::size_t pos, const std::string&,
                   const nlohmann::detail::exception& e) override {
    return fail("byte " + std::to_string(pos) + ": " + e.what());
  }

 private:
  enum class Mode { kDom, kVocab, kMerges, kMergePair };

  bool fail(std::string m) {
    if (error.empty()) error = std::move(m);
    return false;
  }
  // Directly inside the top-level "model" object.
  bool at_model() const { return stack_.size() == 2 && names_[1] == "model"; }
  json* add(json v) {
    if (stack_.empty()) {
      root = std::move(v);
      return &root;
    }
    json& top = *stack_.back();
    if (top.is_array()) {
      top.push_back(std::move(v));
      return &top.back();
    }
    json& slot = top[key_];
    slot = std::move(v);
    return &slot;
  }
  bool value(json v) {
    if (mode_ != Mode::kDom) return fail("unexpected value in model.vocab/merges");
    add(std::move(v));
    return true;
  }
  bool open(json v) {
    const std::string name = (!stack_.empty() && stack_.back()->is_object()) ? key_ : "";
    stack_.push_back(add(std::move(v)));
    names_.push_back(name);
    return true;
  }
  bool close() {
    stack_.pop_back();
    names_.pop_back();
    return true;
  }

  Mode mode_ = Mode::kDom;
  std::vector<json*> stack_;
  std::vector<std::string> names_;  // key of each open container in its parent ("" in arrays)
  std::string key_;
  int pair_n_ = 0;
};

}  // namespace

struct TokenizerLoader {
  static Result<Tokenizer> build(const json& tj, VocabAndMerges& vm, const json& cfg);
};

Result<Tokenizer> TokenizerLoader::build(const json& tj, VocabAndMerges& vm, const json& cfg) {
  auto impl = std::make_shared<Tokenizer::Impl>();
  Tokenizer::Impl& im = *impl;

  if (!tj.contains("model") || !tj["model"].is_object()) return Corrupt("no \"model\" object");
  RETURN_IF_ERROR(check_normalizer(tj.value("normalizer", json())));
  RETURN_IF_ERROR(check_decoder(tj.value("decoder", json())));
  RETURN_IF_ERROR(parse_pre_tokenizer(tj.value("pre_tokenizer", json()), im.pre));

  const json& model = tj.at("model");
  if (model.value("type", "BPE") != "BPE") {
    return Unimplemented("model type '" + model.value("type", "") + "' (only BPE)");
  }
  if (model.value("byte_fallback", false)) return Unimplemented("BPE byte_fallback");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(k) && model[k].is_string() && !model[k].get<std::string>().empty()) {
      return Unimplemented(std::string("BPE ") + k);
    }
  }
  if (model.contains("dropout") && model["dropout"].is_number() && model["dropout"] != 0) {
    return Unimplemented("BPE dropout");
  }

  // Vocabulary (id -> form), then added tokens, which take precedence for the same id.
  std::vector<std::string> forms;
  std::vector<uint8_t> flags;
  auto set_form = [&](int64_t id, std::string form) -> Status {
    if (id < 0 || id > (int64_t{1} << 30))
      return Corrupt("token id " + std::to_string(id) + " out of range");
    if (static_cast<size_t>(id) >= forms.size()) {
      forms.resize(id + 1);
      flags.resize(id + 1, 0);
    }
    forms[id] = std::move(form);
    flags[id] = Tokenizer::Impl::kKnown;
    return Status::Ok();
  };
  if (!vm.saw_vocab) return Corrupt("model.vocab is missing or not an object");
  if (!vm.saw_merges) return Corrupt("model.merges is missing or not an array");
  // Model vocabulary only, for the BPE tables.
  StringIdMap model_vocab;
  model_vocab.reserve(vm.vocab.size());
  for (const auto& [form, id] : vm.vocab) {
    RETURN_IF_ERROR(set_form(id, form));
    model_vocab.insert(form, static_cast<int32_t>(id));
  }
  im.form_to_id = model_vocab;

  for (const json& a : tj.value("added_tokens", json::array())) {
    const int64_t id = a.at("id").get<int64_t>();
    const std::string content = a.at("content").get<std::string>();
    if (content.empty()) return Corrupt("added token " + std::to_string(id) + " is empty");
    for (const char* k : {"lstrip", "rstrip", "single_word"}) {
      if (a.value(k, false))
        return Unimplemented(std::string("added token with ") + k + ": " + content);
    }
    const bool special = a.value("special", false);
    RETURN_IF_ERROR(set_form(id, content));
    if (special) flags[id] |= Tokenizer::Impl::kSpecial;
    im.form_to_id.insert(content, static_cast<int32_t>(id));
    (a.value("normalized", !special) ? im.normalized_added : im.raw_added)
        .add(content, static_cast<int32_t>(id));
  }

  // BPE tables over raw bytes.
  std::vector<std::optional<int32_t>> byte_ids(256);
  const bool ignore_merges = model.value("ignore_merges", false);
  std::vector<std::pair<std::string, int32_t>> words;  // only needed with ignore_merges
  for (const auto& [form, id] : vm.vocab) {
    if (form.size() > 2 && !ignore_merges) continue;  // one byte is at most 2 UTF-8 bytes
    if (auto raw = byte_level::to_bytes(form)) {
      if (raw->size() == 1) byte_ids[static_cast<uint8_t>((*raw)[0])] = static_cast<int32_t>(id);
      if (ignore_merges) words.emplace_back(*std::move(raw), static_cast<int32_t>(id));
    }
  }
  std::vector<BpeModel::Merge> merges;
  merges.reserve(vm.merges.size());
  std::string joined;
  for (size_t i = 0; i < vm.merges.size(); ++i) {
    std::string_view a = vm.merges[i].first, b = vm.merges[i].second;
    if (!vm.merge_is_pair[i]) {
      const std::string_view s = a;
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
        return Corrupt("merge '" + std::string(s) + "' is not two tokens separated by one space");
      }
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    }
    joined.assign(a);
    joined.append(b);
    auto ia = model_vocab.find(a), ib = model_vocab.find(b), ir = model_vocab.find(joined);
    if (!ia || !ib || !ir) {
      return Corrupt("merge '" + std::string(a) + " " + std::string(b) +
                     "' uses a token missing from the vocabulary");
    }
    merges.push_back({*ia, *ib, *ir});
  }
  ASSIGN_OR_RETURN(im.bpe, BpeModel::build(byte_ids, merges, std::move(words), ignore_merges));

  // Flatten per-id strings.
  im.flags = std::move(flags);
  im.bytes_off.assign(1, 0);
  im.form_off.assign(1, 0);
  for (size_t id = 0; id < forms.size(); ++id) {
    im.form_blob += forms[id];
    if (im.flags[id]) im.bytes_blob += decoder_bytes(forms[id]);
    im.bytes_off.push_back(static_cast<uint32_t>(im.bytes_blob.size()));
    im.form_off.push_back(static_cast<uint32_t>(im.form_blob.size()));
  }

  // tokenizer_config.json.
  if (cfg.is_object()) {
    im.bos_token = token_field(cfg, "bos_token");
    im.eos_token = token_field(cfg, "eos_token");
    im.add_bos = cfg.value("add_bos_token", false);
    if (auto it = cfg.find("chat_template"); it != cfg.end()) {
      if (it->is_string()) {
        im.chat_template = it->get<std::string>();
      } else if (it->is_array()) {  // [{"name": ..., "template": ...}]: take "default"
        for (const json& t : *it) {
          if (t.value("name", "") == "default" || im.chat_template.empty()) {
            im.chat_template = t.value("template", "");
          }
        }
      }
    }
  }
  auto lookup = [&](const std::string& tok) -> std::optional<int32_t> {
    if (tok.empty()) return std::nullopt;
    return im.form_to_id.find(tok);
  };
  im.bos_id = lookup(im.bos_token);
  im.eos_id = lookup(im.eos_token);
  if (!im.bos_token.empty() && !im.bos_id)
    return Corrupt("bos_token '" + im.bos_token + "' is not in the vocabulary");
  if (!im.eos_token.empty() && !im.eos_id)
    return Corrupt("eos_token '" + im.eos_token + "' is not in the vocabulary");

  Tokenizer t;
  t.impl_ = std::move(impl);
  return t;
}

Result<Tokenizer> Tokenizer::from_json(std::string_view tokenizer_json,
                                       std::string_view config_json, const std::string& origin) {
  StreamingReader reader;
  const bool parsed = json::sax_parse(tokenizer_json, &reader, json::input_format_t::json,
                                      /*strict=*/true, /*ignore_comments=*/false);
  if (!parsed || !reader.error.empty()) {
    return Corrupt(origin + ": not valid JSON (" + reader.error + ")");
  }
  if (!reader.root.is_object()) return Corrupt(origin + ": not a JSON object");
  json cfg;
  if (!config_json.empty()) {
    cfg = json::parse(config_json, nullptr, false);
    if (cfg.is_discarded() || !cfg.is_object()) {
      return Corrupt(origin + ": tokenizer_config.json is not a JSON object");
    }
  }
  try {
    Result<Tokenizer> t = TokenizerLoader::build(reader.root, reader.vm, cfg);
    if (!t.ok()) return t.status().with_context(origin);
    return t;
  } catch (const json::exception& e) {  // a missing or mistyped field
    return Corrupt(origin + ": " + e.what());
  }
}

Result<Tokenizer> Tokenizer::load(const std::string& dir) {
  const std::string tpath = dir + "/tokenizer.json";
  ASSIGN_OR_RETURN(std::string tj, read_file(tpath));
  std::string cj;
  if (std::ifstream(dir + "/tokenizer_config.json").good()) {
    ASSIGN_OR_RETURN(cj, read_file(dir + "/tokenizer_config.json"));
  }
  return from_json(tj, cj, tpath);
}

}  // namespace moeserve
