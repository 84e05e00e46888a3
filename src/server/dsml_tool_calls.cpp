#include "server/dsml_tool_calls.h"

#include <nlohmann/json.hpp>

#include "server/text_scan.h"
#include "tokenizer/chat_messages_json.h"

namespace moeserve {

namespace {

constexpr std::string_view kInvoke = "<｜DSML｜invoke";
constexpr std::string_view kInvokeEnd = "</｜DSML｜invoke";
constexpr std::string_view kParam = "<｜DSML｜parameter";
constexpr std::string_view kParamEnd = "</｜DSML｜parameter";
constexpr std::string_view kHeaderEnd = "\">";

// The value of attribute `name` in a tag's header (` name="x" string="true"`): the text after
// `name="` up to the next `" ` or the header's end.
std::string_view attribute(std::string_view header, std::string_view name) {
  std::string key(1, ' ');
  key.append(name).append("=\"");
  size_t at = header.find(key);
  if (at == std::string_view::npos) return {};
  header.remove_prefix(at + key.size());
  return header.substr(0, std::min(header.find("\" "), header.size()));
}

// A string value's text as json.dumps escapes it (without the quotes).
std::string escaped(std::string_view text) {
  std::string out;
  python_dumps(nlohmann::ordered_json(std::string(text)), out);
  return out.substr(1, out.size() - 2);
}

}  // namespace

std::string_view dsml_block(ToolCallSyntax syntax) {
  return syntax == ToolCallSyntax::kDsmlV4 ? "tool_calls" : "function_calls";
}

DsmlParser::DsmlParser(std::optional<int64_t> max_calls, std::string_view block)
    : max_calls_(max_calls),
      block_("<｜DSML｜" + std::string(block)),
      block_after_content_("\n\n" + block_),
      block_end_("</｜DSML｜" + std::string(block) + ">") {}

void DsmlParser::open_call(std::string_view header, ToolCallParser::Parts& out) {
  std::string name(attribute(header, "name"));
  current_kept_ = !name.empty() && (!max_calls_ || opened_ < *max_calls_);
  call_open_ = current_kept_;
  first_param_ = true;
  if (!current_kept_) return;
  out.calls.push_back({opened_, true, "function", std::move(name), "{"});
  ++opened_;
}

void DsmlParser::add_arguments(std::string_view text, ToolCallParser::Parts& out) {
  if (current_kept_) append_call_arguments(out, opened_ - 1, text);
}

void DsmlParser::open_param(std::string_view header, ToolCallParser::Parts& out) {
  string_value_ = attribute(header, "string") == "true";
  std::string text = first_param_ ? "" : ", ";
  first_param_ = false;
  python_dumps(nlohmann::ordered_json(std::string(attribute(header, "name"))), text);
  text += string_value_ ? ": \"" : ": ";
  add_arguments(text, out);
}

void DsmlParser::add_value(std::string_view text, ToolCallParser::Parts& out) {
  if (text.empty()) return;
  add_arguments(string_value_ ? escaped(text) : std::string(text), out);
}

void DsmlParser::close_call(ToolCallParser::Parts& out) {
  if (call_open_) add_arguments("}", out);
  call_open_ = false;
}

ToolCallParser::Parts DsmlParser::push(std::string_view piece) {
  ToolCallParser::Parts out;
  held_.append(piece);
  std::string_view buf = held_;
  const std::string_view block = block_, block_after_content = block_after_content_,
                         block_end = block_end_;
  for (;;) {
    if (state_ == State::kContent) {
      const size_t at = buf.find(block);
      if (at == std::string_view::npos) {
        const size_t keep = partial_tail(buf, {block_after_content, block});
        out.content.append(buf.substr(0, buf.size() - keep));
        buf.remove_prefix(buf.size() - keep);
        break;
      }
      std::string_view content = buf.substr(0, at);
      if (content.ends_with("\n\n")) content.remove_suffix(2);
      out.content.append(content);
      buf.remove_prefix(at + block.size());
      state_ = State::kBetweenCalls;
    } else if (state_ == State::kBetweenCalls) {
      auto [at, which] = earliest(buf, {kInvoke, block_end});
      if (at == std::string_view::npos) {
        buf.remove_prefix(buf.size() - partial_tail(buf, {kInvoke, block_end}));
        break;
      }
      buf.remove_prefix(at + (which == 0 ? kInvoke.size() : block_end.size()));
      state_ = which == 0 ? State::kInvokeHeader : State::kContent;
    } else if (state_ == State::kInvokeHeader || state_ == State::kParamHeader) {
      const size_t at = buf.find(kHeaderEnd);
      if (at == std::string_view::npos) break;  // held whole until its end
      if (state_ == State::kInvokeHeader) {
        open_call(buf.substr(0, at), out);
        state_ = State::kParams;
      } else {
        open_param(buf.substr(0, at), out);
        state_ = State::kValue;
      }
      buf.remove_prefix(at + kHeaderEnd.size());
    } else if (state_ == State::kParams) {
      auto [at, which] = earliest(buf, {kParam, kInvokeEnd, block_end});
      if (at == std::string_view::npos) {
        buf.remove_prefix(buf.size() - partial_tail(buf, {kParam, kInvokeEnd, block_end}));
        break;
      }
      const std::array<size_t, 3> len = {kParam.size(), kInvokeEnd.size(), block_end.size()};
      buf.remove_prefix(at + len[which]);
      if (which != 0) close_call(out);
      state_ = which == 0   ? State::kParamHeader
               : which == 1 ? State::kBetweenCalls  // (its ">" is text between calls)
                            : State::kContent;
    } else {  // kValue
      const size_t at = buf.find(kParamEnd);
      if (at == std::string_view::npos) {
        const size_t keep = partial_tail(buf, {kParamEnd});
        add_value(buf.substr(0, buf.size() - keep), out);
        buf.remove_prefix(buf.size() - keep);
        break;
      }
      add_value(buf.substr(0, at), out);
      if (string_value_) add_arguments("\"", out);
      buf.remove_prefix(at + kParamEnd.size());
      state_ = State::kParams;  // (its ">" is text between parameters)
    }
  }
  held_.erase(0, size_t(buf.data() - held_.data()));
  return out;
}

ToolCallParser::Parts DsmlParser::finish() {
  ToolCallParser::Parts out;
  switch (state_) {
    case State::kContent:
      out.content = std::move(held_);
      break;
    case State::kInvokeHeader:
      open_call(held_, out);
      break;
    case State::kValue:
      add_value(held_, out);
      break;
    default:
      break;
  }
  held_.clear();
  state_ = State::kContent;
  return out;
}

}  // namespace moeserve
