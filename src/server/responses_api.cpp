#include "server/responses_api.h"

#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "server/api_json.h"
#include "server/generation_run.h"
#include "server/openai_service.h"

namespace moeserve {

using Clock = std::chrono::steady_clock;

namespace {

Reply json_reply(const ojson& j) {
  Reply r;
  r.body = dump_json(j);
  return r;
}

ApiError not_found(std::string_view id) {
  ApiError e;
  e.http_status = 404;
  e.message = fmt::format(
      "No response with id '{}' is stored (responses are kept for a limited "
      "time; see docs/server.md).",
      id);
  e.code = "response_not_found";
  return e;
}

ApiError wrong_type(const std::string& param, const char* want) {
  return bad_request(fmt::format("'{}' must be {}", param, want), param);
}

}  // namespace

// The stored responses: what previous_response_id continues from and GET returns.
class ResponsesApi::Store {
 public:
  struct Entry {
    std::string response;  // the Response object
    ojson input_items;     // this request's input, as items
    ojson conversation;    // chat messages: the earlier turns, this input, this output
  };

  explicit Store(ResponsesOptions o) : o_(o) {}

  void put(const std::string& id, Entry e) {
    std::lock_guard<std::mutex> lock(mu_);
    const Clock::time_point now = Clock::now();
    evict_locked(now);
    by_id_[id] = std::make_shared<const Entry>(std::move(e));
    order_.push_back({id, now});
    while (by_id_.size() > o_.max_stored && !order_.empty()) {
      by_id_.erase(order_.front().first);
      order_.pop_front();
    }
  }

  std::shared_ptr<const Entry> get(std::string_view id) {
    std::lock_guard<std::mutex> lock(mu_);
    evict_locked(Clock::now());
    auto it = by_id_.find(id);
    return it == by_id_.end() ? nullptr : it->second;
  }

  bool remove(std::string_view id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = by_id_.find(id);
    if (it == by_id_.end()) return false;
    by_id_.erase(it);  // (its order_ entry goes when it expires or is pushed out)
    return true;
  }

 private:
  void evict_locked(Clock::time_point now) {
    while (!order_.empty() && now - order_.front().second > o_.retention) {
      by_id_.erase(order_.front().first);
      order_.pop_front();
    }
  }

  const ResponsesOptions o_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<const Entry>, std::less<>> by_id_;  // guarded by mu_
  std::deque<std::pair<std::string, Clock::time_point>> order_;             // guarded by mu_
};

namespace {

// A Responses request as a chat request, with what the Response object and the store need.
struct Translated {
  ojson chat = ojson::object();         // the chat completions body
  ojson input_items = ojson::array();   // this request's input, as items
  ojson conversation = ojson::array();  // earlier turns and this input, as chat messages
  ojson echo = ojson::object();         // the request fields a Response repeats
  bool store = true;
};

// A message's text: a string, or parts of type input_text / output_text (refusal: its text).
std::optional<ApiError> content_text(const ojson& c, const std::string& where, std::string& out) {
  if (c.is_string()) {
    out = c.get<std::string>();
    return std::nullopt;
  }
  if (!c.is_array()) return wrong_type(where, "a string or an array of content parts");
  for (size_t k = 0; k < c.size(); ++k) {
    const ojson& part = c[k];
    const std::string pw = fmt::format("{}[{}]", where, k);
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
      return bad_request(pw + " must be a content part with a 'type'", pw);
    }
    const std::string type = part["type"].get<std::string>();
    const char* field = type == "refusal" ? "refusal" : "text";
    if (type == "input_text" || type == "output_text" || type == "text" || type == "refusal") {
      auto t = part.find(field);
      if (t == part.end() || !t->is_string()) return wrong_type(pw + "." + field, "a string");
      out += t->get<std::string>();
    } else if (type == "input_image" || type == "input_file" || type == "input_audio") {
      return bad_request(
          fmt::format("{}.type '{}' is not supported: this model reads text only", pw, type),
          pw + ".type");
    } else {
      return bad_request(
          fmt::format("{}.type '{}' is not a content part this server knows", pw, type),
          pw + ".type");
    }
  }
  return std::nullopt;
}

std::optional<ApiError> string_field(const ojson& item, const char* key, const std::string& where,
                                     std::string& out, bool non_empty = true) {
  auto v = item.find(key);
  if (v == item.end() || !v->is_string() ||
      (non_empty && v->get_ref<const std::string&>().empty())) {
    return bad_request(
        fmt::format("{}.{} is required (a {}string)", where, key, non_empty ? "non-empty " : ""),
        where + "." + key);
  }
  out = v->get<std::string>();
  return std::nullopt;
}

// `input` (a string, or input items) as chat messages appended to `messages`.
std::optional<ApiError> input_messages(const ojson& input, ojson& messages) {
  if (input.is_string()) {
    messages.push_back({{"role", "user"}, {"content", input}});
    return std::nullopt;
  }
  if (!input.is_array()) return wrong_type("input", "a string or an array of input items");
  std::optional<std::string> reasoning;  // a reasoning item's text, for the next assistant turn
  auto assistant_turn = [&](ojson msg) {
    if (reasoning) msg["reasoning_content"] = *std::exchange(reasoning, std::nullopt);
    messages.push_back(std::move(msg));
  };
  for (size_t i = 0; i < input.size(); ++i) {
    const ojson& item = input[i];
    const std::string where = fmt::format("input[{}]", i);
    if (!item.is_object()) return wrong_type(where, "an object (an input item)");
    std::string type = item.contains("role") ? "message" : "";
    if (auto t = item.find("type"); t != item.end() && !t->is_null()) {
      if (!t->is_string()) return wrong_type(where + ".type", "a string");
      type = t->get<std::string>();
    }
    if (type == "message") {
      std::string role;
      RETURN_IF_API_ERROR(string_field(item, "role", where, role));
      if (role != "user" && role != "system" && role != "developer" && role != "assistant") {
        return bad_request(
            fmt::format("{}.role '{}' must be user, system, developer or assistant", where, role),
            where + ".role");
      }
      auto c = item.find("content");
      if (c == item.end()) return bad_request(where + ".content is required", where + ".content");
      std::string text;
      RETURN_IF_API_ERROR(content_text(*c, where + ".content", text));
      if (role == "assistant") {
        assistant_turn({{"role", "assistant"}, {"content", text}});
      } else {
        messages.push_back({{"role", role == "developer" ? "system" : role}, {"content", text}});
      }
    } else if (type == "function_call") {
      std::string call_id, name, arguments;
      RETURN_IF_API_ERROR(string_field(item, "call_id", where, call_id));
      RETURN_IF_API_ERROR(string_field(item, "name", where, name));
      RETURN_IF_API_ERROR(string_field(item, "arguments", where, arguments, /*non_empty=*/false));
      ojson call = {{"id", call_id},
                    {"type", "function"},
                    {"function", {{"name", name}, {"arguments", arguments}}}};
      // Calls that follow an assistant turn are that turn's (parallel calls, or text then calls).
      if (!reasoning && !messages.empty() && messages.back()["role"] == "assistant") {
        ojson& last = messages.back();
        if (!last.contains("tool_calls")) last["tool_calls"] = ojson::array();
        last["tool_calls"].push_back(std::move(call));
      } else {
        assistant_turn(
            {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", ojson::array({call})}});
      }
    } else if (type == "function_call_output") {
      std::string call_id, output;
      RETURN_IF_API_ERROR(string_field(item, "call_id", where, call_id));
      auto o = item.find("output");
      if (o == item.end()) return bad_request(where + ".output is required", where + ".output");
      RETURN_IF_API_ERROR(content_text(*o, where + ".output", output));
      messages.push_back({{"role", "tool"}, {"tool_call_id", call_id}, {"content", output}});
    } else if (type == "reasoning") {
      std::string text;
      for (const char* key : {"content", "summary"}) {
        auto parts = item.find(key);
        if (parts == item.end() || parts->is_null()) continue;
        if (!parts->is_array()) return wrong_type(where + "." + key, "an array");
        for (const ojson& p : *parts) {
          if (p.is_object() && p.contains("text") && p["text"].is_string()) {
            text += p["text"].get<std::string>();
          }
        }
        if (!text.empty()) break;  // the full text when given, else the summary
      }
      reasoning = std::move(text);
    } else {
      return bad_request(fmt::format("{}.type '{}' is not supported (message, function_call, "
                                     "function_call_output and reasoning items are)",
                                     where, type),
                         where + ".type");
    }
  }
  return std::nullopt;
}

// tools in the Responses API's flat form as chat tools; tool_choice likewise.
std::optional<ApiError> translate_tools(const ojson& body, ojson& chat) {
  if (auto tools = body.find("tools"); tools != body.end() && !tools->is_null()) {
    if (!tools->is_array()) return wrong_type("tools", "an array");
    ojson out = ojson::array();
    for (size_t i = 0; i < tools->size(); ++i) {
      const ojson& t = (*tools)[i];
      const std::string where = fmt::format("tools[{}]", i);
      if (!t.is_object()) return wrong_type(where, "an object");
      auto type = t.find("type");
      if (type == t.end() || !type->is_string()) {
        return bad_request(where + ".type is required", where + ".type");
      }
      if (*type != "function") {
        return bad_request(fmt::format("{}.type '{}' is not supported: only function tools are "
                                       "(this server runs no hosted tools)",
                                       where, type->get<std::string>()),
                           where + ".type");
      }
      ojson fn = ojson::object();
      for (auto it = t.begin(); it != t.end(); ++it) {
        if (it.key() != "type") fn[it.key()] = it.value();
      }
      out.push_back({{"type", "function"}, {"function", std::move(fn)}});
    }
    chat["tools"] = std::move(out);
  }
  if (auto c = body.find("tool_choice"); c != body.end() && !c->is_null()) {
    if (c->is_object()) {
      auto type = c->find("type");
      auto name = c->find("name");
      if (type == c->end() || *type != "function" || name == c->end() || !name->is_string()) {
        return bad_request(
            "'tool_choice' as an object must be {\"type\": \"function\", \"name\": ...}",
            "tool_choice");
      }
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", *name}}}};
    } else {
      chat["tool_choice"] = *c;  // "auto", "none", "required" (the chat parser checks)
    }
  }
  return std::nullopt;
}

// text.format as a chat response_format.
std::optional<ApiError> translate_text(const ojson& body, ojson& chat) {
  auto text = body.find("text");
  if (text == body.end() || text->is_null()) return std::nullopt;
  if (!text->is_object()) return wrong_type("text", "an object");
  auto format = text->find("format");
  if (format == text->end() || format->is_null()) return std::nullopt;
  if (!format->is_object() || !format->contains("type") || !(*format)["type"].is_string()) {
    return bad_request("'text.format' must be an object with a 'type'", "text.format");
  }
  const std::string type = (*format)["type"].get<std::string>();
  if (type == "text") return std::nullopt;
  if (type == "json_object") {
    chat["response_format"] = {{"type", "json_object"}};
  } else if (type == "json_schema") {
    ojson js = ojson::object();
    for (const char* key : {"name", "schema", "strict", "description"}) {
      if (format->contains(key)) js[key] = (*format)[key];
    }
    chat["response_format"] = {{"type", "json_schema"}, {"json_schema", std::move(js)}};
  } else {
    return bad_request(
        fmt::format("'text.format.type' must be text, json_object or json_schema, not '{}'", type),
        "text.format.type");
  }
  return std::nullopt;
}

ApiResult<Translated> translate(std::string_view text, ResponsesApi::Store& store) {
  ApiResult<ojson> parsed = parse_ordered_body(text);
  if (!parsed.ok()) return parsed.error();
  const ojson& body = *parsed;
  Translated t;
  ojson& chat = t.chat;
  for (const char* key : {"background", "conversation", "prompt"}) {
    auto v = body.find(key);
    if (v != body.end() && !v->is_null() && *v != false) {
      return bad_request(fmt::format("'{}' is not supported by this server", key), key);
    }
  }
  if (auto v = body.find("top_logprobs"); v != body.end() && !v->is_null() && *v != 0) {
    return bad_request(
        "'top_logprobs' is not supported on /v1/responses (use /v1/chat/completions)",
        "top_logprobs");
  }
  // Fields with the same name and meaning in a chat request (with vLLM's sampling extensions).
  for (const char* key :
       {"model", "temperature", "top_p", "parallel_tool_calls", "stream", "seed", "top_k", "min_p",
        "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias"}) {
    if (auto v = body.find(key); v != body.end()) chat[key] = *v;
  }
  if (auto v = body.find("max_output_tokens"); v != body.end()) chat["max_completion_tokens"] = *v;
  if (auto e = translate_tools(body, chat)) return *e;
  if (auto e = translate_text(body, chat)) return *e;
  if (auto r = body.find("reasoning"); r != body.end() && !r->is_null()) {
    if (!r->is_object()) return wrong_type("reasoning", "an object");
    auto effort = r->find("effort");
    if (effort != r->end() && !effort->is_null()) {
      if (!effort->is_string()) return wrong_type("reasoning.effort", "a string");
      // A hybrid model (DeepSeek-V3.1) thinks unless told "none"; R1 always does. The effort
      // itself is chat completions' reasoning_effort (DeepSeek-V4's prompt takes max).
      chat["chat_template_kwargs"] = {{"thinking", *effort != "none"}};
      chat["reasoning_effort"] = *effort;
    }
  }
  if (auto s = body.find("store"); s != body.end() && !s->is_null()) {
    if (!s->is_boolean()) return wrong_type("store", "a boolean");
    t.store = s->get<bool>();
  }

  // The conversation: the earlier responses', then this input.
  if (auto prev = body.find("previous_response_id"); prev != body.end() && !prev->is_null()) {
    if (!prev->is_string()) return wrong_type("previous_response_id", "a string");
    std::shared_ptr<const ResponsesApi::Store::Entry> e = store.get(prev->get<std::string>());
    if (!e) {
      ApiError err = bad_request(
          fmt::format("Previous response with id '{}' not found.", prev->get<std::string>()),
          "previous_response_id");
      err.code = "previous_response_not_found";
      return err;
    }
    t.conversation = e->conversation;
  }
  auto input = body.find("input");
  if (input == body.end() || input->is_null()) return bad_request("'input' is required", "input");
  const size_t earlier = t.conversation.size();
  if (auto e = input_messages(*input, t.conversation)) return *e;
  if (t.conversation.size() == earlier) return bad_request("'input' has no items", "input");
  if (input->is_string()) {
    ojson part = {{"type", "input_text"}, {"text", *input}};
    ojson item = {{"type", "message"}, {"role", "user"}, {"content", ojson::array({part})}};
    t.input_items = ojson::array({item});
  } else {
    t.input_items = *input;
  }
  ojson messages = ojson::array();
  if (auto ins = body.find("instructions"); ins != body.end() && !ins->is_null()) {
    if (!ins->is_string()) return wrong_type("instructions", "a string");
    // (An earlier response's instructions are not carried over, as OpenAI does.)
    messages.push_back({{"role", "system"}, {"content", *ins}});
  }
  for (const ojson& m : t.conversation) messages.push_back(m);
  chat["messages"] = std::move(messages);

  const auto echo = [&](const char* key, ojson fallback) {
    auto v = body.find(key);
    t.echo[key] = v == body.end() || v->is_null() ? std::move(fallback) : *v;
  };
  echo("instructions", nullptr);
  echo("max_output_tokens", nullptr);
  echo("metadata", ojson::object());
  echo("parallel_tool_calls", true);
  echo("previous_response_id", nullptr);
  echo("reasoning", {{"effort", nullptr}, {"summary", nullptr}});
  echo("temperature", 1.0);
  echo("text", {{"format", {{"type", "text"}}}});
  echo("tool_choice", "auto");
  echo("tools", ojson::array());
  echo("top_p", 1.0);
  echo("truncation", "disabled");
  echo("user", nullptr);
  t.echo["store"] = t.store;
  t.echo["background"] = false;
  return t;
}

// The output items of one response, built from the run's deltas in order; the same builder makes
// a streamed response's events and a blocking one's items, so both say the same.
class OutputBuilder {
 public:
  OutputBuilder(std::string hex, const GenerationRun& run) : hex_(std::move(hex)), run_(run) {}

  // Appends the events of `d` to `events` (nullptr: none wanted).
  void add(const ChoiceDelta& d, std::vector<ojson>* events) {
    if (!d.reasoning.empty()) {
      if (open_ != Kind::kReasoning) open(Kind::kReasoning, nullptr, events);
      text_ += d.reasoning;
      reasoning_ += d.reasoning;
      emit(events, {{"type", "response.reasoning_text.delta"},
                    {"item_id", item_id()},
                    {"output_index", index()},
                    {"content_index", 0},
                    {"delta", d.reasoning}});
    }
    if (!d.content.empty()) {
      if (open_ != Kind::kMessage) open(Kind::kMessage, nullptr, events);
      text_ += d.content;
      content_ += d.content;
      emit(events, {{"type", "response.output_text.delta"},
                    {"item_id", item_id()},
                    {"output_index", index()},
                    {"content_index", 0},
                    {"delta", d.content},
                    {"logprobs", ojson::array()}});
    }
    for (const ToolCallDelta& c : d.tool_calls) {
      if (c.opens) open(Kind::kCall, &c, events);
      // (A call's fragments follow its opening delta; the parser sends nothing else between.)
      if (c.arguments.empty() || open_ != Kind::kCall) continue;
      text_ += c.arguments;
      calls_.back()["function"]["arguments"] = text_;
      emit(events, {{"type", "response.function_call_arguments.delta"},
                    {"item_id", item_id()},
                    {"output_index", index()},
                    {"delta", c.arguments}});
    }
  }

  // Closes the open item; `complete` false: it was cut short (max_output_tokens).
  void finish(bool complete, std::vector<ojson>* events) { close(complete, events); }

  const ojson& items() const { return items_; }

  // The output as the assistant turn of a chat conversation (for previous_response_id).
  ojson assistant_message() const {
    ojson m = {{"role", "assistant"}, {"content", content_}};
    if (!reasoning_.empty()) m["reasoning_content"] = reasoning_;
    if (!calls_.empty()) {
      if (content_.empty()) m["content"] = nullptr;
      m["tool_calls"] = calls_;
    }
    return m;
  }

  std::string output_text() const { return content_; }

 private:
  enum class Kind { kNone, kReasoning, kMessage, kCall };

  int64_t index() const { return int64_t(items_.size()) - 1; }
  std::string item_id() const { return items_.back()["id"].get<std::string>(); }

  void emit(std::vector<ojson>* events, ojson e) {
    if (events) events->push_back(std::move(e));
  }

  void open(Kind kind, const ToolCallDelta* call, std::vector<ojson>* events) {
    close(/*complete=*/true, events);
    open_ = kind;
    text_.clear();
    const char* prefix = kind == Kind::kReasoning ? "rs" : kind == Kind::kMessage ? "msg" : "fc";
    const std::string id = fmt::format("{}_{}{:02x}", prefix, hex_, items_.size());
    ojson item;
    ojson part;
    switch (kind) {
      case Kind::kReasoning:
        item = {{"id", id},
                {"type", "reasoning"},
                {"summary", ojson::array()},
                {"content", ojson::array()},
                {"status", "in_progress"}};
        part = {{"type", "reasoning_text"}, {"text", ""}};
        break;
      case Kind::kMessage:
        item = {{"id", id},
                {"type", "message"},
                {"status", "in_progress"},
                {"role", "assistant"},
                {"content", ojson::array()}};
        part = {{"type", "output_text"},
                {"text", ""},
                {"annotations", ojson::array()},
                {"logprobs", ojson::array()}};
        break;
      default: {
        const std::string call_id = run_.call_id(0, call->index);
        item = {{"id", id},           {"type", "function_call"}, {"status", "in_progress"},
                {"call_id", call_id}, {"name", call->name},      {"arguments", ""}};
        calls_.push_back({{"id", call_id},
                          {"type", "function"},
                          {"function", {{"name", call->name}, {"arguments", ""}}}});
      }
    }
    items_.push_back(item);
    emit(events, {{"type", "response.output_item.added"},
                  {"output_index", index()},
                  {"item", std::move(item)}});
    if (!part.is_null()) {
      emit(events, {{"type", "response.content_part.added"},
                    {"item_id", id},
                    {"output_index", index()},
                    {"content_index", 0},
                    {"part", std::move(part)}});
    }
  }

  void close(bool complete, std::vector<ojson>* events) {
    if (open_ == Kind::kNone) return;
    ojson& item = items_.back();
    const ojson id = item["id"];
    item["status"] = complete ? "completed" : "incomplete";
    ojson part;
    if (open_ == Kind::kReasoning) {
      part = {{"type", "reasoning_text"}, {"text", text_}};
      emit(events, {{"type", "response.reasoning_text.done"},
                    {"item_id", id},
                    {"output_index", index()},
                    {"content_index", 0},
                    {"text", text_}});
    } else if (open_ == Kind::kMessage) {
      part = {{"type", "output_text"},
              {"text", text_},
              {"annotations", ojson::array()},
              {"logprobs", ojson::array()}};
      emit(events, {{"type", "response.output_text.done"},
                    {"item_id", id},
                    {"output_index", index()},
                    {"content_index", 0},
                    {"text", text_},
                    {"logprobs", ojson::array()}});
    } else {
      item["arguments"] = text_;
      emit(events, {{"type", "response.function_call_arguments.done"},
                    {"item_id", id},
                    {"output_index", index()},
                    {"name", item["name"]},
                    {"arguments", text_}});
    }
    if (!part.is_null()) {
      item["content"] = ojson::array({part});
      emit(events, {{"type", "response.content_part.done"},
                    {"item_id", id},
                    {"output_index", index()},
                    {"content_index", 0},
                    {"part", std::move(part)}});
    }
    emit(events,
         {{"type", "response.output_item.done"}, {"output_index", index()}, {"item", item}});
    open_ = Kind::kNone;
    text_.clear();
  }

  const std::string hex_;
  const GenerationRun& run_;
  ojson items_ = ojson::array();
  Kind open_ = Kind::kNone;
  std::string text_;  // the open item's text (or arguments) so far
  std::string content_, reasoning_;
  ojson calls_ = ojson::array();  // chat tool calls, for the conversation
};

// The Response object. `status` "in_progress" (output so far) or the run's end.
ojson response_object(const GenerationRun& run, const Translated& t, const std::string& model,
                      const std::string& status, const ojson& output, bool with_usage) {
  ojson r = {{"id", run.id},     {"object", "response"}, {"created_at", run.created},
             {"status", status}, {"error", nullptr},     {"incomplete_details", nullptr},
             {"model", model},   {"output", output}};
  for (auto it = t.echo.begin(); it != t.echo.end(); ++it) r[it.key()] = it.value();
  if (status == "incomplete") r["incomplete_details"] = {{"reason", "max_output_tokens"}};
  if (run.error && status == "failed") {
    r["error"] = {{"code", "server_error"}, {"message", run.error->message}};
  }
  if (with_usage) {
    const RunUsage u = run.usage();
    r["usage"] = {
        {"input_tokens", u.prompt_tokens},
        {"input_tokens_details",
         {{"cached_tokens", u.cached_prompt_tokens}, {"cache_write_tokens", 0}}},
        {"output_tokens", u.completion_tokens},
        {"output_tokens_details", {{"reasoning_tokens", run.choices[0].out->reasoning_tokens()}}},
        {"total_tokens", u.prompt_tokens + u.completion_tokens}};
  } else {
    r["usage"] = nullptr;
  }
  return r;
}

// The run's end as a Response status.
std::string final_status(const GenerationRun& run) {
  if (run.error) return "failed";
  const std::string& finish = *run.choices[0].out->finish_reason();
  if (finish == "length") return "incomplete";
  if (finish == "abort") return "cancelled";
  return "completed";
}

void store_response(ResponsesApi::Store& store, const GenerationRun& run, const Translated& t,
                    const OutputBuilder& out, const ojson& response) {
  if (!t.store) return;
  ResponsesApi::Store::Entry e;
  e.response = dump_json(response);
  e.input_items = t.input_items;
  e.conversation = t.conversation;
  e.conversation.push_back(out.assistant_message());
  store.put(run.id, std::move(e));
}

// Response events as SSE: "event: <type>" and its data, each with a sequence_number.
class ResponseStream final : public ReplyStream {
 public:
  ResponseStream(std::shared_ptr<GenerationRun> run, Translated t, std::string model,
                 std::shared_ptr<ResponsesApi::Store> store)
      : run_(std::move(run)),
        t_(std::move(t)),
        model_(std::move(model)),
        store_(std::move(store)),
        out_(id_suffix(run_->id), *run_) {}

  bool next(std::string& out, std::chrono::milliseconds wait) override {
    if (complete_) return false;
    if (!started_) {
      started_ = true;
      const ojson r = response_object(*run_, t_, model_, "in_progress", ojson::array(), false);
      send(out, {{"type", "response.created"}, {"response", r}});
      send(out, {{"type", "response.in_progress"}, {"response", r}});
      return true;
    }
    std::vector<ojson> events;
    run_->pump(wait, [&](int, ChoiceDelta& d) { out_.add(d, &events); });
    if (!run_->done()) {
      for (ojson& e : events) send(out, std::move(e));
      return true;
    }
    const std::string status = final_status(*run_);
    out_.finish(status == "completed", &events);
    for (ojson& e : events) send(out, std::move(e));
    const ojson r = response_object(*run_, t_, model_, status, out_.items(), true);
    const char* type = status == "completed"    ? "response.completed"
                       : status == "incomplete" ? "response.incomplete"
                                                : "response.failed";
    if (status != "failed") store_response(*store_, *run_, t_, out_, r);
    send(out, {{"type", type}, {"response", r}});
    complete_ = true;
    return false;
  }

  void abandon() override { run_->abandon(); }

 private:
  void send(std::string& out, ojson e) {
    ojson event = {{"type", e["type"]}, {"sequence_number", seq_++}};
    for (auto it = e.begin(); it != e.end(); ++it) {
      if (it.key() != "type") event[it.key()] = std::move(it.value());
    }
    out += "event: ";
    out += event["type"].get<std::string>();
    out += "\ndata: ";
    out += dump_json(event);
    out += "\n\n";
  }

  std::shared_ptr<GenerationRun> run_;
  const Translated t_;
  const std::string model_;
  std::shared_ptr<ResponsesApi::Store> store_;
  OutputBuilder out_;
  int64_t seq_ = 0;
  bool started_ = false;
  bool complete_ = false;
};

}  // namespace

ResponsesApi::ResponsesApi(OpenAiService& service, ResponsesOptions options)
    : service_(service), store_(std::make_shared<Store>(options)) {}

ResponsesApi::~ResponsesApi() = default;

Reply ResponsesApi::create(std::string_view body) {
  ApiResult<Translated> t = translate(body, *store_);
  if (!t.ok()) return error_reply(t.error());
  ApiResult<ChatCompletionRequest> req = parse_chat_request(dump_json(t->chat), service_.limits());
  if (!req.ok()) return error_reply(req.error());
  const bool stream = req->gen.stream;
  ApiResult<std::shared_ptr<GenerationRun>> run = service_.start_chat(std::move(*req), "resp_");
  if (!run.ok()) return error_reply(run.error());
  if (stream) {
    Reply r;
    r.content_type = "text/event-stream";
    r.stream = std::make_shared<ResponseStream>(std::move(*run), std::move(*t),
                                                service_.served_model_name(), store_);
    return r;
  }
  GenerationRun& g = **run;
  OutputBuilder out(id_suffix(g.id), g);
  while (!g.done()) {
    g.pump(std::chrono::milliseconds(200), [&](int, ChoiceDelta& d) { out.add(d, nullptr); });
  }
  if (g.error) return error_reply(*g.error);
  const std::string status = final_status(g);
  out.finish(status == "completed", nullptr);
  const ojson r = response_object(g, *t, service_.served_model_name(), status, out.items(), true);
  store_response(*store_, g, *t, out, r);
  return json_reply(r);
}

Reply ResponsesApi::retrieve(std::string_view id) const {
  std::shared_ptr<const Store::Entry> e = store_->get(id);
  if (!e) return error_reply(not_found(id));
  Reply r;
  r.body = e->response;
  return r;
}

Reply ResponsesApi::input_items(std::string_view id) const {
  std::shared_ptr<const Store::Entry> e = store_->get(id);
  if (!e) return error_reply(not_found(id));
  ojson data = ojson::array();
  for (size_t i = 0; i < e->input_items.size(); ++i) {
    ojson item = e->input_items[i];
    if (!item.contains("type")) item["type"] = "message";
    if (!item.contains("id"))
      item["id"] = fmt::format("in_{}{:02x}", id_suffix(std::string(id)), i);
    data.push_back(std::move(item));
  }
  ojson list = {{"object", "list"}, {"data", data}, {"has_more", false}};
  list["first_id"] = data.empty() ? ojson(nullptr) : data.front()["id"];
  list["last_id"] = data.empty() ? ojson(nullptr) : data.back()["id"];
  return json_reply(list);
}

Reply ResponsesApi::remove(std::string_view id) {
  if (!store_->remove(id)) return error_reply(not_found(id));
  return json_reply({{"id", id}, {"object", "response"}, {"deleted", true}});
}

}  // namespace moeserve
