#include "server/tool_call_parser.h"

#include <algorithm>
#include <array>
#include <utility>

#include "server/dsml_tool_calls.h"
#include "server/text_scan.h"

namespace moeserve {

namespace {

constexpr std::string_view kCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kSep = "<｜tool▁sep｜>";
constexpr std::string_view kArgsOpen = "```json\n";
constexpr std::string_view kArgsClose = "\n```";
constexpr std::string_view kFencedCallEnd = "\n```<｜tool▁call▁end｜>";
constexpr std::string_view kFencedCallsEnd = "\n```<｜tool▁calls▁end｜>";

std::string_view trim(std::string_view s) {
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

// A call's header: TYPE<｜tool▁sep｜>NAME, or NAME alone (always, for V3.1, whose header ends
// at the separator).
std::pair<std::string, std::string> split_header(std::string_view header) {
  const size_t sep = header.find(kSep);
  if (sep == std::string_view::npos) return {"function", std::string(trim(header))};
  std::string_view type = trim(header.substr(0, sep));
  return {type.empty() ? "function" : std::string(type),
          std::string(trim(header.substr(sep + kSep.size())))};
}

std::string_view strip_close(std::string_view args) {
  if (args.ends_with(kArgsClose)) args.remove_suffix(kArgsClose.size());
  return args;
}

}  // namespace

ToolCallFormat tool_call_format(ToolCallSyntax syntax) {
  ToolCallFormat f;
  f.syntax = syntax;
  switch (syntax) {
    case ToolCallSyntax::kDsml:
    case ToolCallSyntax::kDsmlV4: {
      const std::string block(dsml_block(syntax));
      f.calls_begin = "\n\n<｜DSML｜" + block + ">\n";
      f.trigger = "<｜DSML｜" + block + ">";
      f.call_end = "</｜DSML｜invoke>\n";  // (its "\n" separates the next call)
      f.calls_end = "</｜DSML｜" + block + ">";
      f.xml = true;
      break;
    }
    case ToolCallSyntax::kV3_1:
      f.calls_begin = f.trigger = std::string(kCallsBegin);
      f.call_end = std::string(kCallEnd);
      f.calls_end = std::string(kCallsEnd);
      break;
    case ToolCallSyntax::kV3:
      f.calls_begin = f.trigger = std::string(kCallsBegin);
      f.call_end = std::string(kFencedCallEnd);
      f.separator = "\n";
      f.calls_end = std::string(kCallsEnd);
      break;
  }
  return f;
}

std::string ToolCallFormat::call_begin(std::string_view name) const {
  switch (syntax) {
    case ToolCallSyntax::kDsml:
    case ToolCallSyntax::kDsmlV4:
      return "<｜DSML｜invoke name=\"" + std::string(name) + "\">\n";
    case ToolCallSyntax::kV3_1:
      return std::string(kCallBegin) + std::string(name) + std::string(kSep);
    case ToolCallSyntax::kV3:
      break;
  }
  return std::string(kCallBegin) + "function" + std::string(kSep) + std::string(name) + "\n" +
         std::string(kArgsOpen);
}

std::string tool_call_prefill(std::optional<std::string_view> name, ToolCallSyntax syntax) {
  if (syntax == ToolCallSyntax::kDsml || syntax == ToolCallSyntax::kDsmlV4) {
    std::string s =
        "\n\n<｜DSML｜" + std::string(dsml_block(syntax)) + ">\n<｜DSML｜invoke name=\"";
    if (name) s += std::string(*name) + "\">\n";
    return s;
  }
  std::string s = std::string(kCallsBegin) + std::string(kCallBegin);
  if (syntax == ToolCallSyntax::kV3_1) {
    if (name) s += std::string(*name) + std::string(kSep);
    return s;
  }
  s += "function" + std::string(kSep);
  if (name) s += std::string(*name) + "\n" + std::string(kArgsOpen);
  return s;
}

ParsedToolCalls parse_tool_calls(std::string_view text, std::optional<int64_t> max_calls,
                                 ToolCallSyntax syntax) {
  // DSML: no second implementation, the streaming one.
  if (syntax == ToolCallSyntax::kDsml || syntax == ToolCallSyntax::kDsmlV4) {
    ToolCallParser parser(max_calls, syntax);
    ParsedToolCalls out;
    for (ToolCallParser::Parts p : {parser.push(text), parser.finish()}) {
      out.content += p.content;
      for (ToolCallDelta& d : p.calls) {
        if (d.opens) out.calls.push_back({std::move(d.type), std::move(d.name), ""});
        out.calls.back().arguments += d.arguments;
      }
    }
    return out;
  }
  const std::string_view header_end = syntax == ToolCallSyntax::kV3 ? "\n" : kSep;
  ParsedToolCalls out;
  const auto add = [&](std::string_view header, std::string_view args) {
    auto [type, name] = split_header(header);
    if (name.empty() || (max_calls && int64_t(out.calls.size()) >= *max_calls)) return;
    out.calls.push_back({std::move(type), std::move(name), std::string(args)});
  };
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t begin = text.find(kCallsBegin, pos);
    if (begin == std::string_view::npos) {
      out.content.append(text.substr(pos));
      break;
    }
    out.content.append(text.substr(pos, begin - pos));
    pos = begin + kCallsBegin.size();
    // Inside a block: calls until <｜tool▁calls▁end｜>.
    bool block_open = true;
    while (block_open) {
      auto [at, which] = earliest(text.substr(pos), {kCallBegin, kCallsEnd});
      if (at == std::string_view::npos) return out;
      pos += at + (which == 0 ? kCallBegin.size() : kCallsEnd.size());
      if (which == 1) break;
      auto [h, hw] = earliest(text.substr(pos), {header_end, kCallEnd, kCallsEnd});
      if (h == std::string_view::npos) {
        add(text.substr(pos), "");
        return out;
      }
      std::string_view header = text.substr(pos, h);
      pos += h;
      if (hw != 0) {  // the call ended without arguments
        add(header, "");
        pos += hw == 1 ? kCallEnd.size() : kCallsEnd.size();
        block_open = hw == 1;
        continue;
      }
      pos += header_end.size();
      if (text.substr(pos).starts_with(kArgsOpen)) pos += kArgsOpen.size();
      auto [e, ew] = earliest(text.substr(pos), {kCallEnd, kCallsEnd});
      if (e == std::string_view::npos) {
        add(header, text.substr(pos));
        return out;
      }
      add(header, strip_close(text.substr(pos, e)));
      pos += e + (ew == 0 ? kCallEnd.size() : kCallsEnd.size());
      block_open = ew == 0;
    }
  }
  return out;
}

ToolCallParser::ToolCallParser(std::optional<int64_t> max_calls, ToolCallSyntax syntax)
    : max_calls_(max_calls), header_end_(syntax == ToolCallSyntax::kV3 ? "\n" : kSep) {
  if (syntax == ToolCallSyntax::kDsml || syntax == ToolCallSyntax::kDsmlV4) {
    dsml_ = std::make_unique<DsmlParser>(max_calls, dsml_block(syntax));
  }
}

ToolCallParser::~ToolCallParser() = default;
ToolCallParser::ToolCallParser(ToolCallParser&&) noexcept = default;
ToolCallParser& ToolCallParser::operator=(ToolCallParser&&) noexcept = default;

int64_t ToolCallParser::calls() const {
  return dsml_ ? dsml_->calls() : opened_;
}

void ToolCallParser::open_call(std::string_view header, Parts& out) {
  auto [type, name] = split_header(header);
  current_kept_ = !name.empty() && (!max_calls_ || opened_ < *max_calls_);
  if (!current_kept_) return;
  out.calls.push_back({opened_, true, std::move(type), std::move(name), ""});
  ++opened_;
}

void append_call_arguments(ToolCallParser::Parts& out, int64_t index, std::string_view text) {
  if (text.empty()) return;
  if (!out.calls.empty() && out.calls.back().index == index) {
    out.calls.back().arguments.append(text);
  } else {
    out.calls.push_back({index, false, "", "", std::string(text)});
  }
}

void ToolCallParser::add_arguments(std::string_view text, Parts& out) {
  if (current_kept_) append_call_arguments(out, opened_ - 1, text);
}

ToolCallParser::Parts ToolCallParser::push(std::string_view piece) {
  if (dsml_) return dsml_->push(piece);
  Parts out;
  held_.append(piece);
  std::string_view buf = held_;
  for (;;) {
    if (state_ == State::kContent) {
      const size_t at = buf.find(kCallsBegin);
      if (at == std::string_view::npos) {
        const size_t keep = partial_tail(buf, {kCallsBegin});
        out.content.append(buf.substr(0, buf.size() - keep));
        buf.remove_prefix(buf.size() - keep);
        break;
      }
      out.content.append(buf.substr(0, at));
      buf.remove_prefix(at + kCallsBegin.size());
      state_ = State::kBetweenCalls;
    } else if (state_ == State::kBetweenCalls) {
      auto [at, which] = earliest(buf, {kCallBegin, kCallsEnd});
      if (at == std::string_view::npos) {
        buf.remove_prefix(buf.size() - partial_tail(buf, {kCallBegin, kCallsEnd}));
        break;
      }
      buf.remove_prefix(at + (which == 0 ? kCallBegin.size() : kCallsEnd.size()));
      state_ = which == 0 ? State::kHeader : State::kContent;
      header_scanned_ = 0;
    } else if (state_ == State::kHeader) {
      // The header is held whole until its end: search only what the last push did not.
      auto [at, which] = earliest(buf.substr(header_scanned_), {header_end_, kCallEnd, kCallsEnd});
      if (at == std::string_view::npos) {  // the name is not complete yet
        header_scanned_ = buf.size() - std::min(buf.size(), kCallsEnd.size() - 1);
        break;
      }
      at += header_scanned_;
      open_call(buf.substr(0, at), out);
      const std::array<size_t, 3> len = {header_end_.size(), kCallEnd.size(), kCallsEnd.size()};
      buf.remove_prefix(at + len[which]);
      state_ = which == 0 ? State::kArgsStart : which == 1 ? State::kBetweenCalls : State::kContent;
    } else if (state_ == State::kArgsStart) {
      if (buf.size() < kArgsOpen.size() && kArgsOpen.starts_with(buf)) break;  // undecided
      if (buf.starts_with(kArgsOpen)) buf.remove_prefix(kArgsOpen.size());
      state_ = State::kArgs;
    } else {  // kArgs
      auto [at, which] = earliest(buf, {kCallEnd, kCallsEnd});
      if (at == std::string_view::npos) {
        const size_t keep =
            partial_tail(buf, {kFencedCallEnd, kFencedCallsEnd, kCallEnd, kCallsEnd});
        add_arguments(buf.substr(0, buf.size() - keep), out);
        buf.remove_prefix(buf.size() - keep);
        break;
      }
      add_arguments(strip_close(buf.substr(0, at)), out);
      buf.remove_prefix(at + (which == 0 ? kCallEnd.size() : kCallsEnd.size()));
      state_ = which == 0 ? State::kBetweenCalls : State::kContent;
    }
  }
  held_.erase(0, size_t(buf.data() - held_.data()));  // no copy while a header grows
  return out;
}

ToolCallParser::Parts ToolCallParser::finish() {
  if (dsml_) return dsml_->finish();
  Parts out;
  switch (state_) {
    case State::kContent:
      out.content = std::move(held_);
      break;
    case State::kBetweenCalls:
      break;
    case State::kHeader:
      open_call(held_, out);
      break;
    case State::kArgsStart:
    case State::kArgs:
      add_arguments(held_, out);
      break;
  }
  held_.clear();
  state_ = State::kContent;
  return out;
}

}  // namespace moeserve
