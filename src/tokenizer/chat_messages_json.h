// Parsing chat messages from JSON (OpenAI chat format), for the command line and the server.
//
// Accepts an array of messages or an object with a "messages" array. Each message: "role"
// (string, required), "content" (string, null or absent = null; an array of {"type": "text",
// "text": ...} parts is joined), "tool_calls" ([{"id", "type", "function": {"name",
// "arguments"}}]; "arguments" given as a JSON object is serialised compactly, where Hugging
// Face's template would fail), "tool_call_id", "reasoning_content" (string or null), "task"
// (string or null; DeepSeek-V4's). Errors name the message index and field.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "tokenizer/chat_template.h"

namespace moeserve {

Result<std::vector<Message>> parse_messages_json(std::string_view json_text);

// The API's `tools`: an array of {"type": "function", "function": {"name", ...}} objects, each
// kept as Jinja's `tojson` writes it for the template (Python's json.dumps with ensure_ascii
// off: ", " and ": " separators, keys in the order of `json_text`). Checks only the shape the
// template needs (the server validates the rest at its boundary).
Result<std::vector<ToolDefinition>> parse_tools_json(std::string_view json_text);

// Appends `v` as Python's json.dumps(v, ensure_ascii=False) writes it: ", " and ": "
// separators, keys in `v`'s order, only '"', '\\' and control characters escaped.
void python_dumps(const nlohmann::ordered_json& v, std::string& out);

}  // namespace moeserve
