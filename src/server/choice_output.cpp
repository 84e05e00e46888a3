#include "server/choice_output.h"

namespace moeserve {

namespace {
void append_calls(std::vector<ToolCallDelta>& calls, std::vector<ToolCallDelta>& out) {
  for (ToolCallDelta& c : calls) {
    if (!c.opens && !out.empty() && out.back().index == c.index) {
      out.back().arguments += c.arguments;  // one fragment per delta and call
    } else {
      out.push_back(std::move(c));
    }
  }
}
}  // namespace

ChoiceOutput::ChoiceOutput(const Tokenizer& tokenizer, std::vector<std::string> stops,
                           ReasoningMode reasoning, const ToolCallMode& tools)
    : detok_(tokenizer, /*skip_special=*/true), stop_(std::move(stops)) {
  if (reasoning.split) reasoning_.emplace(reasoning.starts_in_reasoning);
  if (tools.parse) {
    tools_.emplace(tools.max_calls, tools.syntax);
    ToolCallParser::Parts p = tools_->push(tools.prefill);
    prefilled_ = std::move(p.calls);  // the prefill is inside a call: no content
  }
}

void ChoiceOutput::emit(std::string_view text, ChoiceDelta& d) {
  if (text.empty()) return;
  if (!reasoning_) {
    add_content(text, d);
    return;
  }
  ReasoningSplitter::Parts p = reasoning_->push(text);
  d.reasoning += p.reasoning;
  add_content(p.content, d);
}

void ChoiceOutput::add_content(std::string_view content, ChoiceDelta& d) {
  if (!tools_) {
    d.content.append(content);
    return;
  }
  if (content.empty()) return;
  ToolCallParser::Parts p = tools_->push(content);
  d.content += p.content;
  append_calls(p.calls, d.tool_calls);
}

void ChoiceOutput::flush(ChoiceDelta& d) {
  if (reasoning_) {
    ReasoningSplitter::Parts p = reasoning_->finish();
    d.reasoning += p.reasoning;
    add_content(p.content, d);
  }
  if (tools_) {
    ToolCallParser::Parts p = tools_->finish();
    d.content += p.content;
    append_calls(p.calls, d.tool_calls);
  }
}

void ChoiceOutput::finish_as(std::string reason, ChoiceDelta& d) {
  // A model that stopped after calling tools hands the turn to the client.
  if (reason == "stop" && tools_ && tools_->calls() > 0) reason = "tool_calls";
  finish_reason_ = std::move(reason);
  d.finish_reason = finish_reason_;
}

ChoiceDelta ChoiceOutput::on_tokens(std::span<const GeneratedToken> tokens) {
  ChoiceDelta d;
  if (finished()) return d;
  append_calls(prefilled_, d.tool_calls);
  prefilled_.clear();
  for (const GeneratedToken& t : tokens) {
    ++completion_tokens_;
    d.tokens.push_back(t);
    const bool was_reasoning = reasoning_ && reasoning_->in_reasoning();
    StopMatcher::Step s = stop_.push(detok_.push(t.id));
    emit(s.text, d);
    if (was_reasoning || (reasoning_ && reasoning_->in_reasoning())) ++reasoning_tokens_;
    if (s.stopped) {
      flush(d);
      finish_as("stop", d);
      break;
    }
  }
  return d;
}

ChoiceDelta ChoiceOutput::on_finish(FinishReason reason) {
  ChoiceDelta d;
  if (finished()) return d;
  append_calls(prefilled_, d.tool_calls);
  prefilled_.clear();
  StopMatcher::Step s = stop_.push(detok_.finish());
  emit(s.text, d);
  if (!s.stopped) emit(stop_.finish(), d);
  flush(d);
  if (s.stopped || reason == FinishReason::kStop) {
    finish_as("stop", d);
  } else {
    finish_as(reason == FinishReason::kLength ? "length" : "abort", d);
  }
  return d;
}

}  // namespace moeserve
