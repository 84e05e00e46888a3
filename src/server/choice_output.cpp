#include "server/choice_output.h"

namespace moeserve {

ChoiceOutput::ChoiceOutput(const Tokenizer& tokenizer, std::vector<std::string> stops,
                           ReasoningMode reasoning)
    : detok_(tokenizer, /*skip_special=*/true), stop_(std::move(stops)) {
  if (reasoning.split) reasoning_.emplace(reasoning.starts_in_reasoning);
}

void ChoiceOutput::emit(std::string_view text, ChoiceDelta& d) {
  if (text.empty()) return;
  if (!reasoning_) {
    d.content.append(text);
    return;
  }
  ReasoningSplitter::Parts p = reasoning_->push(text);
  d.reasoning += p.reasoning;
  d.content += p.content;
}

ChoiceDelta ChoiceOutput::on_tokens(const std::vector<GeneratedToken>& tokens) {
  ChoiceDelta d;
  if (finished()) return d;
  for (const GeneratedToken& t : tokens) {
    ++completion_tokens_;
    d.tokens.push_back(t);
    StopMatcher::Step s = stop_.push(detok_.push(t.id));
    emit(s.text, d);
    if (s.stopped) {
      if (reasoning_) {
        ReasoningSplitter::Parts p = reasoning_->finish();
        d.reasoning += p.reasoning;
        d.content += p.content;
      }
      finish_reason_ = "stop";
      d.finish_reason = finish_reason_;
      break;
    }
  }
  return d;
}

ChoiceDelta ChoiceOutput::on_finish(FinishReason reason) {
  ChoiceDelta d;
  if (finished()) return d;
  StopMatcher::Step s = stop_.push(detok_.finish());
  emit(s.text, d);
  if (!s.stopped) emit(stop_.finish(), d);
  if (reasoning_) {
    ReasoningSplitter::Parts p = reasoning_->finish();
    d.reasoning += p.reasoning;
    d.content += p.content;
  }
  if (s.stopped) {
    finish_reason_ = "stop";
  } else {
    switch (reason) {
      case FinishReason::kStop:
        finish_reason_ = "stop";
        break;
      case FinishReason::kLength:
        finish_reason_ = "length";
        break;
      default:
        finish_reason_ = "abort";
        break;
    }
  }
  d.finish_reason = finish_reason_;
  return d;
}

}  // namespace moeserve
