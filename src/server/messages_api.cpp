#include "server/messages_api.h"

#include <optional>
#include <vector>

#include <fmt/format.h>

#include "server/api_json.h"
#include "server/generation_run.h"
#include "server/openai_service.h"

namespace moeserve {

namespace {

Reply anthropic_reply(const ApiError& e) {
  Reply r;
  r.status = e.http_status;
  r.body = anthropic_error_body(e);
  return r;
}

ApiError wrong_type(const std::string& param, const char* want) {
  return bad_request(fmt::format("{} must be {}", param, want), param);
}

// The text of a string or of text blocks (a tool_result's content, the system prompt).
std::optional<ApiError> blocks_text(const ojson& c, const std::string& where, std::string& out) {
  if (c.is_string()) {
    out = c.get<std::string>();
    return std::nullopt;
  }
  if (!c.is_array()) return wrong_type(where, "a string or an array of text blocks");
  for (size_t k = 0; k < c.size(); ++k) {
    const ojson& b = c[k];
    const std::string bw = fmt::format("{}[{}]", where, k);
    if (!b.is_object() || !b.contains("type") || b["type"] != "text" || !b.contains("text") ||
        !b["text"].is_string()) {
      if (b.is_object() && b.contains("type") && b["type"].is_string()) {
        return bad_request(fmt::format("{}: a '{}' block is not supported here (text only)", bw,
                                       b["type"].get<std::string>()),
                           bw);
      }
      return bad_request(bw + " must be a text block", bw);
    }
    if (!out.empty()) out += "\n";
    out += b["text"].get<std::string>();
  }
  return std::nullopt;
}

// One Anthropic message as chat messages: a user turn's tool results become tool messages
// (before its text); an assistant turn's tool_use blocks its tool calls, its thinking its
// reasoning_content.
std::optional<ApiError> translate_message(const ojson& m, const std::string& where, ojson& out) {
  if (!m.is_object()) return wrong_type(where, "an object");
  auto role = m.find("role");
  if (role == m.end() || !role->is_string() || (*role != "user" && *role != "assistant")) {
    return bad_request(where + ".role must be \"user\" or \"assistant\"", where + ".role");
  }
  auto content = m.find("content");
  if (content == m.end()) return bad_request(where + ".content is required", where + ".content");
  if (content->is_string()) {
    out.push_back({{"role", *role}, {"content", *content}});
    return std::nullopt;
  }
  if (!content->is_array()) return wrong_type(where + ".content", "a string or an array of blocks");
  std::string text, thinking;
  ojson calls = ojson::array();
  for (size_t k = 0; k < content->size(); ++k) {
    const ojson& b = (*content)[k];
    const std::string bw = fmt::format("{}.content[{}]", where, k);
    if (!b.is_object() || !b.contains("type") || !b["type"].is_string()) {
      return bad_request(bw + " must be a content block with a 'type'", bw);
    }
    const std::string type = b["type"].get<std::string>();
    if (type == "text") {
      if (!b.contains("text") || !b["text"].is_string())
        return wrong_type(bw + ".text", "a string");
      text += b["text"].get<std::string>();
    } else if (type == "tool_result" && *role == "user") {
      auto id = b.find("tool_use_id");
      if (id == b.end() || !id->is_string()) {
        return bad_request(bw + ".tool_use_id is required (a string)", bw + ".tool_use_id");
      }
      std::string result;
      if (auto c = b.find("content"); c != b.end() && !c->is_null()) {
        RETURN_IF_API_ERROR(blocks_text(*c, bw + ".content", result));
      }
      if (auto e = b.find("is_error"); e != b.end() && !e->is_null()) {
        if (!e->is_boolean()) return wrong_type(bw + ".is_error", "a boolean");
        if (e->get<bool>()) result = "Error: " + result;  // (the templates have no error flag)
      }
      out.push_back({{"role", "tool"}, {"tool_call_id", *id}, {"content", result}});
    } else if (type == "tool_use" && *role == "assistant") {
      auto id = b.find("id");
      auto name = b.find("name");
      auto input = b.find("input");
      if (id == b.end() || !id->is_string() || name == b.end() || !name->is_string()) {
        return bad_request(bw + " needs 'id' and 'name' (strings)", bw);
      }
      if (input == b.end() || !input->is_object()) return wrong_type(bw + ".input", "an object");
      calls.push_back({{"id", *id},
                       {"type", "function"},
                       {"function", {{"name", *name}, {"arguments", dump_json(*input)}}}});
    } else if (type == "thinking" && *role == "assistant") {
      if (!b.contains("thinking") || !b["thinking"].is_string()) {
        return wrong_type(bw + ".thinking", "a string");
      }
      thinking += b["thinking"].get<std::string>();
    } else if (type == "redacted_thinking" && *role == "assistant") {
      // (opaque to this server: nothing to render)
    } else if (type == "image" || type == "document") {
      return bad_request(
          fmt::format("{}: '{}' blocks are not supported: this model reads text only", bw, type),
          bw + ".type");
    } else {
      return bad_request(fmt::format("{}: a '{}' block is not supported in a {} message", bw, type,
                                     role->get<std::string>()),
                         bw + ".type");
    }
  }
  if (*role == "user") {
    if (!text.empty() || content->empty()) out.push_back({{"role", "user"}, {"content", text}});
    return std::nullopt;
  }
  ojson msg = {{"role", "assistant"}, {"content", text}};
  if (!thinking.empty()) msg["reasoning_content"] = thinking;
  if (!calls.empty()) {
    if (text.empty()) msg["content"] = nullptr;
    msg["tool_calls"] = std::move(calls);
  }
  out.push_back(std::move(msg));
  return std::nullopt;
}

// tools (custom tools with input_schema) and tool_choice as chat fields.
std::optional<ApiError> translate_tools(const ojson& body, ojson& chat) {
  if (auto tools = body.find("tools"); tools != body.end() && !tools->is_null()) {
    if (!tools->is_array()) return wrong_type("tools", "an array");
    ojson out = ojson::array();
    for (size_t i = 0; i < tools->size(); ++i) {
      const ojson& t = (*tools)[i];
      const std::string where = fmt::format("tools.{}", i);
      if (!t.is_object()) return wrong_type(where, "an object");
      if (auto type = t.find("type"); type != t.end() && !type->is_null() && *type != "custom") {
        return bad_request(fmt::format("{}.type '{}' is not supported: only custom tools are "
                                       "(this server runs no server tools)",
                                       where, type->dump()),
                           where + ".type");
      }
      auto name = t.find("name");
      if (name == t.end() || !name->is_string()) {
        return bad_request(where + ".name is required (a string)", where + ".name");
      }
      auto schema = t.find("input_schema");
      if (schema == t.end() || !schema->is_object()) {
        return bad_request(where + ".input_schema is required (a JSON Schema object)",
                           where + ".input_schema");
      }
      ojson fn = {{"name", *name}};
      if (auto d = t.find("description"); d != t.end() && !d->is_null()) fn["description"] = *d;
      fn["parameters"] = *schema;
      if (auto s = t.find("strict"); s != t.end() && !s->is_null()) fn["strict"] = *s;
      out.push_back({{"type", "function"}, {"function", std::move(fn)}});
    }
    chat["tools"] = std::move(out);
  }
  auto c = body.find("tool_choice");
  if (c == body.end() || c->is_null()) return std::nullopt;
  if (!c->is_object() || !c->contains("type") || !(*c)["type"].is_string()) {
    return bad_request("tool_choice must be an object with a 'type'", "tool_choice");
  }
  const std::string type = (*c)["type"].get<std::string>();
  if (type == "auto") {
    chat["tool_choice"] = "auto";
  } else if (type == "any") {
    chat["tool_choice"] = "required";
  } else if (type == "none") {
    chat["tool_choice"] = "none";
  } else if (type == "tool") {
    auto name = c->find("name");
    if (name == c->end() || !name->is_string()) {
      return bad_request("tool_choice.name is required with type \"tool\"", "tool_choice.name");
    }
    chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", *name}}}};
  } else {
    return bad_request(
        fmt::format("tool_choice.type must be auto, any, tool or none, not '{}'", type),
        "tool_choice.type");
  }
  if (auto d = c->find("disable_parallel_tool_use"); d != c->end() && !d->is_null()) {
    if (!d->is_boolean()) return wrong_type("tool_choice.disable_parallel_tool_use", "a boolean");
    chat["parallel_tool_calls"] = !d->get<bool>();
  }
  return std::nullopt;
}

// A Messages request as a chat completions body. `count_only`: for count_tokens (no max_tokens).
ApiResult<ojson> translate(std::string_view text, bool count_only) {
  ApiResult<ojson> parsed = parse_ordered_body(text);
  if (!parsed.ok()) return parsed.error();
  const ojson& body = *parsed;
  ojson chat = ojson::object();
  auto model = body.find("model");
  if (model == body.end() || !model->is_string()) {
    return bad_request("model: Field required (a string)", "model");
  }
  chat["model"] = *model;
  if (!count_only) {
    auto max = body.find("max_tokens");
    if (max == body.end() || max->is_null()) {
      return bad_request("max_tokens: Field required", "max_tokens");
    }
    chat["max_tokens"] = *max;
  }
  if (auto t = body.find("temperature"); t != body.end() && !t->is_null()) {
    if (!t->is_number() || t->get<double>() < 0 || t->get<double>() > 1) {
      return bad_request("temperature: must be a number in [0, 1]", "temperature");
    }
    chat["temperature"] = *t;
  }
  for (const char* key : {"top_p", "top_k", "stream"}) {
    if (auto v = body.find(key); v != body.end()) chat[key] = *v;
  }
  if (auto s = body.find("stop_sequences"); s != body.end() && !s->is_null()) {
    chat["stop"] = *s;
  }
  for (const char* key : {"container", "mcp_servers"}) {
    if (auto v = body.find(key); v != body.end() && !v->is_null()) {
      return bad_request(fmt::format("{} is not supported by this server", key), key);
    }
  }
  if (auto th = body.find("thinking"); th != body.end() && !th->is_null()) {
    if (!th->is_object() || !th->contains("type") || !(*th)["type"].is_string()) {
      return bad_request("thinking must be an object with a 'type'", "thinking");
    }
    const std::string type = (*th)["type"].get<std::string>();
    if (type != "enabled" && type != "disabled" && type != "adaptive") {
      return bad_request("thinking.type must be enabled, disabled or adaptive", "thinking.type");
    }
    chat["chat_template_kwargs"] = {{"thinking", type != "disabled"}};
  }
  // Structured outputs: output_config.format {"type": "json_schema", "schema": ...} (effort is
  // Claude's own dial; ignored).
  if (auto oc = body.find("output_config"); oc != body.end() && !oc->is_null()) {
    if (!oc->is_object()) return wrong_type("output_config", "an object");
    if (auto f = oc->find("format"); f != oc->end() && !f->is_null()) {
      if (!f->is_object() || !f->contains("type") || (*f)["type"] != "json_schema" ||
          !f->contains("schema") || !(*f)["schema"].is_object()) {
        return bad_request(
            "output_config.format must be {\"type\": \"json_schema\", \"schema\": {...}}",
            "output_config.format");
      }
      chat["response_format"] = {
          {"type", "json_schema"},
          {"json_schema", {{"name", "output"}, {"schema", (*f)["schema"]}, {"strict", true}}}};
    }
  }
  RETURN_IF_API_ERROR(translate_tools(body, chat));

  ojson messages = ojson::array();
  if (auto sys = body.find("system"); sys != body.end() && !sys->is_null()) {
    std::string s;
    RETURN_IF_API_ERROR(blocks_text(*sys, "system", s));
    messages.push_back({{"role", "system"}, {"content", s}});
  }
  auto ms = body.find("messages");
  if (ms == body.end() || !ms->is_array() || ms->empty()) {
    return bad_request("messages: a non-empty array is required", "messages");
  }
  for (size_t i = 0; i < ms->size(); ++i) {
    RETURN_IF_API_ERROR(translate_message((*ms)[i], fmt::format("messages.{}", i), messages));
  }
  chat["messages"] = std::move(messages);
  return chat;
}

// The content blocks of one message, built from the run's deltas in order, with the events
// that stream them. Thinking and text stream as they come; a tool call is held until it ends
// and becomes a tool_use block if its arguments are a JSON object (always, for a forced call:
// docs/server.md), else a text block with what the model wrote.
class BlockBuilder {
 public:
  BlockBuilder(std::string hex) : hex_(std::move(hex)) {}

  void add(const ChoiceDelta& d, std::vector<ojson>* events) {
    if (!d.reasoning.empty()) append(Kind::kThinking, d.reasoning, events);
    if (!d.content.empty()) append(Kind::kText, d.content, events);
    for (const ToolCallDelta& c : d.tool_calls) {
      if (c.opens) {
        close(events);
        open_ = Kind::kCall;
        call_name_ = c.name;
        text_.clear();
      }
      text_ += c.arguments;
    }
  }

  void finish(std::vector<ojson>* events) { close(events); }

  const ojson& blocks() const { return blocks_; }
  int64_t tool_uses() const { return tool_uses_; }

 private:
  enum class Kind { kNone, kThinking, kText, kCall };

  void emit(std::vector<ojson>* events, ojson e) {
    if (events) events->push_back(std::move(e));
  }

  void start(ojson block, std::vector<ojson>* events) {
    blocks_.push_back(block);
    emit(events, {{"type", "content_block_start"},
                  {"index", blocks_.size() - 1},
                  {"content_block", std::move(block)}});
  }

  void delta(ojson d, std::vector<ojson>* events) {
    emit(events,
         {{"type", "content_block_delta"}, {"index", blocks_.size() - 1}, {"delta", std::move(d)}});
  }

  void append(Kind kind, const std::string& piece, std::vector<ojson>* events) {
    if (open_ != kind) {
      close(events);
      open_ = kind;
      if (kind == Kind::kThinking) {
        start({{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}, events);
      } else {
        start({{"type", "text"}, {"text", ""}}, events);
      }
    }
    ojson& b = blocks_.back();
    if (kind == Kind::kThinking) {
      b["thinking"] = b["thinking"].get<std::string>() + piece;
      delta({{"type", "thinking_delta"}, {"thinking", piece}}, events);
    } else {
      b["text"] = b["text"].get<std::string>() + piece;
      delta({{"type", "text_delta"}, {"text", piece}}, events);
    }
  }

  void close(std::vector<ojson>* events) {
    if (open_ == Kind::kNone) return;
    if (open_ == Kind::kCall) {
      const ojson input = ojson::parse(text_, nullptr, /*allow_exceptions=*/false);
      if (!input.is_discarded() && input.is_object()) {
        const std::string id = fmt::format("toolu_{}{:02x}", hex_, tool_uses_++);
        start({{"type", "tool_use"}, {"id", id}, {"name", call_name_}, {"input", ojson::object()}},
              events);
        blocks_.back()["input"] = input;
        delta({{"type", "input_json_delta"}, {"partial_json", text_}}, events);
      } else {
        open_ = Kind::kNone;
        append(Kind::kText, call_name_ + text_, events);
      }
    }
    emit(events, {{"type", "content_block_stop"}, {"index", blocks_.size() - 1}});
    open_ = Kind::kNone;
    text_.clear();
  }

  const std::string hex_;
  ojson blocks_ = ojson::array();
  Kind open_ = Kind::kNone;
  std::string text_, call_name_;  // an unfinished call's arguments and name
  int64_t tool_uses_ = 0;
};

struct StopInfo {
  std::string reason;
  ojson sequence;  // the stop string, or null
};

StopInfo stop_info(const GenerationRun& run, const BlockBuilder& blocks) {
  const ChoiceOutput& out = *run.choices[0].out;
  const std::string& finish = *out.finish_reason();
  if (finish == "length") return {"max_tokens", nullptr};
  if (!out.stop_string().empty()) return {"stop_sequence", out.stop_string()};
  if (finish == "tool_calls" && blocks.tool_uses() > 0) return {"tool_use", nullptr};
  return {"end_turn", nullptr};
}

// Anthropic counts input_tokens without the cached part.
ojson usage_object(const RunUsage& u) {
  return {{"input_tokens", u.prompt_tokens - u.cached_prompt_tokens},
          {"cache_creation_input_tokens", 0},
          {"cache_read_input_tokens", u.cached_prompt_tokens},
          {"output_tokens", u.completion_tokens}};
}

ojson message_object(const GenerationRun& run, const std::string& model, ojson content) {
  return {{"id", run.id},
          {"type", "message"},
          {"role", "assistant"},
          {"model", model},
          {"content", std::move(content)},
          {"stop_reason", nullptr},
          {"stop_sequence", nullptr},
          {"usage", usage_object(run.usage())}};
}

// Anthropic's stream: message_start, the blocks' start / delta / stop, message_delta with the
// stop reason and usage, message_stop.
class MessageStream final : public ReplyStream {
 public:
  MessageStream(std::shared_ptr<GenerationRun> run, std::string model)
      : run_(std::move(run)), model_(std::move(model)), blocks_(id_suffix(run_->id)) {}

  bool next(std::string& out, std::chrono::milliseconds wait) override {
    if (complete_) return false;
    std::vector<ojson> events;
    run_->pump(wait, [&](int, ChoiceDelta& d) { blocks_.add(d, &events); });
    if (!started_ && (!events.empty() || run_->done())) {
      started_ = true;  // (after the first output: the cached token count is known)
      ojson m = message_object(*run_, model_, ojson::array());
      m["usage"]["output_tokens"] = 0;
      send(out, {{"type", "message_start"}, {"message", std::move(m)}});
    }
    if (run_->error) {
      send(out, ojson::parse(anthropic_error_body(*run_->error)));
      complete_ = true;
      return false;
    }
    if (run_->done()) blocks_.finish(&events);
    for (ojson& e : events) send(out, std::move(e));
    if (!run_->done()) return true;
    const StopInfo stop = stop_info(*run_, blocks_);
    send(out, {{"type", "message_delta"},
               {"delta", {{"stop_reason", stop.reason}, {"stop_sequence", stop.sequence}}},
               {"usage", usage_object(run_->usage())}});
    send(out, {{"type", "message_stop"}});
    complete_ = true;
    return false;
  }

  void abandon() override { run_->abandon(); }

 private:
  static void send(std::string& out, const ojson& e) {
    out += "event: ";
    out += e["type"].get<std::string>();
    out += "\ndata: ";
    out += dump_json(e);
    out += "\n\n";
  }

  std::shared_ptr<GenerationRun> run_;
  const std::string model_;
  BlockBuilder blocks_;
  bool started_ = false;
  bool complete_ = false;
};

}  // namespace

std::string anthropic_error_body(const ApiError& e) {
  const char* type = "api_error";
  switch (e.http_status) {
    case 400:
    case 422:
      type = "invalid_request_error";
      break;
    case 401:
      type = "authentication_error";
      break;
    case 403:
      type = "permission_error";
      break;
    case 404:
      type = "not_found_error";
      break;
    case 413:
      type = "request_too_large";
      break;
    case 429:
      type = "rate_limit_error";
      break;
    case 503:
    case 529:
      type = "overloaded_error";
      break;
    default:
      if (e.http_status >= 400 && e.http_status < 500) type = "invalid_request_error";
  }
  return dump_json({{"type", "error"}, {"error", {{"type", type}, {"message", e.message}}}});
}

Reply MessagesApi::create(std::string_view body) {
  ApiResult<ojson> chat = translate(body, /*count_only=*/false);
  if (!chat.ok()) return anthropic_reply(chat.error());
  ApiResult<ChatCompletionRequest> req = parse_chat_request(dump_json(*chat), service_.limits());
  if (!req.ok()) return anthropic_reply(req.error());
  const bool stream = req->gen.stream;
  ApiResult<std::shared_ptr<GenerationRun>> run = service_.start_chat(std::move(*req), "msg_");
  if (!run.ok()) return anthropic_reply(run.error());
  if (stream) {
    Reply r;
    r.content_type = "text/event-stream";
    r.stream = std::make_shared<MessageStream>(std::move(*run), service_.served_model_name());
    return r;
  }
  GenerationRun& g = **run;
  BlockBuilder blocks(id_suffix(g.id));
  while (!g.done()) {
    g.pump(std::chrono::milliseconds(200), [&](int, ChoiceDelta& d) { blocks.add(d, nullptr); });
  }
  if (g.error) return anthropic_reply(*g.error);
  blocks.finish(nullptr);
  ojson m = message_object(g, service_.served_model_name(), blocks.blocks());
  const StopInfo stop = stop_info(g, blocks);
  m["stop_reason"] = stop.reason;
  m["stop_sequence"] = stop.sequence;
  Reply r;
  r.body = dump_json(m);
  return r;
}

Reply MessagesApi::count_tokens(std::string_view body) {
  ApiResult<ojson> chat = translate(body, /*count_only=*/true);
  if (!chat.ok()) return anthropic_reply(chat.error());
  ApiResult<ChatCompletionRequest> req = parse_chat_request(dump_json(*chat), service_.limits());
  if (!req.ok()) return anthropic_reply(req.error());
  ApiResult<int64_t> n = service_.count_chat_tokens(std::move(*req));
  if (!n.ok()) return anthropic_reply(n.error());
  Reply r;
  r.body = dump_json({{"input_tokens", *n}});
  return r;
}

}  // namespace moeserve
