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
//   - DeepSeek-V3-0324 and DeepSeek-R1-0528: the user turn ends with <｜Assistant｜> (so the
//     generation prompt adds nothing after a user turn); tool calls may follow text; a tool
//     round's outputs are closed before the next calls; R1-0528 drops earlier reasoning.
//   - DeepSeek-V3.1 (and V3.1-Terminus): tool calls as name<｜tool▁sep｜>arguments; the
//     assistant turn opens with "</think>" (non-thinking) or "<think>" (`thinking`); earlier
//     reasoning is dropped (text after the first "</think>").
//   - DeepSeek-V3.2 and V3.2-Speciale (kDeepSeekV3_2): no Jinja template; DeepSeek's Python
//     encoder (encoding_dsv32.py) as SGLang's server prepares a request for it, held to that
//     encoder by tests/data/tokenizer/chat_dsv32.jsonl; see chat_template_dsv32.cpp and
//     docs/server.md. Chosen by the checkpoint's model_type, not by a template.
//   - DeepSeek-V4 (kDeepSeekV4): likewise no template; DeepSeek's encoding_dsv4.py, the request
//     prepared as for V3.2, held to it by tests/data/tokenizer/chat_dsv4.jsonl: tool outputs in
//     <tool_result> blocks of user turns, calls in a <｜DSML｜tool_calls> block, the
//     latest_reminder role, reasoning_effort "max". Chosen by model_type deepseek_v4.
// The checkpoints' templates render nothing for the API's `tools`; given tools, render() appends
// a description of them to the system prompt: for V3/R1 the wording of vLLM's DeepSeek-V3 tool
// template (the tools as JSON inside <tools></tools>, then the call format), for V3.1 the
// description its model card gives (a "### name" section per tool, then the call format); see
// docs/server.md.
// The templates' quirks are reproduced on purpose (e.g. the "first tool call" flag is never
// reset across messages; a single tool call gets no <｜tool▁calls▁end｜>), since the model was
// trained on exactly this text. An unrecognised template is an Unimplemented error.
//
// Immutable; render() is const and thread-safe.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

namespace moeserve {

struct ToolCall {
  std::string type = "function";
  std::string name;
  std::string arguments;  // JSON text, as the OpenAI API sends it
  std::string id;         // the call's id ("" when none); V4 orders tool outputs by it
};

// A tool the model may call. JSON text as Jinja's `tojson` (Python's json.dumps, ensure_ascii
// off, keys in the client's order) writes it: `json` the API's whole tool object (the V3/R1
// description), `parameters` its function's parameters ("{}" when the client sent none) and
// `description` its description ("" when none) for the V3.1 description.
struct ToolDefinition {
  std::string name;
  std::string json;
  std::string description;
  std::string parameters = "{}";
  std::string function_json;  // the "function" object alone (V3.2's tool schemas)
  bool strict = false;        // the function's "strict" (its arguments follow the schema exactly)
};

struct Message {
  std::string role;                    // "system", "user", "assistant", "tool"; others are ignored
  std::optional<std::string> content;  // null for an assistant turn that only calls tools
  std::optional<std::vector<ToolCall>> tool_calls;
  std::optional<std::string> tool_call_id;  // kept for API round-trips; not rendered
  // An earlier turn's reasoning, as DeepSeek's API returns it; only V3.2 renders it (the
  // templates before it keep reasoning in `content`).
  std::optional<std::string> reasoning_content;
  // DeepSeek-V4's quick-instruction tasks (encoding_dsv4.py's DS_TASK_SP_TOKENS: action, query,
  // authority, domain, title, read_url): the message is followed by the task's token instead of
  // the assistant's turn opening; other templates ignore it.
  std::optional<std::string> task;
};

class ChatTemplate {
 public:
  // kDeepSeekV3_0324 / kDeepSeekR1_0528: the later form (the user turn opens the assistant's,
  // tool calls after a tool round close its outputs); kDeepSeekV3_1: V3.1 (and V3.1-Terminus),
  // a hybrid reasoning model with the `thinking` switch and its own tool-call format.
  enum class Variant {
    kDeepSeekV3,
    kDeepSeekR1,
    kDeepSeekV3_0324,
    kDeepSeekR1_0528,
    kDeepSeekV3_1,
    kDeepSeekV3_2,
    kDeepSeekV4
  };

  // From the template text of a tokenizer_config.json and the BOS token string.
  static Result<ChatTemplate> from_template(const std::string& jinja, std::string bos_token);
  static Result<ChatTemplate> for_tokenizer(const Tokenizer& tok);
  // The tokenizer's template, or for a model family whose checkpoints ship none (DeepSeek-V3.2,
  // `model_type` deepseek_v32; DeepSeek-V4, deepseek_v4) its encoder.
  static Result<ChatTemplate> for_model(const Tokenizer& tok, std::string_view model_type);
  // A variant without a template file (the R1 flavour here is the later one, with "<think>\n").
  static ChatTemplate of_variant(Variant v, std::string bos_token);

  // InvalidArgument when a message lacks what the template needs (user/system/tool content;
  // for R1-0528 and V3.1 also an assistant turn's), where jinja2 raises an error (V3.2: where
  // its encoder raises). With `tools`, their description follows the system prompt.
  // `thinking`: the V3.1 template's switch and V3.2's thinking_mode
  // (chat_template_kwargs.thinking; off by default, as there). V3.2's encoder has no
  // generation-prompt switch: a user turn always opens the assistant's (V4: a user turn that
  // is last or followed by an assistant or latest_reminder turn). `reasoning_effort`: V4's
  // ("max" or "high"; "" for none; other values an error), ignored by the other variants.
  Result<std::string> render(std::span<const Message> messages, bool add_generation_prompt,
                             std::span<const ToolDefinition> tools = {}, bool thinking = false,
                             std::string_view reasoning_effort = {}) const;

  Variant variant() const { return variant_; }
  // Whether the model writes reasoning (<think>...</think>) before its answer.
  bool reasons(bool thinking = false) const {
    return variant_ == Variant::kDeepSeekR1 || variant_ == Variant::kDeepSeekR1_0528 ||
           (hybrid() && thinking);
  }
  // Whether the generation prompt ends inside an opened <think> block.
  bool generation_opens_think(bool thinking = false) const {
    return think_prompt_ || (hybrid() && thinking);
  }
  // V3.1, V3.2 and V4: a thinking and a non-thinking mode, switched per request.
  bool hybrid() const {
    return variant_ == Variant::kDeepSeekV3_1 || variant_ == Variant::kDeepSeekV3_2 ||
           variant_ == Variant::kDeepSeekV4;
  }

 private:
  Variant variant_ = Variant::kDeepSeekV3;
  std::string bos_;
  bool join_system_ = true;    // V3: all system prompts joined; R1: the last one wins
  bool strip_think_ = false;   // R1: drop reasoning of earlier assistant turns
  bool think_prompt_ = false;  // R1 (later revisions): generation prompt adds "<think>\n"

  Result<std::string> render_v3_r1(std::span<const Message> messages, bool add_generation_prompt,
                                   std::span<const ToolDefinition> tools) const;
  Result<std::string> render_0324(std::span<const Message> messages, bool add_generation_prompt,
                                  std::span<const ToolDefinition> tools) const;
  Result<std::string> render_v3_1(std::span<const Message> messages, bool add_generation_prompt,
                                  std::span<const ToolDefinition> tools, bool thinking) const;
  Result<std::string> render_v3_2(std::span<const Message> messages,
                                  std::span<const ToolDefinition> tools, bool thinking) const;
  Result<std::string> render_v4(std::span<const Message> messages,
                                std::span<const ToolDefinition> tools, bool thinking,
                                std::string_view reasoning_effort) const;
};

}  // namespace moeserve
