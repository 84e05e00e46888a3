// DeepSeek's tool-call tokens and a call as the V3 and V3.1 models write it, for the tool-call
// tests (spelled out here rather than taken from the parser, so a typo there is caught). Test-only.
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

// DeepSeek-V3.1's form: no type, no fences.
inline std::string call_v3_1(const std::string& name, const std::string& args) {
  return kCallBegin + name + kSep + args + kCallEnd;
}

}  // namespace moeserve::testing
