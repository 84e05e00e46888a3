#include "grammar/xgrammar_backend.h"

#include <algorithm>
#include <bit>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include <dlpack/dlpack.h>
#include <fmt/format.h>
#include <xgrammar/xgrammar.h>
#include <nlohmann/json.hpp>

namespace moeserve {

namespace {

// OpenAI's json_object: any JSON object.
constexpr char kAnyObjectSchema[] = R"({"type": "object"})";

// xgrammar's messages, without the "[hh:mm:ss] path/file.cc:line: " it puts first.
std::string shorten(std::string s) {
  if (s.size() > 2 && s[0] == '[') {
    const size_t cc = s.find(".cc:");
    const size_t colon = cc == std::string::npos ? cc : s.find(": ", cc + 4);
    if (colon != std::string::npos) s = s.substr(colon + 2);
  }
  constexpr size_t kMax = 600;
  if (s.size() > kMax) s = s.substr(0, kMax) + "...";
  return s;
}

// The tokens that close JSON fastest, best first: EOS (where the grammar has ended); a quote
// followed only by quotes and closing brackets (inside a string the quote must come first:
// brackets there are only text; '""' is a whole string value); closing brackets alone; the
// tokens that close a block of the chat syntax around the JSON (DeepSeek's <｜tool▁call▁end｜>
// and <｜tool▁calls▁end｜>, XML closing tags such as DSML's), so that a grammar that may go on
// with another tool call ends instead; ':'; '0' (the shortest value); ',' (a required property
// still to come). Longer first within a kind: each closes more. The mask decides which of them
// is valid where. Where none of them fits (a property name, an enum value, a boolean), the
// allowed token with the most bytes that are not whitespace (it goes furthest), the one with
// less whitespace among those.
struct EndTokens {
  std::vector<int32_t> closers;  // best first
  std::vector<uint16_t> score;   // per id: 256 x non-blank bytes - blank bytes (0: none)
};

EndTokens end_tokens(const Tokenizer& tok) {
  EndTokens e;
  e.score.assign(size_t(tok.vocab_size()), 0);
  std::vector<std::pair<std::pair<int, int64_t>, int32_t>> ranked;  // ((tier, -length), id)
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    if (tok.is_special(id)) continue;
    const std::optional<std::string_view> b = tok.token_bytes(id);
    if (!b || b->empty()) continue;
    const int64_t blank = std::count_if(b->begin(), b->end(), [](char c) {
      return c == ' ' || c == '\t' || c == '\n' || c == '\r';
    });
    const int64_t solid = int64_t(b->size()) - blank;
    if (solid > 0)
      e.score[size_t(id)] =
          uint16_t(std::min<int64_t>(solid, 255) * 256 + 255 - std::min<int64_t>(blank, 255));
    int tier = -1;
    if ((*b)[0] == '"' && b->find_first_not_of("\"}]", 1) == std::string_view::npos) {
      tier = 0;
    } else if (b->find_first_not_of("}]") == std::string_view::npos) {
      tier = 1;
    } else if (b->starts_with("</") || b->ends_with("end｜>")) {
      tier = 2;
    } else if (*b == ":") {
      tier = 3;
    } else if (*b == "0") {
      tier = 4;
    } else if (*b == ",") {
      tier = 5;
    }
    if (tier >= 0) ranked.push_back({{tier, -int64_t(b->size())}, id});
  }
  std::sort(ranked.begin(), ranked.end());
  e.closers = {*tok.eos_id()};
  for (const auto& r : ranked) e.closers.push_back(r.second);
  return e;
}

class XGrammarConstraint final : public TokenConstraint {
 public:
  XGrammarConstraint(const xgrammar::CompiledGrammar& g, std::optional<int32_t> start_after,
                     std::shared_ptr<const EndTokens> end)
      : matcher_(g), start_after_(start_after), active_(!start_after), end_(std::move(end)) {}

  bool fill_mask(std::span<uint32_t> words) override {
    if (!active_) return false;
    int64_t shape[1] = {int64_t(words.size())};
    DLTensor t{};
    t.data = words.data();
    t.device = DLDevice{kDLCPU, 0};
    t.ndim = 1;
    t.dtype = DLDataType{kDLInt, 32, 1};
    t.shape = shape;
    return matcher_.FillNextTokenBitmask(&t);
  }

  bool narrow_to_end(std::span<uint32_t> words) override {
    if (!active_) return false;
    auto allowed = [&](int32_t t) { return (words[size_t(t / 32)] >> (t % 32)) & 1u; };
    // Free text that may end anywhere (a grammar's text around tool calls): nothing to close;
    // the model writes on until max_tokens.
    if (allowed(end_->closers[0])) {
      int64_t n_allowed = 0;
      for (uint32_t w : words) n_allowed += std::popcount(w);
      if (n_allowed > int64_t(end_->score.size()) / 2) return false;
    }
    for (int32_t t : end_->closers) {
      if (allowed(t)) {
        std::fill(words.begin(), words.end(), 0u);
        words[size_t(t / 32)] = 1u << (t % 32);
        return true;
      }
    }
    int32_t best = -1;
    uint16_t best_score = 0;
    const int64_t n = int64_t(end_->score.size());
    for (int64_t w = 0; w < int64_t(words.size()) && w * 32 < n; ++w) {
      for (uint32_t bits = words[size_t(w)]; bits != 0; bits &= bits - 1) {
        const int64_t t = w * 32 + std::countr_zero(bits);
        if (t < n && end_->score[size_t(t)] > best_score) {
          best = int32_t(t);
          best_score = end_->score[size_t(t)];
        }
      }
    }
    if (best < 0) return false;
    std::fill(words.begin(), words.end(), 0u);
    words[size_t(best / 32)] = 1u << (best % 32);
    return true;
  }

  bool accept(int32_t token) override {
    if (!active_) {
      active_ = token == *start_after_;
      return true;
    }
    return matcher_.AcceptToken(token);
  }

  bool ended() const override { return active_ && matcher_.IsTerminated(); }

 private:
  xgrammar::GrammarMatcher matcher_;
  std::optional<int32_t> start_after_;
  bool active_;
  std::shared_ptr<const EndTokens> end_;
};

}  // namespace

struct XGrammarBackend::Impl {
  Impl(xgrammar::TokenizerInfo info, const XGrammarOptions& o, EndTokens end)
      : options(o),
        compiler(info, o.compile_threads, /*cache_enabled=*/true, o.cache_bytes),
        end(std::make_shared<const EndTokens>(std::move(end))) {}

  // Throws what xgrammar throws for a schema it cannot compile.
  xgrammar::CompiledGrammar compile(const GrammarSpec& spec) {
    if (spec.kind == GrammarSpec::Kind::kStructuralTag) {
      return compiler.CompileStructuralTag(spec.schema);
    }
    const bool object = spec.kind == GrammarSpec::Kind::kJsonObject;
    return compiler.CompileJSONSchema(object ? std::string(kAnyObjectSchema) : spec.schema,
                                      /*any_whitespace=*/true, /*indent=*/std::nullopt,
                                      /*separators=*/std::nullopt,
                                      /*strict_mode=*/object ? false : spec.strict,
                                      options.max_whitespace);
  }

  XGrammarOptions options;
  xgrammar::GrammarCompiler compiler;
  std::shared_ptr<const EndTokens> end;
};

Result<std::unique_ptr<XGrammarBackend>> XGrammarBackend::create(const Tokenizer& tok,
                                                                 int64_t vocab_size,
                                                                 XGrammarOptions options) {
  const std::optional<int32_t> eos = tok.eos_id();
  if (!eos) return InvalidArgument("constrained decoding needs the tokenizer's EOS token");
  if (vocab_size < tok.vocab_size()) {
    return InvalidArgument(
        fmt::format("the model's vocabulary ({}) is smaller than the tokenizer's ({})", vocab_size,
                    tok.vocab_size()));
  }
  // An empty string marks a special token for xgrammar: never allowed, except the stop token.
  std::vector<std::string> vocab(size_t(tok.vocab_size()));
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    if (tok.is_special(id)) continue;
    if (std::optional<std::string_view> b = tok.token_bytes(id)) vocab[size_t(id)] = *b;
  }
  try {
    xgrammar::TokenizerInfo info(vocab, xgrammar::VocabType::RAW, int(vocab_size),
                                 std::vector<int32_t>{*eos});
    return std::unique_ptr<XGrammarBackend>(
        new XGrammarBackend(std::make_unique<Impl>(std::move(info), options, end_tokens(tok))));
  } catch (const std::exception& e) {
    return Internal(fmt::format("xgrammar rejected the vocabulary: {}", shorten(e.what())));
  }
}

XGrammarBackend::XGrammarBackend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
XGrammarBackend::~XGrammarBackend() = default;

Status XGrammarBackend::check(const GrammarSpec& spec) {
  try {
    impl_->compile(spec);
    return Status::Ok();
  } catch (const std::exception& e) {
    return InvalidArgument(fmt::format("the JSON schema cannot be used: {}", shorten(e.what())));
  }
}

Result<std::unique_ptr<TokenConstraint>> XGrammarBackend::start(const GrammarSpec& spec) {
  try {
    return std::unique_ptr<TokenConstraint>(
        std::make_unique<XGrammarConstraint>(impl_->compile(spec), spec.start_after, impl_->end));
  } catch (const std::exception& e) {
    return InvalidArgument(fmt::format("the JSON schema cannot be used: {}", shorten(e.what())));
  }
}

}  // namespace moeserve
