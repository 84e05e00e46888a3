#include "server/tool_call_grammar.h"

#include <algorithm>
#include <string>

#include "server/api_json.h"

namespace moeserve {

namespace {

// The longest run of whitespace between JSON tokens, as for response_format's schemas
// (XGrammarOptions::max_whitespace): a model cannot stall a call in blanks.
constexpr int kMaxWhitespace = 16;

ojson const_string(const std::string& value) {
  return {{"type", "const_string"}, {"value", value}};
}

ojson sequence(ojson elements) {
  ojson out = ojson::array();
  for (ojson& e : elements) {  // (an empty literal is no element)
    if (e["type"] == "const_string" && e["value"] == "") continue;
    out.push_back(std::move(e));
  }
  return out.size() == 1 ? out[0] : ojson{{"type", "sequence"}, {"elements", std::move(out)}};
}

ojson one_of(ojson elements) {
  return elements.size() == 1 ? elements[0] : ojson{{"type", "or"}, {"elements", elements}};
}

// A tool's arguments: its parameters (a function without them takes any object), as JSON or as
// DSML parameters.
ojson arguments(const ToolDefinition& t, const ToolCallFormat& f) {
  ojson schema = ojson::parse(t.parameters, nullptr, /*allow_exceptions=*/false);
  if (schema.is_discarded() || !schema.is_object() || schema.empty()) {
    schema = {{"type", "object"}};
  }
  ojson j = {{"type", "json_schema"},
             {"json_schema", std::move(schema)},
             {"max_whitespace_cnt", kMaxWhitespace}};
  if (f.xml) j["style"] = "deepseek_xml";
  return j;
}

bool chosen(const ToolDefinition& t, std::optional<std::string_view> named) {
  return !named || t.name == *named;
}

// One whole call of each chosen tool, as alternatives.
ojson any_call(std::span<const ToolDefinition> tools, const ToolCallFormat& f,
               std::optional<std::string_view> named) {
  ojson calls = ojson::array();
  for (const ToolDefinition& t : tools) {
    if (!chosen(t, named)) continue;
    calls.push_back(
        sequence({const_string(f.call_begin(t.name)), arguments(t, f), const_string(f.call_end)}));
  }
  return one_of(std::move(calls));
}

GrammarSpec spec(ojson format) {
  ojson tag = {{"type", "structural_tag"}, {"format", std::move(format)}};
  return GrammarSpec{GrammarSpec::Kind::kStructuralTag, dump_json(tag), false, std::nullopt};
}

}  // namespace

int64_t thinking_budget(int64_t max_tokens) {
  return max_tokens - std::min<int64_t>(max_tokens / 2, 256);
}

GrammarSpec forced_call_grammar(std::span<const ToolDefinition> tools, const ToolCallFormat& f,
                                std::optional<std::string_view> named, bool parallel) {
  // The first call: what the prefill left of it (for `required`, the name and the syntax up to
  // the arguments), its arguments, its end.
  const std::string opened = tool_call_prefill(std::nullopt, f.syntax);
  ojson first = ojson::array();
  for (const ToolDefinition& t : tools) {
    if (!chosen(t, named)) continue;
    const std::string rest =
        named ? std::string() : tool_call_prefill(t.name, f.syntax).substr(opened.size());
    first.push_back(sequence({const_string(rest), arguments(t, f)}));
  }
  ojson elements = {one_of(std::move(first)), const_string(f.call_end)};
  if (parallel && !named) {
    elements.push_back(
        {{"type", "star"},
         {"content", sequence({const_string(f.separator), any_call(tools, f, named)})}});
  }
  elements.push_back(const_string(f.calls_end));
  return spec(sequence(std::move(elements)));
}

GrammarSpec triggered_call_grammar(std::span<const ToolDefinition> tools, const ToolCallFormat& f,
                                   std::optional<std::string_view> named, bool parallel,
                                   bool at_least_one,
                                   const std::optional<ThinkingBudget>& thinking) {
  ojson calls = ojson::array();
  for (const ToolDefinition& t : tools) {
    if (!chosen(t, named)) continue;
    calls.push_back({{"type", "tag"},
                     {"begin", f.call_begin(t.name)},
                     {"content", arguments(t, f)},
                     {"end", f.call_end}});
  }
  // The block opens at the trigger (DSML's "\n\n" before it is free text).
  const std::string block_begin = f.calls_begin.substr(f.calls_begin.find(f.trigger));
  ojson block = {{"type", "tag"},
                 {"begin", block_begin},
                 {"content",
                  {{"type", "tags_with_separator"},
                   {"tags", std::move(calls)},
                   {"separator", f.separator},
                   {"at_least_one", true},
                   {"stop_after_first", !parallel}}},
                 {"end", f.calls_end}};
  ojson calls_format = {{"type", "triggered_tags"},
                        {"triggers", ojson::array({f.trigger})},
                        {"tags", ojson::array({std::move(block)})},
                        {"at_least_one", at_least_one},
                        {"stop_after_first", true}};
  if (!thinking) return spec(std::move(calls_format));
  ojson text = {{"type", "any_text"}};
  if (thinking->max_tokens) text["max_tokens"] = *thinking->max_tokens;
  ojson think = {{"type", "tag"}, {"begin", ""}, {"content", std::move(text)}, {"end", "</think>"}};
  return spec(sequence({std::move(think), std::move(calls_format)}));
}

}  // namespace moeserve
