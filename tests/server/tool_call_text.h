// DeepSeek-V3's tool-call tokens and a call as the model writes it, for the tool-call tests
// (spelled out here rather than taken from the parser, so a typo there is caught). Test-only.
#pragma once

#include <string>

namespace moeserve::testing {

inline const std::string kCallsBegin = "<｜tool▁calls▁begin｜>";
inline const std::string kCallsEnd = "<｜tool▁calls▁end｜>";
inline const std::string kCallBegin = "<｜tool▁call▁begin｜>";
inline const std::string kCallEnd = "<｜tool▁call▁end｜>";
inline const std::string kSep = "<｜tool▁sep｜>";

inline std::string call(const std::string& name, const std::string& args) {
  return kCallBegin + "function" + kSep + name + "\n```json\n" + args + "\n```" + kCallEnd;
}

}  // namespace moeserve::testing
