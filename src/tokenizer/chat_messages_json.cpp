#include "tokenizer/chat_messages_json.h"

#include <nlohmann/json.hpp>

namespace moeserve {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

// Python's json.dumps(v, ensure_ascii=False) (what Hugging Face's `tojson` filter calls).
void python_dumps(const ordered_json& v, std::string& out) {
  if (v.is_object()) {
    out += '{';
    bool first = true;
    for (const auto& [key, value] : v.items()) {
      if (!first) out += ", ";
      first = false;
      python_dumps(ordered_json(key), out);
      out += ": ";
      python_dumps(value, out);
    }
    out += '}';
  } else if (v.is_array()) {
    out += '[';
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) out += ", ";
      python_dumps(v[i], out);
    }
    out += ']';
  } else if (v.is_string()) {
    out += '"';
    for (char c : v.get_ref<const std::string&>()) {
      switch (c) {
        case '"':
          out += "\\\"";
          break;
        case '\\':
          out += "\\\\";
          break;
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        case '\b':
          out += "\\b";
          break;
        case '\f':
          out += "\\f";
          break;
        default:
          if (uint8_t(c) < 0x20) {
            static const char* const kHex = "0123456789abcdef";
            out += "\\u00";
            out += kHex[uint8_t(c) >> 4];
            out += kHex[uint8_t(c) & 15];
          } else {
            out += c;
          }
      }
    }
    out += '"';
  } else {  // numbers, booleans, null: the same text in both
    out += v.dump();
  }
}

namespace {

Result<Message> parse_message(const json& j, size_t i) {
  const std::string where = "messages[" + std::to_string(i) + "]";
  if (!j.is_object()) return InvalidArgument(where + ": not an object");
  Message m;
  auto role = j.find("role");
  if (role == j.end() || !role->is_string())
    return InvalidArgument(where + ": missing string 'role'");
  m.role = role->get<std::string>();
  if (auto c = j.find("content"); c != j.end() && !c->is_null()) {
    if (c->is_string()) {
      m.content = c->get<std::string>();
    } else if (c->is_array()) {
      std::string text;
      for (const json& part : *c) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part["text"].is_string()) {
          return InvalidArgument(where + ".content: only text parts are supported");
        }
        text += part["text"].get<std::string>();
      }
      m.content = std::move(text);
    } else {
      return InvalidArgument(where + ".content: must be a string, an array of text parts or null");
    }
  }
  if (auto tc = j.find("tool_calls"); tc != j.end() && !tc->is_null()) {
    if (!tc->is_array()) return InvalidArgument(where + ".tool_calls: not an array");
    m.tool_calls.emplace();
    for (size_t k = 0; k < tc->size(); ++k) {
      const json& c = (*tc)[k];
      const std::string cw = where + ".tool_calls[" + std::to_string(k) + "]";
      if (!c.is_object()) return InvalidArgument(cw + ": not an object");
      ToolCall call;
      if (auto id = c.find("id"); id != c.end() && id->is_string()) {
        call.id = id->get<std::string>();
      }
      if (auto t = c.find("type"); t != c.end()) {
        if (!t->is_string()) return InvalidArgument(cw + ".type: not a string");
        call.type = t->get<std::string>();
      }
      auto f = c.find("function");
      if (f == c.end() || !f->is_object())
        return InvalidArgument(cw + ": missing object 'function'");
      auto name = f->find("name");
      if (name == f->end() || !name->is_string()) {
        return InvalidArgument(cw + ".function: missing string 'name'");
      }
      call.name = name->get<std::string>();
      auto args = f->find("arguments");
      if (args == f->end()) return InvalidArgument(cw + ".function: missing 'arguments'");
      call.arguments = args->is_string() ? args->get<std::string>() : args->dump();
      m.tool_calls->push_back(std::move(call));
    }
  }
  if (auto id = j.find("tool_call_id"); id != j.end() && id->is_string()) {
    m.tool_call_id = id->get<std::string>();
  }
  if (auto r = j.find("reasoning_content"); r != j.end() && !r->is_null()) {
    if (!r->is_string()) return InvalidArgument(where + ".reasoning_content: not a string");
    m.reasoning_content = r->get<std::string>();
  }
  if (auto t = j.find("task"); t != j.end() && !t->is_null()) {
    if (!t->is_string()) return InvalidArgument(where + ".task: not a string");
    m.task = t->get<std::string>();
  }
  return m;
}

}  // namespace

Result<std::vector<ToolDefinition>> parse_tools_json(std::string_view json_text) {
  ordered_json j = ordered_json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_array()) return InvalidArgument("tools: expected an array");
  std::vector<ToolDefinition> out;
  for (size_t i = 0; i < j.size(); ++i) {
    const ordered_json& t = j[i];
    const std::string where = "tools[" + std::to_string(i) + "]";
    if (!t.is_object() || !t.contains("function") || !t["function"].is_object() ||
        !t["function"].contains("name") || !t["function"]["name"].is_string()) {
      return InvalidArgument(where +
                             ": expected {\"type\": \"function\", \"function\": "
                             "{\"name\": ...}}");
    }
    ToolDefinition d;
    const ordered_json& f = t["function"];
    d.name = f["name"].get<std::string>();
    python_dumps(t, d.json);
    python_dumps(f, d.function_json);
    if (auto it = f.find("description"); it != f.end() && it->is_string()) {
      d.description = it->get<std::string>();
    }
    if (auto it = f.find("strict"); it != f.end() && it->is_boolean()) d.strict = it->get<bool>();
    if (auto it = f.find("parameters"); it != f.end() && !it->is_null()) {
      d.parameters.clear();
      python_dumps(*it, d.parameters);
    }
    out.push_back(std::move(d));
  }
  return out;
}

Result<std::vector<Message>> parse_messages_json(std::string_view json_text) {
  json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument("messages: not valid JSON");
  if (j.is_object() && j.contains("messages")) j = j["messages"];
  if (!j.is_array()) return InvalidArgument("messages: expected an array of messages");
  std::vector<Message> out;
  out.reserve(j.size());
  for (size_t i = 0; i < j.size(); ++i) {
    ASSIGN_OR_RETURN(Message m, parse_message(j[i], i));
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace moeserve
