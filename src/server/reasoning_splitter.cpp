#include "server/reasoning_splitter.h"

#include <algorithm>

#include "server/text_scan.h"

namespace moeserve {

namespace {
constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";

}  // namespace

ReasoningSplitter::ReasoningSplitter(bool starts_in_reasoning)
    : state_(starts_in_reasoning ? State::kReasoning : State::kStart) {}

ReasoningSplitter::Parts ReasoningSplitter::push(std::string_view piece) {
  Parts out;
  std::string buf = std::move(held_);
  held_.clear();
  buf.append(piece);
  if (state_ == State::kStart) {
    if (buf.size() < kOpen.size() && kOpen.substr(0, buf.size()) == buf) {
      held_ = std::move(buf);  // could still become "<think>"
      return out;
    }
    if (buf.starts_with(kOpen)) {
      state_ = State::kReasoning;
      buf.erase(0, kOpen.size());
    } else {
      state_ = State::kContent;
    }
  }
  if (state_ == State::kReasoning) {
    size_t close = buf.find(kClose);
    if (close != std::string::npos) {
      out.reasoning = buf.substr(0, close);
      state_ = State::kContent;
      buf.erase(0, close + kClose.size());
    } else {
      size_t keep = partial_tail(buf, {kClose});
      held_ = buf.substr(buf.size() - keep);
      buf.resize(buf.size() - keep);
      out.reasoning = std::move(buf);
      return out;
    }
  }
  out.content = std::move(buf);
  return out;
}

ReasoningSplitter::Parts ReasoningSplitter::finish() {
  Parts out;
  if (state_ == State::kReasoning) {
    out.reasoning = std::move(held_);
  } else {
    out.content = std::move(held_);
  }
  held_.clear();
  return out;
}

}  // namespace moeserve
