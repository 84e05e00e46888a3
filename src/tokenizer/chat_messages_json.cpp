#include "tokenizer/chat_messages_json.h"

#include <nlohmann/json.hpp>

namespace moeserve {

using json = nlohmann::json;

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
  return m;
}

}  // namespace

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
