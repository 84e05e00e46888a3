// ChatTemplate: the DeepSeek-V3 and DeepSeek-R1 chat formats, implemented natively (no Jinja),
// producing exactly what Hugging Face's apply_chat_template(tokenize=False) renders from the
// checkpoint's tokenizer_config.json (verified against jinja2 on committed fixtures).
//
// The variant is recognised from the template text (for_tokenizer / from_template):
//   - DeepSeek-V3: system prompts joined by "\n\n" and put after BOS; <｜User｜>/<｜Assistant｜>
//     turns; assistant tool calls (content null) and tool outputs with the <｜tool▁...｜> tokens.
//   - DeepSeek-R1: the same turns; only the last system prompt is kept; the reasoning of earlier
//     assistant turns is dropped (text up to the last "</think>"); in later R1 revisions the
//     generation prompt opens the reasoning with "<think>\n".
// The checkpoints' templates render nothing for the API's `tools`; given tools, render() appends
// a description of them to the system prompt (the wording of vLLM's DeepSeek-V3 tool template:
// the tools as JSON inside <tools></tools>, then the call format; see docs/server.md).
// The templates' quirks are reproduced on purpose (e.g. the "first tool call" flag is never
// reset across messages; a single tool call gets no <｜tool▁calls▁end｜>), since the model was
// trained on exactly this text. An unrecognised template is an Unimplemented error.
//
// Immutable; render() is const and thread-safe.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

namespace moeserve {

struct ToolCall {
  std::string type = "function";
  std::string name;
  std::string arguments;  // JSON text, as the OpenAI API sends it
};

// A tool the model may call: the API's tool object, as Jinja's `tojson` (Python's json.dumps,
// ensure_ascii off, keys in the client's order) writes it.
struct ToolDefinition {
  std::string name;
  std::string json;
};

struct Message {
  std::string role;                    // "system", "user", "assistant", "tool"; others are ignored
  std::optional<std::string> content;  // null for an assistant turn that only calls tools
  std::optional<std::vector<ToolCall>> tool_calls;
  std::optional<std::string> tool_call_id;  // kept for API round-trips; not rendered
};

class ChatTemplate {
 public:
  enum class Variant { kDeepSeekV3, kDeepSeekR1 };

  // From the template text of a tokenizer_config.json and the BOS token string.
  static Result<ChatTemplate> from_template(const std::string& jinja, std::string bos_token);
  static Result<ChatTemplate> for_tokenizer(const Tokenizer& tok);
  // A variant without a template file (the R1 flavour here is the later one, with "<think>\n").
  static ChatTemplate of_variant(Variant v, std::string bos_token);

  // InvalidArgument when a message lacks what the template needs (user/system/tool content).
  // With `tools`, their description follows the system prompt.
  Result<std::string> render(std::span<const Message> messages, bool add_generation_prompt,
                             std::span<const ToolDefinition> tools = {}) const;

  Variant variant() const { return variant_; }
  // Whether the generation prompt ends inside an opened <think> block.
  bool generation_opens_think() const { return think_prompt_; }

 private:
  Variant variant_ = Variant::kDeepSeekV3;
  std::string bos_;
  bool join_system_ = true;    // V3: all system prompts joined; R1: the last one wins
  bool strip_think_ = false;   // R1: drop reasoning of earlier assistant turns
  bool think_prompt_ = false;  // R1 (later revisions): generation prompt adds "<think>\n"
};

}  // namespace moeserve
