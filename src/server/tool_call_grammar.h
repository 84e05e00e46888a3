// The grammars that make tool calls parse (docs/server.md, "Tool calls"): xgrammar structural
// tags (GrammarSpec::Kind::kStructuralTag) built from the request's tools and the chat
// template's call syntax (ToolCallFormat), so that a constrained call names one of the tools
// and its arguments meet that tool's parameters (JSON, or DSML parameters for DeepSeek-V3.2).
//
// Pure functions; thread-safe.
#pragma once

#include <optional>
#include <span>
#include <string_view>

#include "engine/grammar.h"
#include "server/tool_call_parser.h"
#include "tokenizer/chat_template.h"

namespace moeserve {

// What follows the prefill of a forced call (tool_call_prefill(named or nullopt)): a named
// call's arguments, or for `required` one of the tools' names and its arguments; then the
// call's end; for `required` with `parallel`, more calls; then the block's end (and EOS).
GrammarSpec forced_call_grammar(std::span<const ToolDefinition> tools, const ToolCallFormat& f,
                                std::optional<std::string_view> named, bool parallel);

// Free text until the model opens a block of calls (f.trigger), then calls constrained as above
// (one per block unless `parallel`; a named function is called once), and the end after the
// block. `at_least_one`: the output
// must be a block of calls (a forced call of a model that reasons first). `named`: only that
// tool. `thinking`: the output opens with free thinking up to "</think>" (the prompt opened
// <think>), at most max_tokens of it when set.
struct ThinkingBudget {
  std::optional<int64_t> max_tokens;
};
GrammarSpec triggered_call_grammar(std::span<const ToolDefinition> tools, const ToolCallFormat& f,
                                   std::optional<std::string_view> named, bool parallel,
                                   bool at_least_one,
                                   const std::optional<ThinkingBudget>& thinking = std::nullopt);

// The thinking a budget of `max_tokens` leaves room for: all but min(max_tokens / 2, 256)
// tokens, kept for the calls or the answer.
int64_t thinking_budget(int64_t max_tokens);

}  // namespace moeserve
