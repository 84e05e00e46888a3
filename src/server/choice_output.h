// ChoiceOutput: turns the token stream of one choice (one engine request) into the text the API
// returns: incremental detokenization (special tokens skipped), stop strings (matched on the
// text, across token boundaries; the stop string is not returned) and, for R1-style models,
// the split between reasoning_content and content, and tool calls parsed out of the content.
//
// One instance per choice, used by the thread that serves the HTTP request; not thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/reasoning_splitter.h"
#include "server/stop_matcher.h"
#include "server/tool_call_parser.h"
#include "tokenizer/detokenizer.h"

namespace moeserve {

struct ChoiceDelta {
  std::string reasoning;                  // reasoning_content text
  std::string content;                    // answer text
  std::vector<ToolCallDelta> tool_calls;  // in order; a call's opening delta comes first
  std::vector<GeneratedToken> tokens;     // the tokens this delta accounts for (logprobs)
  // "stop" | "length" | "abort" | "tool_calls" (a stop after >= 1 call), on the last delta
  std::optional<std::string> finish_reason;
};

struct ReasoningMode {
  bool split = false;                // separate <think>...</think> into reasoning_content
  bool starts_in_reasoning = false;  // the prompt opened <think>
};

struct ToolCallMode {
  bool parse = false;                // the request has tools and tool_choice is not "none"
  std::optional<int64_t> max_calls;  // parallel_tool_calls false: 1
  std::string prefill;               // the call the prompt opened (tool_choice required/named)
  ToolCallSyntax syntax = ToolCallSyntax::kV3;  // the chat template's
};

class ChoiceOutput {
 public:
  ChoiceOutput(const Tokenizer& tokenizer, std::vector<std::string> stops, ReasoningMode reasoning,
               const ToolCallMode& tools = {});

  // Tokens from one engine callback. When a stop string completes, the delta has
  // finish_reason "stop", the remaining tokens are dropped, and stopped_by_string() turns true:
  // the caller then cancels the engine request.
  ChoiceDelta on_tokens(std::span<const GeneratedToken> tokens);
  // The engine finished the request (kError is the caller's to report). Flushes held-back text.
  // Nothing happens if the choice already finished on a stop string.
  ChoiceDelta on_finish(FinishReason reason);

  bool finished() const { return finish_reason_.has_value(); }
  bool stopped_by_string() const { return stop_.stopped(); }
  const std::optional<std::string>& finish_reason() const { return finish_reason_; }
  int64_t completion_tokens() const { return completion_tokens_; }
  // Of those, the tokens of the thinking block (its tags included).
  int64_t reasoning_tokens() const { return reasoning_tokens_; }
  // The stop string that ended the choice (empty when none did).
  const std::string& stop_string() const { return stop_.matched(); }

 private:
  void emit(std::string_view text, ChoiceDelta& d);
  void add_content(std::string_view content, ChoiceDelta& d);
  void flush(ChoiceDelta& d);  // end of text: releases what the splitter and parser hold
  void finish_as(std::string reason, ChoiceDelta& d);

  IncrementalDetokenizer detok_;
  StopMatcher stop_;
  std::optional<ReasoningSplitter> reasoning_;
  std::optional<ToolCallParser> tools_;
  std::vector<ToolCallDelta> prefilled_;  // the prefill's opening delta, sent with the first
  std::optional<std::string> finish_reason_;
  int64_t completion_tokens_ = 0;
  int64_t reasoning_tokens_ = 0;
};

}  // namespace moeserve
