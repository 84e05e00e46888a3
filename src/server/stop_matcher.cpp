#include "server/stop_matcher.h"

#include <algorithm>

namespace moeserve {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}

StopMatcher::Step StopMatcher::push(std::string_view piece) {
  Step step;
  if (stopped_) return step;
  std::string buf = std::move(held_);
  held_.clear();
  buf.append(piece);
  if (stops_.empty()) {
    step.text = std::move(buf);
    return step;
  }
  // The earliest match of any stop string wins.
  size_t first = std::string::npos;
  for (const std::string& s : stops_) {
    const size_t at = buf.find(s);
    if (at < first || (at == first && at != std::string::npos && s.size() < matched_.size())) {
      first = at;
      matched_ = s;
    }
  }
  if (first != std::string::npos) {
    stopped_ = true;
    step.stopped = true;
    buf.resize(first);
    step.text = std::move(buf);
    return step;
  }
  // Hold back the longest tail that is a proper prefix of some stop string.
  size_t keep_from = buf.size();
  for (const std::string& s : stops_) {
    size_t longest = std::min(s.size() - 1, buf.size());
    for (size_t len = longest; len > 0; --len) {
      if (std::string_view(buf).substr(buf.size() - len) == std::string_view(s).substr(0, len)) {
        keep_from = std::min(keep_from, buf.size() - len);
        break;
      }
    }
  }
  held_ = buf.substr(keep_from);
  buf.resize(keep_from);
  step.text = std::move(buf);
  return step;
}

std::string StopMatcher::finish() {
  std::string out = stopped_ ? std::string() : std::move(held_);
  held_.clear();
  return out;
}

}  // namespace moeserve
