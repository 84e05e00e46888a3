#include "server/api_request.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "server/api_json.h"
#include "tokenizer/chat_messages_json.h"

namespace moeserve {

using json = nlohmann::json;

namespace {

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    case json::value_t::number_float:
      return "a number";
    default:
      return "an integer";
  }
}

ApiError wrong_type(const std::string& param, const char* want, const json& got) {
  return bad_request(fmt::format("'{}' must be {}, not {}", param, want, type_name(got)), param);
}

// Reads the top-level fields of one request object. Each getter leaves `out` unchanged when the
// field is absent or null, and returns the error for a present field of the wrong type or range.
class Fields {
 public:
  explicit Fields(const json& j) : j_(j) {}

  const json* find(const char* key) const {
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }

  std::optional<ApiError> get_bool(const char* key, bool& out) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) return wrong_type(key, "a boolean", *v);
    out = v->get<bool>();
    return std::nullopt;
  }

  std::optional<ApiError> get_int(const char* key, int64_t lo, int64_t hi,
                                  std::optional<int64_t>& out) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    return to_int(*v, key, lo, hi, out);
  }

  static std::optional<ApiError> to_int(const json& v, const std::string& param, int64_t lo,
                                        int64_t hi, std::optional<int64_t>& out) {
    if (v.is_number_unsigned()) {
      uint64_t u = v.get<uint64_t>();
      if (u > uint64_t(hi) || (lo > 0 && u < uint64_t(lo))) {
        return out_of_range(param, lo, hi, v.dump());
      }
      out = int64_t(u);
      return std::nullopt;
    }
    if (v.is_number_integer()) {
      int64_t i = v.get<int64_t>();
      if (i < lo || i > hi) return out_of_range(param, lo, hi, v.dump());
      out = i;
      return std::nullopt;
    }
    if (v.is_number_float()) {  // 16.0 is an integer; 16.5, 1e400 are not
      double d = v.get<double>();
      if (!std::isfinite(d) || d != std::floor(d)) return wrong_type(param, "an integer", v);
      if (d < double(lo) || d > double(hi)) return out_of_range(param, lo, hi, v.dump());
      out = int64_t(d);
      return std::nullopt;
    }
    return wrong_type(param, "an integer", v);
  }

  std::optional<ApiError> get_float(const char* key, double lo, double hi, bool lo_open,
                                    float& out) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) return wrong_type(key, "a number", *v);
    double d = v->get<double>();
    if (!std::isfinite(d) || d > hi || d < lo || (lo_open && d == lo)) {
      return bad_request(fmt::format("'{}' must be in {}{}, {}] (got {})", key, lo_open ? "(" : "[",
                                     lo, hi, v->dump()),
                         key);
    }
    out = float(d);
    return std::nullopt;
  }

  static ApiError out_of_range(const std::string& param, int64_t lo, int64_t hi,
                               const std::string& got) {
    if (hi == std::numeric_limits<int64_t>::max()) {
      return bad_request(fmt::format("'{}' must be >= {} (got {})", param, lo, got), param);
    }
    return bad_request(fmt::format("'{}' must be in [{}, {}] (got {})", param, lo, hi, got), param);
  }

 private:
  const json& j_;
};

constexpr int64_t kMaxInt = std::numeric_limits<int64_t>::max();

// Deepest nesting of arrays and objects in a JSON text (strings skipped). The parser is
// iterative but dump() and the destructor of deeply nested values recurse, so a body of 100000
// '[' must be refused before it is parsed.
int64_t nesting_depth(std::string_view text) {
  int64_t depth = 0, max_depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      max_depth = std::max(max_depth, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return max_depth;
}

constexpr int64_t kMaxJsonDepth = 64;

ApiResult<json> parse_object(std::string_view body) {
  if (nesting_depth(body) > kMaxJsonDepth) {
    return bad_request(fmt::format("the request body nests deeper than {} levels", kMaxJsonDepth));
  }
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return bad_request("the request body is not valid JSON");
  if (!j.is_object()) return bad_request("the request body must be a JSON object");
  return j;
}

std::optional<ApiError> parse_model(const Fields& f, std::optional<std::string>& out) {
  const json* v = f.find("model");
  if (!v) return std::nullopt;
  if (!v->is_string()) return wrong_type("model", "a string", *v);
  out = v->get<std::string>();
  return std::nullopt;
}

std::optional<ApiError> parse_stop(const Fields& f, const RequestLimits& limits,
                                   std::vector<std::string>& out) {
  const json* v = f.find("stop");
  if (!v) return std::nullopt;
  if (v->is_string()) {
    out.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    for (const json& s : *v) {
      if (!s.is_string()) return wrong_type("stop", "a string or an array of strings", s);
      out.push_back(s.get<std::string>());
    }
  } else {
    return wrong_type("stop", "a string or an array of strings", *v);
  }
  if (int64_t(out.size()) > limits.max_stop_strings) {
    return bad_request(fmt::format("'stop' has {} strings; at most {} are allowed", out.size(),
                                   limits.max_stop_strings),
                       "stop");
  }
  for (const std::string& s : out) {
    if (s.empty()) return bad_request("'stop' strings must not be empty", "stop");
    if (int64_t(s.size()) > limits.max_stop_bytes) {
      return bad_request(fmt::format("'stop' strings must be at most {} bytes (got {})",
                                     limits.max_stop_bytes, s.size()),
                         "stop");
    }
  }
  return std::nullopt;
}

std::optional<ApiError> parse_token_ids(const json& v, const std::string& param, int64_t vocab_size,
                                        std::vector<int32_t>& out) {
  if (!v.is_array()) return wrong_type(param, "an array of token ids", v);
  out.reserve(v.size());
  for (const json& t : v) {
    std::optional<int64_t> id;
    if (auto e = Fields::to_int(t, param, 0, vocab_size - 1, id)) {
      e->message += fmt::format(" (token ids must be below the vocabulary size {})", vocab_size);
      return e;
    }
    out.push_back(int32_t(*id));
  }
  return std::nullopt;
}

// The logit adjustments: presence_penalty, frequency_penalty, repetition_penalty, min_p,
// logit_bias (GenerationOptions).
std::optional<ApiError> parse_adjustments(const Fields& f, const RequestLimits& limits,
                                          GenerationOptions& g) {
  RETURN_IF_API_ERROR(f.get_float("presence_penalty", -2.0, 2.0, false, g.presence_penalty));
  RETURN_IF_API_ERROR(f.get_float("frequency_penalty", -2.0, 2.0, false, g.frequency_penalty));
  RETURN_IF_API_ERROR(f.get_float("repetition_penalty", 0.0, 1e6, true, g.repetition_penalty));
  RETURN_IF_API_ERROR(f.get_float("min_p", 0.0, 1.0, false, g.min_p));
  const json* v = f.find("logit_bias");
  if (!v) return std::nullopt;
  if (!v->is_object()) return wrong_type("logit_bias", "an object", *v);
  for (const auto& [key, bias] : v->items()) {
    const std::string param = "logit_bias." + key;
    int64_t id = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (ec != std::errc() || end != key.data() + key.size() || id < 0 ||
        (limits.vocab_size > 0 && id >= limits.vocab_size)) {
      return bad_request(
          fmt::format("'logit_bias' keys must be token ids below the vocabulary size {} (got "
                      "'{}')",
                      limits.vocab_size, key),
          "logit_bias");
    }
    if (!bias.is_number()) return wrong_type(param, "a number", bias);
    const double b = bias.get<double>();
    if (!(b >= -100.0 && b <= 100.0)) {
      return bad_request(fmt::format("'{}' must be in [-100, 100] (got {})", param, bias.dump()),
                         "logit_bias");
    }
    g.logit_bias.emplace_back(int32_t(id), float(b));
  }
  std::sort(g.logit_bias.begin(), g.logit_bias.end());
  for (size_t i = 1; i < g.logit_bias.size(); ++i) {
    if (g.logit_bias[i].first == g.logit_bias[i - 1].first) {
      return bad_request(fmt::format("'logit_bias' names token {} twice", g.logit_bias[i].first),
                         "logit_bias");
    }
  }
  return std::nullopt;
}

// response_format (docs/structured-outputs.md): {"type": "text"}, {"type": "json_object"} or
// {"type": "json_schema", "json_schema": {"name", "description", "schema", "strict"}}. Whether
// the schema compiles is the handler's check (it needs the grammar backend).
std::optional<ApiError> parse_response_format(const Fields& f, std::optional<GrammarSpec>& out) {
  const json* v = f.find("response_format");
  if (!v) return std::nullopt;
  if (!v->is_object()) return wrong_type("response_format", "an object", *v);
  auto t = v->find("type");
  if (t == v->end() || t->is_null()) {
    return bad_request("'response_format.type' is required", "response_format.type");
  }
  if (!t->is_string()) return wrong_type("response_format.type", "a string", *t);
  const std::string type = t->get<std::string>();
  if (type == "text") return std::nullopt;
  if (type == "json_object") {
    out = GrammarSpec{GrammarSpec::Kind::kJsonObject, "", false, std::nullopt};
    return std::nullopt;
  }
  if (type != "json_schema") {
    return bad_request(
        fmt::format("'response_format.type' must be 'text', 'json_object' or 'json_schema', not "
                    "'{}'",
                    type),
        "response_format.type");
  }
  auto js = v->find("json_schema");
  if (js == v->end() || js->is_null()) {
    return bad_request("'response_format.json_schema' is required with type 'json_schema'",
                       "response_format.json_schema");
  }
  if (!js->is_object()) return wrong_type("response_format.json_schema", "an object", *js);
  if (auto name = js->find("name"); name != js->end() && !name->is_null()) {
    if (!name->is_string())
      return wrong_type("response_format.json_schema.name", "a string", *name);
    const std::string n = name->get<std::string>();
    const bool ok = !n.empty() && n.size() <= 64 && std::all_of(n.begin(), n.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
    });
    if (!ok) {
      return bad_request(
          "'response_format.json_schema.name' must be 1 to 64 of a-z, A-Z, 0-9, _ "
          "and -",
          "response_format.json_schema.name");
    }
  }
  GrammarSpec g{GrammarSpec::Kind::kJsonSchema, "", false, std::nullopt};
  if (auto s = js->find("strict"); s != js->end() && !s->is_null()) {
    if (!s->is_boolean()) return wrong_type("response_format.json_schema.strict", "a boolean", *s);
    g.strict = s->get<bool>();
  }
  auto schema = js->find("schema");
  if (schema == js->end() || schema->is_null()) {
    g.kind = GrammarSpec::Kind::kJsonObject;  // no schema: any JSON object
  } else if (schema->is_boolean()) {
    // JSON Schema's `true` admits anything (here: any object); `false` nothing at all.
    if (!schema->get<bool>()) {
      return bad_request("'response_format.json_schema.schema' false admits no output",
                         "response_format.json_schema.schema");
    }
    g.kind = GrammarSpec::Kind::kJsonObject;
  } else if (!schema->is_object()) {
    return wrong_type("response_format.json_schema.schema", "an object", *schema);
  } else {
    g.schema = schema->dump();
  }
  out = std::move(g);
  return std::nullopt;
}

std::optional<ApiError> parse_generation(const Fields& f, const RequestLimits& limits, bool chat,
                                         GenerationOptions& g) {
  RETURN_IF_API_ERROR(parse_adjustments(f, limits, g));
  std::optional<int64_t> v;
  RETURN_IF_API_ERROR(f.get_int("max_tokens", 1, kMaxInt, g.max_tokens));
  if (chat) RETURN_IF_API_ERROR(f.get_int("max_completion_tokens", 1, kMaxInt, g.max_tokens));
  RETURN_IF_API_ERROR(f.get_float("temperature", 0.0, 2.0, false, g.temperature));
  RETURN_IF_API_ERROR(f.get_float("top_p", 0.0, 1.0, true, g.top_p));
  v.reset();
  RETURN_IF_API_ERROR(f.get_int("top_k", -1, kMaxInt, v));
  if (v) g.top_k = *v < 0 ? 0 : *v;  // vLLM: -1 means all
  // OpenAI's seed is any 64-bit integer; the engine's generator takes its bits.
  if (const json* s = f.find("seed")) {
    if (s->is_number_unsigned()) {
      g.seed = s->get<uint64_t>();
    } else if (s->is_number_integer()) {
      g.seed = uint64_t(s->get<int64_t>());
    } else {
      v.reset();
      RETURN_IF_API_ERROR(
          Fields::to_int(*s, "seed", std::numeric_limits<int64_t>::min(), kMaxInt, v));
      g.seed = uint64_t(*v);
    }
  }
  RETURN_IF_API_ERROR(parse_stop(f, limits, g.stop));
  if (const json* ids = f.find("stop_token_ids")) {
    RETURN_IF_API_ERROR(
        parse_token_ids(*ids, "stop_token_ids", limits.vocab_size, g.stop_token_ids));
    if (int64_t(g.stop_token_ids.size()) > limits.max_stop_token_ids) {
      return bad_request(
          fmt::format("'stop_token_ids' has at most {} entries", limits.max_stop_token_ids),
          "stop_token_ids");
    }
  }
  v.reset();
  RETURN_IF_API_ERROR(f.get_int("n", 1, limits.max_n, v));
  if (v) g.n = *v;
  if (const json* b = f.find("best_of")) {
    v.reset();
    RETURN_IF_API_ERROR(Fields::to_int(*b, "best_of", 1, limits.max_n, v));
    if (*v != g.n) return bad_request("'best_of' must equal 'n' (no ranking is done)", "best_of");
  }
  if (chat) {
    RETURN_IF_API_ERROR(f.get_bool("logprobs", g.logprobs));
    v.reset();
    RETURN_IF_API_ERROR(f.get_int("top_logprobs", 0, limits.max_top_logprobs, v));
    if (v) {
      if (!g.logprobs && *v > 0) {
        return bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs");
      }
      g.top_logprobs = *v;
    }
  } else {
    // The legacy completions API: "logprobs": K asks for the K most likely tokens per position.
    v.reset();
    RETURN_IF_API_ERROR(f.get_int("logprobs", 0, limits.max_top_logprobs, v));
    if (v) {
      g.logprobs = true;
      g.top_logprobs = *v;
    }
  }
  RETURN_IF_API_ERROR(f.get_bool("stream", g.stream));
  if (const json* so = f.find("stream_options")) {
    if (!so->is_object()) return wrong_type("stream_options", "an object", *so);
    if (!g.stream) {
      return bad_request("'stream_options' is only allowed when 'stream' is true",
                         "stream_options");
    }
    if (auto iu = so->find("include_usage"); iu != so->end() && !iu->is_null()) {
      if (!iu->is_boolean()) {
        return wrong_type("stream_options.include_usage", "a boolean", *iu);
      }
      g.include_usage = iu->get<bool>();
    }
  }
  RETURN_IF_API_ERROR(f.get_bool("ignore_eos", g.ignore_eos));
  RETURN_IF_API_ERROR(parse_response_format(f, g.grammar));
  if (g.grammar && g.ignore_eos) {
    return bad_request(
        "'ignore_eos' cannot be used with a JSON 'response_format' (its output "
        "ends at EOS)",
        "ignore_eos");
  }
  return std::nullopt;
}

std::optional<ApiError> parse_messages(const json& j, std::vector<Message>& out) {
  auto it = j.find("messages");
  if (it == j.end() || it->is_null()) return bad_request("'messages' is required", "messages");
  if (!it->is_array()) return wrong_type("messages", "an array", *it);
  if (it->empty()) return bad_request("'messages' must not be empty", "messages");
  Result<std::vector<Message>> parsed = parse_messages_json(it->dump());
  if (!parsed.ok()) return bad_request(parsed.status().message(), "messages");
  out = std::move(*parsed);
  for (size_t i = 0; i < out.size(); ++i) {
    Message& m = out[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (m.role == "developer") m.role = "system";  // OpenAI's newer name for system prompts
    if (m.role == "assistant") {
      // Clients (LangChain, many agents) send "content": "" beside tool calls; the template
      // renders the calls only when content is null.
      if (m.tool_calls && !m.tool_calls->empty() && m.content && m.content->empty()) {
        m.content.reset();
      }
      if (!m.content && !m.tool_calls) {
        return bad_request(where + ": an assistant message needs 'content' or 'tool_calls'",
                           where + ".content");
      }
    } else if (m.role == "system" || m.role == "user" || m.role == "tool" ||
               m.role == "latest_reminder") {
      if (!m.content) {
        return bad_request(fmt::format("{}: a {} message needs 'content'", where, m.role),
                           where + ".content");
      }
      if (m.tool_calls) {
        return bad_request(where + ": only assistant messages may have 'tool_calls'",
                           where + ".tool_calls");
      }
    } else {
      return bad_request(fmt::format("{}: unknown role '{}' (expected system, user, assistant, "
                                     "tool or latest_reminder)",
                                     where, m.role),
                         where + ".role");
    }
  }
  return std::nullopt;
}

// Requests and results of tool calls in the conversation: what the template needs, with the
// API's names for the fields at fault (parse_messages_json checked the rest of the shape).
std::optional<ApiError> check_tool_messages(const json& messages) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    const std::string where = fmt::format("messages[{}]", i);
    const std::string role = m.value("role", "");
    if (role == "tool") {
      auto id = m.find("tool_call_id");
      if (id == m.end() || !id->is_string() || id->get_ref<const std::string&>().empty()) {
        return bad_request(where + ": a tool message needs a 'tool_call_id' (a non-empty string)",
                           where + ".tool_call_id");
      }
    }
    auto calls = m.find("tool_calls");
    if (role != "assistant" || calls == m.end() || !calls->is_array()) continue;
    for (size_t k = 0; k < calls->size(); ++k) {
      const json& c = (*calls)[k];
      const std::string cw = fmt::format("{}.tool_calls[{}]", where, k);
      auto type = c.find("type");
      if (type != c.end() && !(type->is_string() && type->get<std::string>() == "function")) {
        return bad_request(cw + ".type: only \"function\" tool calls are supported", cw + ".type");
      }
      auto fn = c.find("function");
      if (fn == c.end() || !fn->is_object()) continue;  // parse_messages_json reported it
      auto args = fn->find("arguments");
      if (args != fn->end() && !args->is_string() && !args->is_object()) {
        return wrong_type(cw + ".function.arguments", "a string of JSON", *args);
      }
    }
  }
  return std::nullopt;
}

// The most keys of one object in `tools`: keeping the client's key order costs time quadratic
// in an object's size (far above any real JSON Schema).
constexpr size_t kMaxToolObjectKeys = 256;

size_t widest_object(const json& v) {
  size_t widest = v.is_object() ? v.size() : 0;
  if (v.is_object() || v.is_array()) {
    for (const json& child : v) widest = std::max(widest, widest_object(child));
  }
  return widest;
}

bool valid_tool_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
  });
}

// tools, tool_choice, parallel_tool_calls. `body` is re-read with the keys in the client's
// order: the template shows each tool as the client wrote it.
std::optional<ApiError> parse_tools(const Fields& f, std::string_view body,
                                    ChatCompletionRequest& r) {
  RETURN_IF_API_ERROR(f.get_bool("parallel_tool_calls", r.parallel_tool_calls));
  if (const json* v = f.find("tools")) {
    if (!v->is_array()) return wrong_type("tools", "an array", *v);
    std::set<std::string> names;
    for (size_t i = 0; i < v->size(); ++i) {
      const json& t = (*v)[i];
      const std::string where = fmt::format("tools[{}]", i);
      if (!t.is_object()) return wrong_type(where, "an object", t);
      auto type = t.find("type");
      if (type == t.end() || !type->is_string() || type->get<std::string>() != "function") {
        return bad_request(where + ".type must be \"function\"", where + ".type");
      }
      auto fn = t.find("function");
      if (fn == t.end() || !fn->is_object()) {
        return bad_request(where + ".function is required (an object)", where + ".function");
      }
      auto name = fn->find("name");
      if (name == fn->end() || !name->is_string() || !valid_tool_name(name->get<std::string>())) {
        return bad_request(where + ".function.name must be 1 to 64 of a-z, A-Z, 0-9, _ and -",
                           where + ".function.name");
      }
      if (!names.insert(name->get<std::string>()).second) {
        return bad_request(
            fmt::format("{}: two tools are named '{}'", where, name->get<std::string>()),
            where + ".function.name");
      }
      if (auto d = fn->find("description"); d != fn->end() && !d->is_null() && !d->is_string()) {
        return wrong_type(where + ".function.description", "a string", *d);
      }
      if (auto p = fn->find("parameters"); p != fn->end() && !p->is_null() && !p->is_object()) {
        return wrong_type(where + ".function.parameters", "a JSON Schema object", *p);
      }
      if (auto s = fn->find("strict"); s != fn->end() && !s->is_null() && !s->is_boolean()) {
        return wrong_type(where + ".function.strict", "a boolean", *s);
      }
    }
    if (!v->empty()) {
      if (widest_object(*v) > kMaxToolObjectKeys) {
        return bad_request(
            fmt::format("an object in 'tools' has more than {} keys", kMaxToolObjectKeys), "tools");
      }
      // Only "tools" is kept: ordered_json inserts a key in time linear in the object's size.
      using ordered_json = nlohmann::ordered_json;
      const auto only_tools = [](int depth, ordered_json::parse_event_t event,
                                 ordered_json& parsed) {
        return depth != 1 || event != ordered_json::parse_event_t::key || parsed == "tools";
      };
      const auto ordered = ordered_json::parse(body, only_tools, /*allow_exceptions=*/false);
      Result<std::vector<ToolDefinition>> defs = parse_tools_json(ordered["tools"].dump());
      if (!defs.ok()) return bad_request(defs.status().message(), "tools");
      r.tools = std::move(*defs);
    }
  }
  const json* c = f.find("tool_choice");
  if (!c) return std::nullopt;
  using Mode = ToolChoice::Mode;
  if (c->is_string()) {
    const std::string s = c->get<std::string>();
    if (s == "auto") {
      r.tool_choice.mode = Mode::kAuto;
    } else if (s == "none") {
      r.tool_choice.mode = Mode::kNone;
    } else if (s == "required") {
      r.tool_choice.mode = Mode::kRequired;
    } else {
      return bad_request(fmt::format("'tool_choice' must be \"auto\", \"none\", \"required\" or "
                                     "{{\"type\": \"function\", \"function\": {{\"name\": ...}}}} "
                                     "(got \"{}\")",
                                     s),
                         "tool_choice");
    }
  } else if (c->is_object()) {
    auto type = c->find("type");
    auto fn = c->find("function");
    if (type == c->end() || *type != "function" || fn == c->end() || !fn->is_object() ||
        !fn->contains("name") || !(*fn)["name"].is_string()) {
      return bad_request(
          "'tool_choice' as an object must be {\"type\": \"function\", \"function\": {\"name\": "
          "...}}",
          "tool_choice");
    }
    r.tool_choice.mode = Mode::kFunction;
    r.tool_choice.function = (*fn)["name"].get<std::string>();
    const bool known = std::any_of(r.tools.begin(), r.tools.end(), [&](const ToolDefinition& t) {
      return t.name == r.tool_choice.function;
    });
    if (!known) {
      return bad_request(
          fmt::format("'tool_choice' names '{}', which is not in 'tools'", r.tool_choice.function),
          "tool_choice");
    }
  } else {
    return wrong_type("tool_choice", "a string or an object", *c);
  }
  if (r.tool_choice.mode == Mode::kRequired && r.tools.empty()) {
    return bad_request("'tool_choice' \"required\" needs 'tools'", "tool_choice");
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> check_request_body(std::string_view body, size_t max_keys) {
  ApiResult<json> j = parse_object(body);
  if (!j.ok()) return j.error();
  if (widest_object(*j) > max_keys) {
    return bad_request(fmt::format("an object in the request has more than {} keys", max_keys));
  }
  return std::nullopt;
}

ApiResult<ChatCompletionRequest> parse_chat_request(std::string_view body,
                                                    const RequestLimits& limits) {
  ApiResult<json> j = parse_object(body);
  if (!j.ok()) return j.error();
  Fields f(*j);
  ChatCompletionRequest r;
  RETURN_IF_API_ERROR(parse_model(f, r.model));
  RETURN_IF_API_ERROR(parse_messages(*j, r.messages));
  RETURN_IF_API_ERROR(check_tool_messages((*j)["messages"]));
  RETURN_IF_API_ERROR(parse_generation(f, limits, /*chat=*/true, r.gen));
  RETURN_IF_API_ERROR(parse_tools(f, body, r));
  // vLLM's and SGLang's chat_template_kwargs; the one the DeepSeek templates read is V3.1's
  // `thinking` switch (other keys are ignored).
  bool thinking_given = false;
  if (const json* k = f.find("chat_template_kwargs")) {
    if (!k->is_object()) return wrong_type("chat_template_kwargs", "an object", *k);
    if (auto t = k->find("thinking"); t != k->end() && !t->is_null()) {
      if (!t->is_boolean()) return wrong_type("chat_template_kwargs.thinking", "a boolean", *t);
      r.thinking = t->get<bool>();
      thinking_given = true;
    }
  }
  if (const json* e = f.find("reasoning_effort"); e && !e->is_null()) {
    if (!e->is_string()) return wrong_type("reasoning_effort", "a string", *e);
    const std::string& v = e->get_ref<const std::string&>();
    if (v != "none" && v != "minimal" && v != "low" && v != "medium" && v != "high" &&
        v != "xhigh" && v != "max") {
      return bad_request("reasoning_effort must be none, minimal, low, medium, high, xhigh or max",
                         "reasoning_effort");
    }
    r.reasoning_effort = v;
    if (!thinking_given) r.thinking = v != "none";
  }
  return r;
}

ApiResult<CompletionRequest> parse_completion_request(std::string_view body,
                                                      const RequestLimits& limits) {
  ApiResult<json> j = parse_object(body);
  if (!j.ok()) return j.error();
  Fields f(*j);
  CompletionRequest r;
  RETURN_IF_API_ERROR(parse_model(f, r.model));
  const json* p = f.find("prompt");
  if (!p) return bad_request("'prompt' is required", "prompt");
  // A list of one prompt is the same as the prompt; batches are not supported.
  if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) {
    p = &(*p)[0];
  } else if (p->is_array() && !p->empty() && ((*p)[0].is_string() || (*p)[0].is_array())) {
    return bad_request("batched prompts are not supported: send one prompt per request", "prompt");
  }
  if (p->is_string()) {
    r.prompt = p->get<std::string>();
  } else if (p->is_array()) {
    if (p->empty()) return bad_request("'prompt' must not be empty", "prompt");
    std::vector<int32_t> ids;
    RETURN_IF_API_ERROR(parse_token_ids(*p, "prompt", limits.vocab_size, ids));
    r.prompt = std::move(ids);
  } else {
    return wrong_type("prompt", "a string or an array of token ids", *p);
  }
  RETURN_IF_API_ERROR(f.get_bool("echo", r.echo));
  if (const json* s = f.find("suffix")) {  // (fill-in-the-middle: no DeepSeek chat model does it)
    if (!s->is_string()) return wrong_type("suffix", "a string", *s);
    if (!s->get<std::string>().empty()) return bad_request("'suffix' is not supported", "suffix");
  }
  r.gen.max_tokens = 16;  // the legacy API's default
  RETURN_IF_API_ERROR(parse_generation(f, limits, /*chat=*/false, r.gen));
  if (r.echo && r.gen.logprobs) {
    return bad_request(
        "'echo' with 'logprobs' is not supported: this server does not score prompt tokens",
        "echo");
  }
  return r;
}

}  // namespace moeserve
