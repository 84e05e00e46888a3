#include "tokenizer/chat_template.h"

namespace moeserve {
namespace {

// The template text without whitespace and Jinja whitespace-control dashes, so that checks do
// not depend on how a file happens to be formatted.
std::string squeeze(const std::string& t) {
  std::string s;
  s.reserve(t.size());
  for (char c : t) {
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') s.push_back(c);
  }
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s.compare(i, 3, "{%-") == 0 || s.compare(i, 3, "{{-") == 0) {
      out.append(s, i, 2);
      i += 2;
    } else if (s.compare(i, 3, "-%}") == 0 || s.compare(i, 3, "-}}") == 0) {
      out.append(s, i + 1, 2);
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

bool has(const std::string& s, const char* needle) {
  return s.find(needle) != std::string::npos;
}

const char* const kUser = "<｜User｜>";
const char* const kAssistant = "<｜Assistant｜>";
const char* const kEos = "<｜end▁of▁sentence｜>";  // written literally by the templates

// What follows the system prompt when the request has tools (after "\n\n" when there is a
// system prompt). The wording is vLLM's examples/tool_chat_template_deepseekv3.jinja, with its
// sentences separated by blank lines and without the <｜end▁of▁sentence｜> it writes mid-prompt.
const char* const kToolsHead =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are "
    "provided with function signatures within <tools></tools> XML tags:\n<tools>";
const char* const kToolsTail =
    "\n</tools>\n\nFor function call returns, you should first print "
    "<｜tool▁calls▁begin｜>\n\nFor each function call, you should return object like:\n"
    "<｜tool▁call▁begin｜>function<｜tool▁sep｜><function_name>\n```json\n"
    "<function_arguments_in_json_format>\n```<｜tool▁call▁end｜>\n\nAt the end of function "
    "call returns, you should print <｜tool▁calls▁end｜>";

}  // namespace

Result<ChatTemplate> ChatTemplate::from_template(const std::string& jinja, std::string bos_token) {
  const std::string s = squeeze(jinja);
  ChatTemplate t;
  t.bos_ = std::move(bos_token);
  // V3.1: the thinking switch, "</think>" opening a non-thinking assistant turn, tool calls
  // without a type.
  if (has(s, "ifnotthinkingisdefined") && has(s, "'<｜Assistant｜></think>'") &&
      has(s, "is_last_user") && has(s, "content.split('</think>',1)[1]") &&
      has(s, "'<｜tool▁call▁begin｜>'+tool['function']['name']+'<｜tool▁sep｜>'")) {
    t.variant_ = Variant::kDeepSeekV3_1;
    return t;
  }
  // V3-0324 / R1-0528: the user turn ends with <｜Assistant｜>; is_last_user decides the
  // generation prompt.
  const bool r1_0528 =
      has(s, "'<｜User｜>'+content+'<｜Assistant｜>'") && has(s, "content.split('</think>')[-1]");
  const bool v3_0324 = has(s, "'<｜User｜>'+message['content']+'<｜Assistant｜>'");
  if ((r1_0528 || v3_0324) && has(s, "is_last_user") && has(s, "ns.is_output_first") &&
      has(s, "ifadd_generation_promptandnotns.is_last_userandnotns.is_tool") &&
      !has(s, "thinking")) {
    t.variant_ = r1_0528 ? Variant::kDeepSeekR1_0528 : Variant::kDeepSeekV3_0324;
    t.strip_think_ = r1_0528;
    return t;
  }
  // The structure both first-release variants share.
  const bool family = has(s, "<｜User｜>") && has(s, "ns.is_output_first") &&
                      has(s, "message['role']=='assistant'andmessage['content']isnone") &&
                      has(s, "'<｜tool▁outputs▁end｜>'+message['content']+'<｜end▁of▁sentence｜>'");
  if (!family || has(s, "'tool_calls'inmessage") || has(s, "thinking")) {
    return Unimplemented(
        "chat template not recognised as a DeepSeek V3/R1 format (supported: the templates of "
        "deepseek-ai/DeepSeek-V3, V3-0324, V3.1, V3.1-Terminus, R1 and R1-0528)");
  }
  t.join_system_ = has(s, "is_first_sp");
  t.strip_think_ = has(s, "content.split('</think>')[-1]");
  // The generation prompt: '<｜Assistant｜><think>\n' (escaped or literal newline) in R1.
  t.think_prompt_ = jinja.find("<｜Assistant｜><think>\\n'") != std::string::npos ||
                    jinja.find("<｜Assistant｜><think>\n'") != std::string::npos;
  t.variant_ = t.strip_think_ ? Variant::kDeepSeekR1 : Variant::kDeepSeekV3;
  return t;
}

Result<ChatTemplate> ChatTemplate::for_tokenizer(const Tokenizer& tok) {
  if (tok.chat_template().empty()) {
    return NotFound("tokenizer_config.json has no chat_template");
  }
  return from_template(tok.chat_template(), tok.bos_token());
}

Result<ChatTemplate> ChatTemplate::for_model(const Tokenizer& tok, std::string_view model_type) {
  if (tok.chat_template().empty() && model_type == "deepseek_v32") {
    return of_variant(Variant::kDeepSeekV3_2, tok.bos_token());
  }
  if (tok.chat_template().empty() && model_type == "deepseek_v4") {
    return of_variant(Variant::kDeepSeekV4, tok.bos_token());
  }
  return for_tokenizer(tok);
}

ChatTemplate ChatTemplate::of_variant(Variant v, std::string bos_token) {
  ChatTemplate t;
  t.variant_ = v;
  t.bos_ = std::move(bos_token);
  t.join_system_ = v != Variant::kDeepSeekR1;
  t.strip_think_ = v == Variant::kDeepSeekR1 || v == Variant::kDeepSeekR1_0528;
  t.think_prompt_ = v == Variant::kDeepSeekR1;
  return t;
}

namespace {

// Where jinja2 would raise (a message's content is null or missing where the template adds it).
Status need(const Message& m, size_t i) {
  if (m.content) return Status::Ok();
  return InvalidArgument("message " + std::to_string(i) + " (role '" + m.role +
                         "') has no content");
}

// ns.system_prompt: the system prompts joined by "\n\n", or (R1's first template) the last one.
Result<std::string> system_prompt(std::span<const Message> messages, bool join) {
  std::string system;
  bool first = true;
  for (size_t i = 0; i < messages.size(); ++i) {
    const Message& m = messages[i];
    if (m.role != "system") continue;
    RETURN_IF_ERROR(need(m, i));
    system = (join ? system + (first ? "" : "\n\n") : std::string()) + *m.content;
    first = false;
  }
  return system;
}

// The API's tools after the system prompt (every variant that takes them).
void append_tools(std::string& out, bool has_system, std::span<const ToolDefinition> tools) {
  if (tools.empty()) return;
  if (has_system) out += "\n\n";
  out += kToolsHead;
  for (const ToolDefinition& t : tools) out += "\n" + t.json;
  out += kToolsTail;
}

// V3.1's tool description, as its model card gives it: "{system prompt}\n\n{tool_description}"
// (the blank line even without a system prompt), a section per tool, the call format last.
void append_tools_v3_1(std::string& out, std::span<const ToolDefinition> tools) {
  if (tools.empty()) return;
  out += "\n\n## Tools\nYou have access to the following tools:\n\n";
  for (const ToolDefinition& t : tools) {
    out += "### " + t.name + "\nDescription: " + t.description + "\n\nParameters: " + t.parameters +
           "\n\n";
  }
  out +=
      "IMPORTANT: ALWAYS adhere to this exact format for tool use:\n<｜tool▁calls▁begin｜>"
      "<｜tool▁call▁begin｜>tool_call_name<｜tool▁sep｜>tool_call_arguments<｜tool▁call▁end｜>"
      "{additional_tool_calls}<｜tool▁calls▁end｜>\n\nWhere:\n- `tool_call_name` must be an "
      "exact match to one of the available tools\n- `tool_call_arguments` must be valid JSON "
      "that strictly follows the tool's Parameters Schema\n- For multiple tool calls, chain them "
      "directly without separators or spaces";
}

}  // namespace

Result<std::string> ChatTemplate::render(std::span<const Message> messages,
                                         bool add_generation_prompt,
                                         std::span<const ToolDefinition> tools, bool thinking,
                                         std::string_view reasoning_effort) const {
  switch (variant_) {
    case Variant::kDeepSeekV3_0324:
    case Variant::kDeepSeekR1_0528:
      return render_0324(messages, add_generation_prompt, tools);
    case Variant::kDeepSeekV3_1:
      return render_v3_1(messages, add_generation_prompt, tools, thinking);
    case Variant::kDeepSeekV3_2:
      return render_v3_2(messages, tools, thinking);
    case Variant::kDeepSeekV4:
      return render_v4(messages, tools, thinking, reasoning_effort);
    default:
      return render_v3_r1(messages, add_generation_prompt, tools);
  }
}

// DeepSeek-V3-0324 and R1-0528, statement by statement; comments name the template's variables.
Result<std::string> ChatTemplate::render_0324(std::span<const Message> messages,
                                              bool add_generation_prompt,
                                              std::span<const ToolDefinition> tools) const {
  ASSIGN_OR_RETURN(std::string system, system_prompt(messages, /*join=*/true));
  std::string out = bos_ + system;
  append_tools(out, !system.empty(), tools);
  bool is_first = false, is_tool = false, is_output_first = true, is_last_user = false;  // ns.*
  auto call_text = [](const ToolCall& tc) {
    return tc.type + "<｜tool▁sep｜>" + tc.name + "\n```json\n" + tc.arguments +
           "\n```<｜tool▁call▁end｜>";
  };
  for (size_t i = 0; i < messages.size(); ++i) {
    const Message& m = messages[i];
    // R1-0528 reads `content` up front and drops an assistant turn's reasoning ('</think>' in
    // content raises on null content there).
    std::optional<std::string> content = m.content;
    if (m.role == "user") {
      RETURN_IF_ERROR(need(m, i));
      is_tool = false;
      is_first = false;
      is_last_user = true;
      out += kUser + *content + kAssistant;
    }
    // (jinja2 raises on the null content OpenAI clients send beside tool calls; it is taken
    // as "", which renders the same as V3-0324 renders null.)
    if (m.role == "assistant" && strip_think_ && m.tool_calls && !content) content = "";
    if (m.role == "assistant" && strip_think_) {
      if (!content) RETURN_IF_ERROR(need(m, i));
      const size_t at = content->rfind("</think>");
      if (at != std::string::npos) content = content->substr(at + 8);
    }
    if (m.role == "assistant" && m.tool_calls) {
      is_last_user = false;
      if (is_tool) out += "<｜tool▁outputs▁end｜>";
      is_first = false;
      is_tool = false;
      is_output_first = true;
      for (const ToolCall& tc : *m.tool_calls) {
        if (!is_first) {
          if (content) out += *content;
          out += "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>" + call_text(tc);
          is_first = true;
        } else {
          out += "\n<｜tool▁call▁begin｜>" + call_text(tc);
        }
      }
      out += std::string("<｜tool▁calls▁end｜>") + kEos;
    }
    if (m.role == "assistant" && !m.tool_calls) {
      RETURN_IF_ERROR(need(m, i));
      is_last_user = false;
      if (is_tool) {
        out += "<｜tool▁outputs▁end｜>" + *content + kEos;
        is_tool = false;
      } else {
        out += *content + kEos;
      }
    }
    if (m.role == "tool") {
      RETURN_IF_ERROR(need(m, i));
      is_last_user = false;
      is_tool = true;
      if (is_output_first) {
        out +=
            "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>" + *content + "<｜tool▁output▁end｜>";
        is_output_first = false;
      } else {
        out += "\n<｜tool▁output▁begin｜>" + *content + "<｜tool▁output▁end｜>";
      }
    }
  }
  if (is_tool) out += "<｜tool▁outputs▁end｜>";
  if (add_generation_prompt && !is_last_user && !is_tool) out += kAssistant;
  return out;
}

// DeepSeek-V3.1 (and V3.1-Terminus), statement by statement. The API has no `prefix` message
// field (DeepSeek's prefix completion), so `message['prefix']` is never set.
Result<std::string> ChatTemplate::render_v3_1(std::span<const Message> messages,
                                              bool add_generation_prompt,
                                              std::span<const ToolDefinition> tools,
                                              bool thinking) const {
  ASSIGN_OR_RETURN(std::string system, system_prompt(messages, /*join=*/true));
  std::string out = bos_ + system;
  append_tools_v3_1(out, tools);
  bool is_first = false, is_tool = false, is_last_user = false;  // ns.*
  for (size_t i = 0; i < messages.size(); ++i) {
    const Message& m = messages[i];
    if (m.role == "user") {
      RETURN_IF_ERROR(need(m, i));
      is_tool = false;
      is_first = false;
      is_last_user = true;
      out += kUser + *m.content;
    }
    if (m.role == "assistant" && m.tool_calls) {
      if (is_last_user) out += std::string(kAssistant) + "</think>";
      is_last_user = false;
      is_first = false;
      is_tool = false;
      for (const ToolCall& tc : *m.tool_calls) {
        const std::string call = "<｜tool▁call▁begin｜>" + tc.name + "<｜tool▁sep｜>" +
                                 tc.arguments + "<｜tool▁call▁end｜>";
        if (!is_first) {
          if (m.content) out += *m.content;
          out += "<｜tool▁calls▁begin｜>" + call;
          is_first = true;
        } else {
          out += call;
        }
      }
      out += std::string("<｜tool▁calls▁end｜>") + kEos;
    }
    if (m.role == "assistant" && !m.tool_calls) {
      if (is_last_user) out += std::string(kAssistant) + "</think>";
      is_last_user = false;
      RETURN_IF_ERROR(need(m, i));
      if (is_tool) {
        out += *m.content + kEos;
        is_tool = false;
      } else {
        std::string_view content = *m.content;
        const size_t at = content.find("</think>");
        if (at != std::string_view::npos) content.remove_prefix(at + 8);
        out += content;
        out += kEos;
      }
    }
    if (m.role == "tool") {
      RETURN_IF_ERROR(need(m, i));
      is_last_user = false;
      is_tool = true;
      out += "<｜tool▁output▁begin｜>" + *m.content + "<｜tool▁output▁end｜>";
    }
  }
  if (add_generation_prompt && is_last_user && !is_tool) {
    out += kAssistant;
    out += thinking ? "<think>" : "</think>";
  }
  return out;
}

// DeepSeek-V3 and R1 (first releases), statement by statement.
Result<std::string> ChatTemplate::render_v3_r1(std::span<const Message> messages,
                                               bool add_generation_prompt,
                                               std::span<const ToolDefinition> tools) const {
  ASSIGN_OR_RETURN(std::string system, system_prompt(messages, join_system_));
  std::string out = bos_ + system;
  append_tools(out, !system.empty(), tools);
  bool is_first = false, is_tool = false, is_output_first = true;  // ns.*
  for (size_t i = 0; i < messages.size(); ++i) {
    const Message& m = messages[i];
    if (m.role == "user") {
      RETURN_IF_ERROR(need(m, i));
      is_tool = false;
      out += kUser + *m.content;
    }
    if (m.role == "assistant" && !m.content) {
      is_tool = false;
      if (m.tool_calls) {
        for (const ToolCall& tc : *m.tool_calls) {
          const std::string call = tc.type + "<｜tool▁sep｜>" + tc.name + "\n```json\n" +
                                   tc.arguments + "\n```<｜tool▁call▁end｜>";
          if (!is_first) {
            out += std::string(kAssistant) + "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>" + call;
            is_first = true;
          } else {
            out += "\n<｜tool▁call▁begin｜>" + call + "<｜tool▁calls▁end｜>" + kEos;
          }
        }
      }
    }
    if (m.role == "assistant" && m.content) {
      if (is_tool) {
        out += "<｜tool▁outputs▁end｜>" + *m.content + kEos;
        is_tool = false;
      } else {
        std::string_view content = *m.content;
        if (strip_think_) {
          const size_t at = content.rfind("</think>");
          if (at != std::string_view::npos) content.remove_prefix(at + 8);
        }
        out += kAssistant;
        out += content;
        out += kEos;
      }
    }
    if (m.role == "tool") {
      RETURN_IF_ERROR(need(m, i));
      is_tool = true;
      if (is_output_first) {
        out += "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>" + *m.content +
               "<｜tool▁output▁end｜>";
        is_output_first = false;
      } else {
        out += "\n<｜tool▁output▁begin｜>" + *m.content + "<｜tool▁output▁end｜>";
      }
    }
  }
  if (is_tool) out += "<｜tool▁outputs▁end｜>";
  if (add_generation_prompt && !is_tool) {
    out += kAssistant;
    if (think_prompt_) out += "<think>\n";
  }
  return out;
}

}  // namespace moeserve
