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
  // The structure both supported variants share; anything else (V3.1's thinking flags, the
  // later "'tool_calls' in message" form) is a different format we do not claim to reproduce.
  const bool family = has(s, "<｜User｜>") && has(s, "ns.is_output_first") &&
                      has(s, "message['role']=='assistant'andmessage['content']isnone") &&
                      has(s, "'<｜tool▁outputs▁end｜>'+message['content']+'<｜end▁of▁sentence｜>'");
  if (!family || has(s, "'tool_calls'inmessage") || has(s, "thinking")) {
    return Unimplemented(
        "chat template not recognised as the DeepSeek-V3 or DeepSeek-R1 format (supported: the "
        "templates of deepseek-ai/DeepSeek-V3 and DeepSeek-R1)");
  }
  ChatTemplate t;
  t.bos_ = std::move(bos_token);
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

ChatTemplate ChatTemplate::of_variant(Variant v, std::string bos_token) {
  ChatTemplate t;
  t.variant_ = v;
  t.bos_ = std::move(bos_token);
  t.join_system_ = v == Variant::kDeepSeekV3;
  t.strip_think_ = v == Variant::kDeepSeekR1;
  t.think_prompt_ = v == Variant::kDeepSeekR1;
  return t;
}

// Mirrors the Jinja template statement by statement; comments name the template's variables.
Result<std::string> ChatTemplate::render(std::span<const Message> messages,
                                         bool add_generation_prompt,
                                         std::span<const ToolDefinition> tools) const {
  auto need = [](const Message& m, size_t i) -> Status {
    if (m.content) return Status::Ok();
    return InvalidArgument("message " + std::to_string(i) + " (role '" + m.role +
                           "') has no content");
  };
  // ns.system_prompt
  std::string system;
  bool first_system = true;
  for (size_t i = 0; i < messages.size(); ++i) {
    const Message& m = messages[i];
    if (m.role != "system") continue;
    RETURN_IF_ERROR(need(m, i));
    if (!join_system_ || first_system) {
      if (join_system_)
        system += *m.content;
      else
        system = *m.content;
      first_system = false;
    } else {
      system += "\n\n" + *m.content;
    }
  }
  std::string out = bos_ + system;
  if (!tools.empty()) {
    if (!system.empty()) out += "\n\n";
    out += kToolsHead;
    for (const ToolDefinition& t : tools) out += "\n" + t.json;
    out += kToolsTail;
  }
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
