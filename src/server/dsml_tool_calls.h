// DsmlParser: DeepSeek-V3.2's tool calls (ToolCallSyntax::kDsml) and DeepSeek-V4's (kDsmlV4)
// in text that arrives in pieces. ToolCallParser hands both to it; use ToolCallParser. The
// model writes, after its content (docs/server.md, "DeepSeek-V3.2"),
//
//   \n\n<｜DSML｜function_calls>
//   <｜DSML｜invoke name="NAME">
//   <｜DSML｜parameter name="KEY" string="true">VALUE</｜DSML｜parameter>
//   <｜DSML｜parameter name="KEY2" string="false">JSON</｜DSML｜parameter>
//   </｜DSML｜invoke>
//   <｜DSML｜invoke name="NAME2">...</｜DSML｜invoke>
//   </｜DSML｜function_calls>
//
// (V4: the block is <｜DSML｜tool_calls> ... </｜DSML｜tool_calls>, all else the same: its
// encoding_dsv4.py writes and parses calls as encoding_dsv32.py does)
// and a call's arguments are the JSON object DeepSeek's encoder (encoding_dsv32.py,
// decode_dsml_to_arguments) builds from its parameters: {"KEY": "VALUE", "KEY2": JSON} with
// Python's json.dumps escaping of a string value, a non-string value as written. They stream:
// "{" with the call's name, then each parameter's key and its value as it arrives, "}" at
// </｜DSML｜invoke>. The "\n\n" before the block is not content; text between calls and
// parameters is dropped; text after the block is content again. A call with an empty name, and
// calls beyond `max_calls`, are dropped. Text cut short keeps what arrived.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "server/tool_call_parser.h"

namespace moeserve {

// The block's name: "function_calls" (kDsml) or "tool_calls" (kDsmlV4).
std::string_view dsml_block(ToolCallSyntax syntax);

class DsmlParser {
 public:
  // `block`: dsml_block() of the syntax.
  DsmlParser(std::optional<int64_t> max_calls, std::string_view block = "function_calls");

  ToolCallParser::Parts push(std::string_view piece);
  ToolCallParser::Parts finish();
  int64_t calls() const { return opened_; }

 private:
  enum class State {
    kContent,       // outside a block
    kBetweenCalls,  // in a block, outside a call
    kInvokeHeader,  // ` name="NAME">`
    kParams,        // in a call, outside a parameter
    kParamHeader,   // ` name="KEY" string="true|false">`
    kValue,         // a parameter's value, up to </｜DSML｜parameter
  };
  void open_call(std::string_view header, ToolCallParser::Parts& out);
  void open_param(std::string_view header, ToolCallParser::Parts& out);
  void add_value(std::string_view text, ToolCallParser::Parts& out);
  void close_call(ToolCallParser::Parts& out);
  void add_arguments(std::string_view text, ToolCallParser::Parts& out);

  std::optional<int64_t> max_calls_;
  // "<｜DSML｜NAME", "\n\n<｜DSML｜NAME" and "</｜DSML｜NAME>" for the block's NAME.
  std::string block_, block_after_content_, block_end_;
  State state_ = State::kContent;
  std::string held_;
  int64_t opened_ = 0;
  bool current_kept_ = false;  // the call being read was opened (not dropped)
  bool call_open_ = false;     // a kept call's "}" is still to come
  bool first_param_ = true;
  bool string_value_ = false;  // the value being read is a string (JSON-escaped as it streams)
};

}  // namespace moeserve
