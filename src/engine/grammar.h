// Grammar-constrained decoding (docs/structured-outputs.md): what a request asks for
// (GrammarSpec, plain data that travels with the request to the rank that serves it), the state
// one sequence keeps while it decodes under it (TokenConstraint), and the backend that turns the
// one into the other (GrammarBackend; src/grammar implements it on xgrammar). The engine depends
// only on these interfaces.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "core/status.h"

namespace moeserve {

struct GrammarSpec {
  enum class Kind : uint8_t {
    kJsonObject,  // any JSON object (OpenAI's response_format json_object)
    kJsonSchema,  // a JSON Schema (response_format json_schema)
    // xgrammar's structural tag (its JSON format: formats such as sequence, or, tag,
    // triggered_tags, json_schema): what the server builds to constrain tool calls to the
    // template's syntax, the request's tools and their parameters (server/tool_call_grammar.h).
    kStructuralTag,
  };
  Kind kind = Kind::kJsonObject;
  std::string schema;   // kJsonSchema: the schema's JSON text; kStructuralTag: the tag's
  bool strict = false;  // kJsonSchema: properties the schema does not name are not allowed
  // The constraint starts after this token (a reasoning model's end of thinking); before it the
  // model writes freely. nullopt: from the first generated token.
  std::optional<int32_t> start_after;
  friend bool operator==(const GrammarSpec&, const GrammarSpec&) = default;
};

// One sequence's position in its grammar. Used by one thread at a time (the engine's step
// thread), like the rest of a sequence's state.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Clears the bits of the tokens that may not come next: bit (t % 32) of words[t / 32] for
  // token t; `words` covers the vocabulary and holds all ones on entry. Returns false when it
  // cleared nothing (every token may come next), so the caller can skip applying it.
  virtual bool fill_mask(std::span<uint32_t> words) = 0;
  // Near the end of the token budget: narrows a filled mask to one token on a short way to the
  // grammar's end (one that closes open structures, a quote or a bracket; where none fits, the
  // longest allowed that is not whitespace), so that the output still parses when max_tokens
  // comes. False (mask unchanged) when it has nothing to narrow to.
  virtual bool narrow_to_end(std::span<uint32_t> words) = 0;
  // Moves past `token`. False (and no change) when the grammar does not allow it there.
  virtual bool accept(int32_t token) = 0;
  // Whether the grammar has ended (a stop token was accepted): nothing more may come.
  virtual bool ended() const = 0;
};

// Compiles specs and starts constraints. Thread-safe; compiled grammars are cached, so a spec
// checked once starts quickly.
class GrammarBackend {
 public:
  virtual ~GrammarBackend() = default;
  // InvalidArgument, with the reason, when the spec cannot be compiled (a malformed or
  // unsupported schema). Compiles it into the cache otherwise.
  virtual Status check(const GrammarSpec& spec) = 0;
  virtual Result<std::unique_ptr<TokenConstraint>> start(const GrammarSpec& spec) = 0;
};

}  // namespace moeserve
