// ToolCallParser: finds DeepSeek tool calls in generated text that arrives in pieces, for the
// chat API's `tool_calls`. DeepSeek-V3, R1 and their 0324/0528 revisions (ToolCallSyntax::kV3)
// write
//
//   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>
//   \n<｜tool▁call▁begin｜>...<｜tool▁call▁end｜><｜tool▁calls▁end｜>
//
// and DeepSeek-V3.1 (kV3_1), without a type or fences, calls chained without separators:
//
//   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜><｜tool▁call▁begin｜>...<｜tool▁calls▁end｜>
//
// DeepSeek-V3.2 (kDsml) writes its DSML syntax instead, and its arguments are built from
// parameters: server/dsml_tool_calls.h; DeepSeek-V4 (kDsmlV4) the same in a block named
// <｜DSML｜tool_calls> instead of <｜DSML｜function_calls>.
//
// Text outside a calls block is content; the tokens never reach the content. Inside a block,
// text between calls is dropped. A call's header ends at the first "\n" (kV3: it is
// TYPE<｜tool▁sep｜>NAME, or NAME alone with the type "function") or at the first
// <｜tool▁sep｜> (kV3_1: it is NAME); its arguments are the text after the header, without a
// leading "```json\n" and without a "\n```" just before <｜tool▁call▁end｜> (or
// <｜tool▁calls▁end｜>, which also ends the block), so V3.1 arguments the model fenced anyway
// come out bare. A call with an empty name is dropped, as are calls beyond `max_calls`. Text cut
// short (max_tokens) keeps what arrived: a header without its end is the whole name, arguments
// run to the end.
//
// parse_tool_calls() is the one-shot reference; ToolCallParser gives the same content and calls
// for every way of cutting the text into pieces, even inside a token's UTF-8 bytes (tests check
// it exhaustively). It holds back text that may be the start of a token, and a call's first
// delta (its name) waits for the header's "\n". One instance per choice; not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moeserve {

enum class ToolCallSyntax { kV3, kV3_1, kDsml, kDsmlV4 };

class DsmlParser;

struct ParsedToolCall {
  std::string type;
  std::string name;
  std::string arguments;  // JSON text as the model wrote it
  bool operator==(const ParsedToolCall&) const = default;
};

struct ParsedToolCalls {
  std::string content;  // text outside the calls
  std::vector<ParsedToolCall> calls;
};

// One piece of a call, in order: the first for each index has `opens` set, with type and name;
// arguments arrive in fragments (possibly empty on the opening delta).
struct ToolCallDelta {
  int64_t index = 0;
  bool opens = false;
  std::string type;  // set when opens
  std::string name;  // set when opens
  std::string arguments;
};

// How a syntax writes a block of calls, for the grammars that constrain calls
// (server/tool_call_grammar.h): calls_begin, then calls each call_begin(name) + arguments +
// call_end joined by `separator`, then calls_end. `trigger` starts the block in free text (for
// DSML the "\n\n" before it is free text); `xml`: the arguments are DSML parameters, not JSON.
// tool_call_prefill(name) is calls_begin + call_begin(name).
struct ToolCallFormat {
  std::string calls_begin, call_end, separator, calls_end, trigger;
  bool xml = false;
  ToolCallSyntax syntax = ToolCallSyntax::kV3;
  std::string call_begin(std::string_view name) const;
};
ToolCallFormat tool_call_format(ToolCallSyntax syntax);

// The start of a call, for a prompt that forces one (tool_choice): up to where the name goes,
// or with `name` up to the arguments. The parser is fed the same text before the model's.
std::string tool_call_prefill(std::optional<std::string_view> name,
                              ToolCallSyntax syntax = ToolCallSyntax::kV3);

ParsedToolCalls parse_tool_calls(std::string_view text,
                                 std::optional<int64_t> max_calls = std::nullopt,
                                 ToolCallSyntax syntax = ToolCallSyntax::kV3);

class ToolCallParser {
 public:
  explicit ToolCallParser(std::optional<int64_t> max_calls = std::nullopt,
                          ToolCallSyntax syntax = ToolCallSyntax::kV3);
  ~ToolCallParser();
  ToolCallParser(ToolCallParser&&) noexcept;
  ToolCallParser& operator=(ToolCallParser&&) noexcept;

  struct Parts {
    std::string content;
    std::vector<ToolCallDelta> calls;
  };
  Parts push(std::string_view piece);
  // End of the text: releases what is held back (a cut-short call keeps what arrived).
  Parts finish();

  // Calls opened so far (their first delta was returned).
  int64_t calls() const;

 private:
  enum class State { kContent, kBetweenCalls, kHeader, kArgsStart, kArgs };
  void open_call(std::string_view header, Parts& out);
  void add_arguments(std::string_view text, Parts& out);

  std::optional<int64_t> max_calls_;
  std::string_view header_end_;  // "\n" (kV3) or <｜tool▁sep｜> (kV3_1)
  State state_ = State::kContent;
  std::string held_;
  int64_t opened_ = 0;
  bool current_kept_ = false;         // the call being read was opened (not dropped)
  size_t header_scanned_ = 0;         // kHeader: bytes of held_ searched without finding its end
  std::unique_ptr<DsmlParser> dsml_;  // kDsml: all the work is its
};

// Appends `text` (when not empty) to call `index`'s arguments in `out`: to the last delta when
// it is that call's (one fragment per delta and call), else as a new delta. Shared by the
// parsers of every syntax.
void append_call_arguments(ToolCallParser::Parts& out, int64_t index, std::string_view text);

}  // namespace moeserve
