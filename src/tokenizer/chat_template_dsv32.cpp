// DeepSeek-V3.2's and DeepSeek-V4's chat encodings (docs/server.md, "DeepSeek-V3.2"): what
// DeepSeek's encoders (encoding/encoding_dsv32.py and encoding/encoding_dsv4.py of the model
// repositories) write for a request as SGLang's server prepares it for V3.2 (V4 prepared the
// same way), step by step, errors where the encoders raise. Held to those encoders by
// tests/data/tokenizer/chat_dsv32.jsonl and chat_dsv4.jsonl (tools/gen_dsv32_chat_fixtures.py,
// tools/gen_dsv4_chat_fixtures.py). The two share the DSML calls (V4 names the block
// "tool_calls" where V3.2 says "function_calls") and the request's preparation.
#include <algorithm>

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

// The tools section: `head`, the tool schemas (the "function" objects) a line each, `tail`.
std::string render_tools(std::span<const ToolDefinition> tools, std::string_view head = kToolsHead,
                         std::string_view tail = kToolsTail) {
  std::string out(head);
  for (size_t i = 0; i < tools.size(); ++i) {
    if (i) out += '\n';
    out += tools[i].function_json;
  }
  out += tail;
  return out;
}

// encode_arguments_to_dsml: a call's JSON-object arguments as parameters, in the object's
// order; strings as they are, other values as JSON. Arguments that are not JSON are an error
// (V3.2) or, `wrap_text` (V4), the string value of one parameter named "arguments".
Result<std::string> dsml_arguments(const ToolCall& call, bool wrap_text) {
  ordered_json args = ordered_json::parse(call.arguments, nullptr, /*allow_exceptions=*/false);
  if (args.is_discarded() && wrap_text) args = ordered_json{{"arguments", call.arguments}};
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

// An assistant turn's calls as the encoders write them after its content: "\n\n", then the
// block (`block`: "function_calls" for V3.2, "tool_calls" for V4) of invokes; "" without calls.
Result<std::string> dsml_calls(const Message& m, std::string_view block, bool wrap_text) {
  if (!m.tool_calls || m.tool_calls->empty()) return std::string();
  std::string calls = "\n\n<｜DSML｜" + std::string(block) + ">\n";
  for (size_t k = 0; k < m.tool_calls->size(); ++k) {
    const ToolCall& c = (*m.tool_calls)[k];
    ASSIGN_OR_RETURN(std::string args, dsml_arguments(c, wrap_text));
    if (k) calls += '\n';
    calls += "<｜DSML｜invoke name=\"" + c.name + "\">\n" + args + "\n</｜DSML｜invoke>";
  }
  calls += "\n</｜DSML｜" + std::string(block) + ">";
  return calls;
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

// SGLang's preparation: null content as "", an empty system message first when the first is
// not one, the request's tools on the first message.
std::vector<Turn> prepare(std::span<const Message> messages,
                          std::span<const ToolDefinition> tools) {
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
  return turns;
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
    ASSIGN_OR_RETURN(std::string calls, dsml_calls(m, "function_calls", /*wrap_text=*/false));
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
  std::vector<Turn> turns = prepare(messages, tools);
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

// ---- DeepSeek-V4 (encoding_dsv4.py) ----

namespace {

// V4's TOOLS_TEMPLATE, split around the tool schemas.
constexpr std::string_view kV4ToolsHead =
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools "
    "by writing a \"<｜DSML｜tool_calls>\" block like the following:\n\n"
    "<｜DSML｜tool_calls>\n"
    "<｜DSML｜invoke name=\"$TOOL_NAME\">\n"
    "<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE"
    "</｜DSML｜parameter>\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "<｜DSML｜invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types "
    "(numbers, booleans, arrays, objects), pass the value in JSON format and set "
    "`string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning "
    "inside <think>...</think> BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n";
constexpr std::string_view kV4ToolsTail =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke "
    "tool calls.\n";
// REASONING_EFFORT_MAX: what the first message's text opens with (after BOS) in thinking mode.
constexpr std::string_view kReasoningEffortMax =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to "
    "resolve the root cause, rigorously stress-testing your logic against all potential paths, "
    "edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
    "unchecked.\n\n";

// A part of a user turn after merge_tool_messages: a user message's text or a tool output.
struct Block {
  bool tool_result = false;
  std::string_view text;
  std::string_view tool_use_id;  // a tool output's tool_call_id
};

// A message as V4's encoder renders it: tool outputs merged into user turns.
struct V4Turn {
  const Message* m;  // tool_calls and reasoning_content; nullptr for a (merged) user turn
  std::string_view role;
  std::string_view content;
  bool has_tools = false;
  std::vector<Block> blocks;          // user turns: their texts and tool outputs, in order
  const std::string* task = nullptr;  // the message's task, when it has one
};

// merge_tool_messages: a tool output becomes a tool_result block of a user turn, joining the
// previous turn when that is a user turn (itself merged or not), as does a user message's text
// unless that turn has a task. A user message that starts a turn brings its task; one that
// joins a turn loses it (as the encoder's merge keeps the fields of new turns only).
std::vector<V4Turn> merge_tool_messages(std::span<const Turn> turns) {
  std::vector<V4Turn> out;
  for (const Turn& t : turns) {
    const std::string& role = t.m->role;
    const bool after_user = !out.empty() && out.back().role == "user";
    if (role == "tool" || role == "user") {
      Block b{role == "tool", t.content, {}};
      if (b.tool_result && t.m->tool_call_id) b.tool_use_id = *t.m->tool_call_id;
      const bool joins = after_user && (role == "tool" || !out.back().task);
      if (!joins) {
        out.push_back({nullptr, "user", {}, false, {}});
        if (role == "user" && t.m->task) out.back().task = &*t.m->task;
      }
      out.back().blocks.push_back(b);
    } else {
      out.push_back({t.m, role, t.content, t.has_tools, {}, t.m->task ? &*t.m->task : nullptr});
    }
  }
  return out;
}

// DS_TASK_SP_TOKENS of encoding_dsv4.py.
std::optional<std::string_view> v4_task_token(std::string_view task) {
  static constexpr std::pair<std::string_view, std::string_view> kTasks[] = {
      {"action", "<｜action｜>"}, {"query", "<｜query｜>"}, {"authority", "<｜authority｜>"},
      {"domain", "<｜domain｜>"}, {"title", "<｜title｜>"}, {"read_url", "<｜read_url｜>"}};
  for (const auto& [name, token] : kTasks) {
    if (name == task) return token;
  }
  return std::nullopt;
}

// sort_tool_results_by_call_order: a user turn's tool outputs (two or more) in the order of
// the calls of the last assistant turn with calls before it, by id (an unknown id as the
// first call); stable; the texts keep their places.
void sort_tool_results(std::vector<V4Turn>& turns) {
  std::vector<std::pair<std::string_view, size_t>> order;  // call id -> its index
  const auto rank = [&](std::string_view id) -> size_t {
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      if (it->first == id) return it->second;  // (the last of equal ids, as a dict keeps)
    }
    return 0;
  };
  for (V4Turn& t : turns) {
    if (t.role == "assistant" && t.m->tool_calls && !t.m->tool_calls->empty()) {
      order.clear();
      for (size_t k = 0; k < t.m->tool_calls->size(); ++k) {
        const std::string& id = (*t.m->tool_calls)[k].id;
        if (!id.empty()) order.emplace_back(id, k);
      }
    } else if (t.role == "user" && !order.empty()) {
      std::vector<Block> results;
      for (const Block& b : t.blocks) {
        if (b.tool_result) results.push_back(b);
      }
      if (results.size() < 2) continue;
      std::stable_sort(results.begin(), results.end(), [&](const Block& a, const Block& b) {
        return rank(a.tool_use_id) < rank(b.tool_use_id);
      });
      size_t next = 0;
      for (Block& b : t.blocks) {
        if (b.tool_result) b = results[next++];
      }
    }
  }
}

int64_t last_user_index(std::span<const V4Turn> turns) {
  for (int64_t i = int64_t(turns.size()) - 1; i >= 0; --i) {
    const std::string_view role = turns[size_t(i)].role;
    if (role == "user" || role == "developer") return i;
  }
  return -1;
}

Status error_at(size_t i, const V4Turn& t, std::string_view why) {
  return InvalidArgument("message " + std::to_string(i) + " (role '" + std::string(t.role) +
                         "'): " + std::string(why));
}

// render_message of V4's encoder for turns[i]. `drop`: earlier turns' reasoning is dropped
// (drop_thinking, off when the request has tools).
Result<std::string> render_v4_turn(std::span<const V4Turn> turns, size_t i,
                                   std::span<const ToolDefinition> tools, bool thinking, bool drop,
                                   bool effort_max) {
  const V4Turn& t = turns[i];
  const int64_t last_user = last_user_index(turns);
  std::string out;
  if (i == 0 && thinking && effort_max) out += kReasoningEffortMax;
  if (t.role == "system") {
    out += t.content;
    if (t.has_tools) out += "\n\n" + render_tools(tools, kV4ToolsHead, kV4ToolsTail);
  } else if (t.role == "developer") {
    if (t.content.empty()) return error_at(i, t, "a developer message needs content");
    out += std::string(kUser) + std::string(t.content);
    if (t.has_tools) out += "\n\n" + render_tools(tools, kV4ToolsHead, kV4ToolsTail);
  } else if (t.role == "user") {
    out += kUser;
    for (size_t k = 0; k < t.blocks.size(); ++k) {
      if (k) out += "\n\n";
      const Block& b = t.blocks[k];
      out += b.tool_result ? "<tool_result>" + std::string(b.text) + "</tool_result>"
                           : std::string(b.text);
    }
  } else if (t.role == "latest_reminder") {
    out += "<｜latest_reminder｜>" + std::string(t.content);
  } else if (t.role == "assistant") {
    ASSIGN_OR_RETURN(std::string calls, dsml_calls(*t.m, "tool_calls", /*wrap_text=*/true));
    // Reasoning is rendered after the last user turn, and everywhere when nothing is dropped;
    // never in the answer to a task.
    const bool task_answer = i > 0 && turns[i - 1].task;
    if (thinking && !task_answer && (!drop || int64_t(i) > last_user)) {
      if (t.m->reasoning_content) out += *t.m->reasoning_content;
      out += kThinkClose;
    }
    out += std::string(t.content) + calls + std::string(kEos);
  } else {
    return error_at(i, t, "unknown role");
  }
  // A user or developer turn followed by an assistant or latest_reminder turn, or last, opens
  // the assistant's: <think> where its reasoning is rendered, </think> elsewhere.
  if (i + 1 < turns.size() && turns[i + 1].role != "assistant" &&
      turns[i + 1].role != "latest_reminder") {
    return out;
  }
  if (t.task) {  // a task's token instead (an action's after the assistant's opening)
    const std::optional<std::string_view> token = v4_task_token(*t.task);
    if (!token) {
      return error_at(i, t,
                      "unknown task '" + *t.task +
                          "' (DeepSeek-V4's are action, query, authority, domain, title and "
                          "read_url)");
    }
    if (*t.task == "action")
      out += std::string(kAssistant) + std::string(thinking ? kThinkOpen : kThinkClose);
    out += *token;
    return out;
  }
  if (t.role == "user" || t.role == "developer") {
    out += kAssistant;
    out += thinking && (!drop || int64_t(i) >= last_user) ? kThinkOpen : kThinkClose;
  }
  return out;
}

}  // namespace

Result<std::string> ChatTemplate::render_v4(std::span<const Message> messages,
                                            std::span<const ToolDefinition> tools, bool thinking,
                                            std::string_view reasoning_effort) const {
  if (!reasoning_effort.empty() && reasoning_effort != "max" && reasoning_effort != "high") {
    return InvalidArgument("reasoning_effort '" + std::string(reasoning_effort) +
                           "': DeepSeek-V4 takes 'max' or 'high'");
  }
  const std::vector<Turn> prepared = prepare(messages, tools);
  std::vector<V4Turn> turns = merge_tool_messages(prepared);
  sort_tool_results(turns);
  // drop_thinking holds unless the request has tools; in thinking mode it drops, before the
  // last user turn, the turns of roles other than user, system, latest_reminder, assistant
  // (whose reasoning is then not rendered) and direct_search_results (kept, to be refused).
  const bool drop = tools.empty();
  if (thinking && drop) {
    const int64_t last_user = last_user_index(turns);
    std::vector<V4Turn> kept;
    for (size_t i = 0; i < turns.size(); ++i) {
      V4Turn& t = turns[i];
      if (t.role == "user" || t.role == "system" || t.role == "latest_reminder" ||
          t.role == "assistant" || t.role == "direct_search_results" || int64_t(i) >= last_user) {
        kept.push_back(std::move(t));
      }
    }
    turns = std::move(kept);
  }
  std::string out = bos_;
  for (size_t i = 0; i < turns.size(); ++i) {
    ASSIGN_OR_RETURN(std::string part,
                     render_v4_turn(turns, i, tools, thinking, drop, reasoning_effort == "max"));
    out += part;
  }
  return out;
}

}  // namespace moeserve
