// DeepSeek-V3.2's chat encoding (docs/server.md, "DeepSeek-V3.2"): what DeepSeek's encoder
// (encoding/encoding_dsv32.py of the model repository) writes for a request as SGLang's server
// prepares it, step by step, errors where the encoder raises. Held to that encoder by
// tests/data/tokenizer/chat_dsv32.jsonl (tools/gen_dsv32_chat_fixtures.py).
#include <nlohmann/json.hpp>

#include "tokenizer/chat_messages_json.h"
#include "tokenizer/chat_template.h"

namespace moeserve {
namespace {

using ordered_json = nlohmann::ordered_json;

constexpr std::string_view kUser = "<｜User｜>";
constexpr std::string_view kAssistant = "<｜Assistant｜>";
constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";

// The tool description the model was trained with: the encoder's TOOLS_SYSTEM_TEMPLATE with
// its DSML marker and thinking tokens in place; the tool schemas go between the two parts.
constexpr std::string_view kToolsHead =
    "## Tools\n"
    "You have access to a set of tools you can use to answer the user's question.\n"
    "You can invoke functions by writing a \"<｜DSML｜function_calls>\" block like the following "
    "as part of your reply to the user:\n"
    "<｜DSML｜function_calls>\n"
    "<｜DSML｜invoke name=\"$FUNCTION_NAME\">\n"
    "<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE"
    "</｜DSML｜parameter>\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "<｜DSML｜invoke name=\"$FUNCTION_NAME2\">\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "</｜DSML｜function_calls>\n"
    "String and scalar parameters should be specified as is without any escaping or quotes, "
    "while lists and objects should use JSON format. The \"string\" attribute should be set to "
    "\"true\" for string type parameters and \"false\" for other types (numbers, booleans, "
    "arrays, objects).\n"
    "If the thinking_mode is enabled, then after function results you should strongly consider "
    "outputting a thinking block. Here is an example:\n"
    "<｜DSML｜function_calls>\n"
    "...\n"
    "</｜DSML｜function_calls>\n"
    "<function_results>\n"
    "...\n"
    "</function_results>\n"
    "<think>...thinking about results</think>\n"
    "Here are the functions available in JSONSchema format:\n"
    "<functions>\n";
constexpr std::string_view kToolsTail = "\n</functions>\n";

// A message as the encoder sees it after SGLang's preparation: content never null, the
// request's tools on the first message.
struct Turn {
  const Message* m;
  std::string_view content;
  bool has_tools = false;
};

std::string render_tools(std::span<const ToolDefinition> tools) {
  std::string out(kToolsHead);
  for (size_t i = 0; i < tools.size(); ++i) {
    if (i) out += '\n';
    out += tools[i].function_json;
  }
  out += kToolsTail;
  return out;
}

// encode_arguments_to_dsml: a call's JSON-object arguments as parameters, in the object's
// order; strings as they are, other values as JSON.
Result<std::string> dsml_arguments(const ToolCall& call) {
  ordered_json args = ordered_json::parse(call.arguments, nullptr, /*allow_exceptions=*/false);
  if (args.is_discarded()) {
    return InvalidArgument("tool call '" + call.name + "': arguments are not valid JSON");
  }
  if (!args.is_object()) {
    return InvalidArgument("tool call '" + call.name +
                           "': function.arguments must be a JSON object");
  }
  std::string out;
  bool first = true;
  for (const auto& [key, value] : args.items()) {
    if (!first) out += '\n';
    first = false;
    out += "<｜DSML｜parameter name=\"" + key + "\" string=\"";
    if (value.is_string()) {
      out += "true\">" + value.get<std::string>();
    } else {
      out += "false\">";
      python_dumps(value, out);
    }
    out += "</｜DSML｜parameter>";
  }
  return out;
}

int64_t last_user_index(std::span<const Turn> turns) {
  for (int64_t i = int64_t(turns.size()) - 1; i >= 0; --i) {
    const std::string& role = turns[size_t(i)].m->role;
    if (role == "user" || role == "developer") return i;
  }
  return -1;
}

Status error_at(size_t i, const Turn& t, std::string_view why) {
  return InvalidArgument("message " + std::to_string(i) + " (role '" + t.m->role +
                         "'): " + std::string(why));
}

// render_message of the encoder for turns[i].
Result<std::string> render_turn(std::span<const Turn> turns, size_t i,
                                std::span<const ToolDefinition> tools, bool thinking) {
  const Turn& t = turns[i];
  const Message& m = *t.m;
  const int64_t last_user = last_user_index(turns);
  const bool opens_thinking = thinking && int64_t(i) == last_user;
  std::string out;
  if (m.role == "system") {
    out += t.content;
    if (t.has_tools) out += "\n\n" + render_tools(tools);
  } else if (m.role == "developer") {
    if (t.content.empty()) return error_at(i, t, "a developer message needs content");
    std::string text;
    if (t.has_tools) text += "\n\n" + render_tools(tools);
    text += "\n\n# The user's message is: ";
    text += t.content;
    out += std::string(kUser) + text + std::string(kAssistant);
    out += opens_thinking ? kThinkOpen : kThinkClose;
  } else if (m.role == "user") {
    out += std::string(kUser) + std::string(t.content) + std::string(kAssistant);
    out += opens_thinking ? kThinkOpen : kThinkClose;
  } else if (m.role == "tool") {
    // The assistant turn whose calls this output answers: the nearest before the run of tool
    // messages this one belongs to.
    int64_t prev = int64_t(i) - 1;
    while (prev >= 0 && turns[size_t(prev)].m->role == "tool") --prev;
    if (prev < 0 || turns[size_t(prev)].m->role != "assistant") {
      return error_at(i, t, "a tool output must follow an assistant turn with tool calls");
    }
    const Message& a = *turns[size_t(prev)].m;
    const size_t order = i - size_t(prev);
    const size_t calls = a.tool_calls ? a.tool_calls->size() : 0;
    if (calls < order) return error_at(i, t, "more tool outputs than the assistant made calls");
    if (order == 1) out += "\n\n<function_results>";
    out += "\n<result>" + std::string(t.content) + "</result>";
    if (order == calls) {
      out += "\n</function_results>\n\n";
      out += thinking && int64_t(i) >= last_user ? kThinkOpen : kThinkClose;
    }
  } else if (m.role == "assistant") {
    std::string calls;
    if (m.tool_calls && !m.tool_calls->empty()) {
      calls = "\n\n<｜DSML｜function_calls>\n";
      for (size_t k = 0; k < m.tool_calls->size(); ++k) {
        const ToolCall& c = (*m.tool_calls)[k];
        ASSIGN_OR_RETURN(std::string args, dsml_arguments(c));
        if (k) calls += '\n';
        calls += "<｜DSML｜invoke name=\"" + c.name + "\">\n" + args + "\n</｜DSML｜invoke>";
      }
      calls += "\n</｜DSML｜function_calls>";
    }
    // Thinking mode: a turn after the last user message keeps its reasoning (the agent loop of
    // one request); earlier turns' reasoning was dropped before rendering.
    if (thinking && int64_t(i) > last_user) {
      const bool reasoned = m.reasoning_content && !m.reasoning_content->empty();
      if (!reasoned && calls.empty()) {
        return error_at(i, t,
                        "in thinking mode an assistant turn after the last user message needs "
                        "reasoning_content or tool_calls");
      }
      if (m.reasoning_content) out += *m.reasoning_content;
      out += kThinkClose;
    }
    out += std::string(t.content) + calls + std::string(kEos);
  } else {
    return error_at(i, t, "unknown role");
  }
  return out;
}

}  // namespace

Result<std::string> ChatTemplate::render_v3_2(std::span<const Message> messages,
                                              std::span<const ToolDefinition> tools,
                                              bool thinking) const {
  // SGLang's preparation: null content as "", an empty system message first when the first
  // is not one, the request's tools on the first message.
  static const Message kEmptySystem = [] {
    Message m;
    m.role = "system";
    m.content = "";
    return m;
  }();
  std::vector<Turn> turns;
  turns.reserve(messages.size() + 1);
  if (messages.empty() || messages.front().role != "system") turns.push_back({&kEmptySystem, ""});
  for (const Message& m : messages) {
    turns.push_back({&m, m.content ? std::string_view(*m.content) : std::string_view()});
  }
  turns.front().has_tools = !tools.empty();
  const size_t n = turns.size();
  // drop_thinking_messages (thinking mode): before the last user message, assistant turns lose
  // their reasoning and turns of other roles than user, system, tool and assistant are dropped;
  // the encoder still renders as many turns as it was given, so a dropped turn is an error.
  std::vector<Message> stripped;
  if (thinking) {
    const int64_t last_user = last_user_index(turns);
    std::vector<Turn> kept;
    stripped.reserve(n);  // (no reallocation: `kept` points into it)
    for (size_t i = 0; i < n; ++i) {
      const std::string& role = turns[i].m->role;
      if (role == "user" || role == "system" || role == "tool" || int64_t(i) >= last_user) {
        kept.push_back(turns[i]);
      } else if (role == "assistant") {
        stripped.push_back(*turns[i].m);
        stripped.back().reasoning_content.reset();
        kept.push_back({&stripped.back(), turns[i].content, turns[i].has_tools});
      }
    }
    turns = std::move(kept);
  }
  if (turns.size() < n) {
    return InvalidArgument(
        "in thinking mode a developer message must not come before the last user message");
  }
  std::string out = bos_;
  for (size_t i = 0; i < n; ++i) {
    ASSIGN_OR_RETURN(std::string part, render_turn(turns, i, tools, thinking));
    out += part;
  }
  return out;
}

}  // namespace moeserve
