// `moeserve render-chat`: render chat messages (an OpenAI-style JSON file) with the checkpoint's
// chat template (DeepSeek-V3 or R1, recognised from tokenizer_config.json) and print the prompt
// text exactly as HF's apply_chat_template(tokenize=False) returns it (no newline added). A file
// {"messages": [...], "tools": [...]} also renders the tools' description, as the server does.
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "front_door.h"
#include "tokenizer/chat_messages_json.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::cli {
namespace {

struct RenderChatArgs {
  std::string dir;
  std::string messages_path;
  bool add_generation_prompt = false;
  bool thinking = false;
};

int run_render_chat(const RenderChatArgs& args) {
  auto tok = Tokenizer::load(args.dir);
  if (!tok.ok()) {
    fmt::print(stderr, "moeserve render-chat: {}\n", tok.status().message());
    return 1;
  }
  auto tmpl = chat_template_for(*tok, args.dir);  // (a V3.2 checkpoint: by its config.json)
  if (!tmpl.ok()) {
    fmt::print(stderr, "moeserve render-chat: {}: {}\n", args.dir, tmpl.status().message());
    return 1;
  }
  std::ifstream f(args.messages_path, std::ios::binary);
  if (!f) {
    fmt::print(stderr, "moeserve render-chat: {}: cannot open\n", args.messages_path);
    return 1;
  }
  std::ostringstream ss;
  ss << f.rdbuf();
  auto messages = parse_messages_json(ss.str());
  if (!messages.ok()) {
    fmt::print(stderr, "moeserve render-chat: {}: {}\n", args.messages_path,
               messages.status().message());
    return 1;
  }
  std::vector<ToolDefinition> tools;
  // Read in order: each tool is shown with its keys as the file has them.
  const auto file = nlohmann::ordered_json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (file.is_object() && file.contains("tools")) {
    auto parsed = parse_tools_json(file["tools"].dump());
    if (!parsed.ok()) {
      fmt::print(stderr, "moeserve render-chat: {}: {}\n", args.messages_path,
                 parsed.status().message());
      return 1;
    }
    tools = std::move(*parsed);
  }
  auto text = tmpl->render(*messages, args.add_generation_prompt, tools, args.thinking);
  if (!text.ok()) {
    fmt::print(stderr, "moeserve render-chat: {}: {}\n", args.messages_path,
               text.status().message());
    return 1;
  }
  std::fwrite(text->data(), 1, text->size(), stdout);
  return 0;
}

}  // namespace

Subcommand add_render_chat_command(CLI::App& parent) {
  auto args = std::make_shared<RenderChatArgs>();
  auto* app =
      parent.add_subcommand("render-chat", "Render chat messages with the model's chat template");
  app->add_option("--tokenizer", args->dir,
                  "directory with tokenizer.json and tokenizer_config.json")
      ->required();
  app->add_option("--messages", args->messages_path,
                  "JSON file: an array of messages (or {\"messages\": [...], \"tools\": [...]}), "
                  "OpenAI chat format")
      ->required();
  app->add_flag("--add-generation-prompt", args->add_generation_prompt,
                "end with the assistant prefix, ready for the model to answer");
  app->add_flag("--thinking", args->thinking,
                "DeepSeek-V3.1 and V3.2: the thinking mode (the template's `thinking`)");
  return {app, [args] { return run_render_chat(*args); }};
}

}  // namespace moeserve::cli
