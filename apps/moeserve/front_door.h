// The OpenAI front door's flags and set-up, shared by `serve` and `router`: one API, one set of
// flags (--tokenizer --served-model-name --host --port --api-key --http-threads
// --shutdown-timeout --max-n --max-logprobs --max-body-mb), one way to load the tokenizer and the
// chat template.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "server/http_server.h"
#include "server/openai_service.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::cli {

struct FrontDoorFlags {
  std::string tokenizer_dir;      // default: the model directory
  std::string served_model_name;  // default: the model directory's name
  std::string api_key;
  HttpServerOptions http;
  int64_t max_n = 8;
  int64_t max_top_logprobs = 20;
  double max_body_mb = 8;
  // DeepSeek-V3.2-Speciale: every request thinks, none may call tools (on by default for a
  // model directory whose name holds "Speciale").
  bool reasoning_only = false;
};

// The chat format of the model in model_dir: its tokenizer's template, or (DeepSeek-V3.2, whose
// checkpoints ship none) the family's encoder by config.json's model_type.
Result<ChatTemplate> chat_template_for(const Tokenizer& tok, const std::string& model_dir);

// Registers the flags on app (f must outlive the parse).
void add_front_door_flags(CLI::App& app, FrontDoorFlags& f);

struct FrontDoor {
  Tokenizer tokenizer;
  ChatTemplate chat_template;
  ServiceOptions service;
};

// The tokenizer (from --tokenizer or model_dir) and its chat template (the DeepSeek-V3 format,
// with a warning, when it has none this build knows), the service options, and f.http's API key
// and body limit. nullopt after printing "<command>: <why>" when the tokenizer cannot be loaded.
std::optional<FrontDoor> open_front_door(FrontDoorFlags& f, const std::string& model_dir,
                                         const char* command);

}  // namespace moeserve::cli
