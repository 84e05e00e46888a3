#include "server/openai_service.h"

#include <algorithm>
#include <ctime>
#include <functional>
#include <optional>

#include <fmt/format.h>
#include <xxhash.h>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "server/choice_output.h"
#include "server/generation_job.h"
#include "server/generation_run.h"
#include "server/tool_call_grammar.h"
#include "tokenizer/utf8.h"

namespace moeserve {

using json = nlohmann::json;
using Clock = GenerationRun::Clock;

namespace {

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

namespace {

// One token's entry in the chat API's logprobs.content.
json token_logprob_json(const Tokenizer& tok, int32_t id, float logprob) {
  std::string_view raw = tok.token_bytes(id).value_or(std::string_view());
  json bytes = json::array();
  for (char c : raw) bytes.push_back(int(uint8_t(c)));
  return {{"token", utf8::lossy(raw)}, {"logprob", logprob}, {"bytes", std::move(bytes)}};
}

json chat_logprobs(const Tokenizer& tok, const std::vector<GeneratedToken>& tokens) {
  json content = json::array();
  for (const GeneratedToken& t : tokens) {
    json e = token_logprob_json(tok, t.id, t.logprob);
    json top = json::array();
    for (const TokenLogprob& alt : t.top)
      top.push_back(token_logprob_json(tok, alt.id, alt.logprob));
    e["top_logprobs"] = std::move(top);
    content.push_back(std::move(e));
  }
  return {{"content", std::move(content)}};
}

// The legacy completions API's logprobs object; `offset` is the text offset of the first token.
json completion_logprobs(const Tokenizer& tok, const std::vector<GeneratedToken>& tokens,
                         int64_t& offset) {
  json texts = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  for (const GeneratedToken& t : tokens) {
    std::string text = utf8::lossy(tok.token_bytes(t.id).value_or(std::string_view()));
    offsets.push_back(offset);
    offset += int64_t(text.size());
    texts.push_back(std::move(text));
    lps.push_back(t.logprob);
    json top = json::object();
    for (const TokenLogprob& alt : t.top) {
      top[utf8::lossy(tok.token_bytes(alt.id).value_or(std::string_view()))] = alt.logprob;
    }
    tops.push_back(std::move(top));
  }
  return {{"tokens", std::move(texts)},
          {"token_logprobs", std::move(lps)},
          {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offsets)}};
}

// The usage object of chat and completions replies.
json usage_json(const RunUsage& u, bool speculative) {
  json j = {{"prompt_tokens", u.prompt_tokens},
            {"completion_tokens", u.completion_tokens},
            {"total_tokens", u.prompt_tokens + u.completion_tokens},
            {"prompt_tokens_details", {{"cached_tokens", u.cached_prompt_tokens}}},
            // DeepSeek's API names for the same split (its pricing: hits are cheaper).
            {"prompt_cache_hit_tokens", u.cached_prompt_tokens},
            {"prompt_cache_miss_tokens", u.prompt_tokens - u.cached_prompt_tokens}};
  if (speculative) {  // an extension: MTP drafts verified and accepted
    j["speculative"] = {
        {"draft_tokens", u.draft_tokens},
        {"accepted_draft_tokens", u.accepted_draft_tokens},
        {"acceptance_rate",
         u.draft_tokens > 0 ? double(u.accepted_draft_tokens) / double(u.draft_tokens) : 0.0}};
  }
  return j;
}

// An SSE reply: chat.completion.chunk or text_completion events, then "data: [DONE]".
class CompletionStream final : public ReplyStream {
 public:
  CompletionStream(std::shared_ptr<GenerationRun> run, std::string model)
      : run_(std::move(run)), model_(std::move(model)), text_offsets_(run_->choices.size(), 0) {}

  bool next(std::string& out, std::chrono::milliseconds wait) override {
    if (complete_) return false;
    const PreparedRequest& p = run_->p;
    const size_t from = out.size();  // this call's events start here
    if (!started_) {
      started_ = true;
      if (!p.echo.empty() && !p.resume_after) {  // completions with echo: the prompt first
        for (size_t i = 0; i < run_->choices.size(); ++i) {
          append_event(out, choice_chunk(int(i), p.echo, nullptr, nullptr), 0);
        }
        return true;
      }
    }
    run_->pump(wait, [&](int i, ChoiceDelta& d) { append_delta(out, i, d); });
    // The role chunks go out with the first tokens (or the end), not before the prefill: clients
    // that take the first chunk as the first token (vLLM's `bench serve`) then time the prefill,
    // as they do against vLLM's own server, which sends them with its first output too.
    if (!opened_ && (out.size() > from || run_->error || run_->done())) open(out, from);
    if (run_->error) {
      append_data(out, run_->error->to_json());
    } else if (!run_->done()) {
      return true;
    } else if (p.gen.include_usage) {
      json last = base();
      last["choices"] = json::array();
      last["usage"] = usage_json(run_->usage(), run_->ctx.speculative);
      const int64_t id = run_->event_id() + 1;
      if (!p.resume_after || id > *p.resume_after) append_event(out, last, id);
    }
    out += "data: [DONE]\n\n";
    complete_ = true;
    return false;
  }

  void abandon() override { run_->abandon(); }

 private:
  json base() const {
    return {{"id", run_->id},
            {"object", run_->p.chat ? "chat.completion.chunk" : "text_completion"},
            {"created", run_->created},
            {"model", model_}};
  }

  json choice_chunk(int i, json delta, json logprobs, json finish) const {
    json c = {
        {"index", i}, {"logprobs", std::move(logprobs)}, {"finish_reason", std::move(finish)}};
    if (run_->p.chat) {
      c["delta"] = std::move(delta);
    } else {
      c["text"] = std::move(delta);
    }
    json chunk = base();
    chunk["choices"] = json::array({std::move(c)});
    if (run_->p.gen.include_usage) chunk["usage"] = nullptr;
    return chunk;
  }

  // OpenAI opens each choice of a chat stream with the assistant role (a resumed stream has
  // had them). Put before this call's events, which start at out[from].
  void open(std::string& out, size_t from) {
    opened_ = true;
    const PreparedRequest& p = run_->p;
    if (!p.chat || p.resume_after) return;
    std::string roles;
    for (size_t i = 0; i < run_->choices.size(); ++i) {
      json delta = {{"role", "assistant"}, {"content", ""}};
      if (p.reasoning.split) delta["reasoning_content"] = "";
      append_event(roles, choice_chunk(int(i), std::move(delta), nullptr, nullptr), 0);
    }
    out.insert(from, roles);
  }

  void append_delta(std::string& out, int i, ChoiceDelta& d) {
    const PreparedRequest& p = run_->p;
    // (A resumed stream leaves out what the client has: the events up to its Last-Event-ID.)
    const int64_t id = run_->event_id();
    if (p.resume_after && id <= *p.resume_after) return;
    bool has_logprobs = p.gen.logprobs && !d.tokens.empty();
    if (d.content.empty() && d.reasoning.empty() && d.tool_calls.empty() && !has_logprobs &&
        !d.finish_reason) {
      return;
    }
    const Tokenizer& tok = run_->ctx.tokenizer;
    json logprobs = nullptr;
    if (has_logprobs) {
      logprobs = p.chat ? chat_logprobs(tok, d.tokens)
                        : completion_logprobs(tok, d.tokens, text_offsets_[size_t(i)]);
    }
    json delta;
    if (p.chat) {
      delta = json::object();
      if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
      // A logprobs-only chunk still carries "content": "" ; a bare finish chunk has delta {}.
      if (!d.content.empty() || (d.reasoning.empty() && d.tool_calls.empty() && !d.finish_reason)) {
        delta["content"] = d.content;
      }
      if (!d.tool_calls.empty()) delta["tool_calls"] = tool_call_deltas(i, d.tool_calls);
    } else {
      delta = d.content;
    }
    json finish = d.finish_reason ? json(*d.finish_reason) : json(nullptr);
    append_event(out, choice_chunk(i, std::move(delta), std::move(logprobs), std::move(finish)),
                 id);
  }

  // OpenAI's stream form: a call's first delta has its id, type and name (and the arguments so
  // far, "" if none); later ones only argument fragments.
  json tool_call_deltas(int choice, const std::vector<ToolCallDelta>& calls) const {
    json out = json::array();
    for (const ToolCallDelta& c : calls) {
      json e = {{"index", c.index}};
      if (c.opens) {
        e["id"] = run_->call_id(choice, c.index);
        e["type"] = c.type;
        e["function"] = {{"name", c.name}, {"arguments", c.arguments}};
      } else {
        e["function"] = {{"arguments", c.arguments}};
      }
      out.push_back(std::move(e));
    }
    return out;
  }

  static void append_data(std::string& out, const std::string& data) {
    out += "data: ";
    out += data;
    out += "\n\n";
  }
  // An event with its id (GenerationRun::event_id) for Last-Event-ID, when the request is keyed.
  void append_event(std::string& out, const json& j, int64_t id) const {
    if (run_->p.event_ids) {
      out += "id: ";
      out += std::to_string(id);
      out += "\n";
    }
    append_data(out, dump(j));
  }

  std::shared_ptr<GenerationRun> run_;
  const std::string model_;
  std::vector<int64_t> text_offsets_;
  bool started_ = false;
  bool opened_ = false;  // the role chunks are out (open())
  bool complete_ = false;
};

// A key's id and seed: the same on every router (xxHash's XXH3, which the KV cache's block
// hashes use too).
uint64_t key_hash(std::string_view s) {
  return XXH3_64bits(s.data(), s.size());
}

}  // namespace

OpenAiService::OpenAiService(Engine& engine, Tokenizer tokenizer, ChatTemplate chat_template,
                             ServiceOptions options, ServerMetrics& metrics)
    : engine_(engine),
      tokenizer_(std::move(tokenizer)),
      template_(std::move(chat_template)),
      options_(std::move(options)),
      metrics_(metrics),
      created_(std::time(nullptr)),
      id_rng_(std::random_device{}()) {
  options_.limits.vocab_size = engine_.vocab_size();
  options_.limits.max_context = engine_.max_context();
}

OpenAiService::~OpenAiService() = default;

std::string OpenAiService::new_id(std::string_view prefix) {
  std::lock_guard<std::mutex> lock(mu_);
  return fmt::format("{}{:016x}", prefix, id_rng_());
}

void OpenAiService::track(const std::shared_ptr<GenerationJob>& job) {
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(jobs_, [](const std::weak_ptr<GenerationJob>& w) { return w.expired(); });
  jobs_.push_back(job);
}

void OpenAiService::cancel_all() {
  std::vector<std::shared_ptr<GenerationJob>> live;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& w : jobs_) {
      if (auto j = w.lock()) live.push_back(std::move(j));
    }
  }
  for (const auto& j : live) j->cancel_all();
}

int64_t OpenAiService::in_flight() const {
  return in_flight_.load();
}

namespace {
std::optional<ApiError> check_model(const std::optional<std::string>& model,
                                    const std::string& served) {
  if (!model || *model == served) return std::nullopt;
  ApiError e;
  e.http_status = 404;
  e.message =
      fmt::format("The model '{}' does not exist; this server serves '{}'.", *model, served);
  e.param = "model";
  e.code = "model_not_found";
  return e;
}
}  // namespace

Reply OpenAiService::chat_completions(std::string_view body, const RequestContext& ctx) {
  ApiResult<ChatCompletionRequest> req = parse_chat_request(body, options_.limits);
  if (!req.ok()) return error_reply(req.error());
  ApiResult<std::shared_ptr<GenerationRun>> run = start_chat(std::move(*req), "chatcmpl-", ctx);
  if (!run.ok()) return error_reply(run.error());
  return reply(std::move(*run));
}

ApiResult<PreparedRequest> OpenAiService::prepare_chat(ChatCompletionRequest& req) const {
  if (auto e = check_model(req.model, options_.served_model_name)) return *e;
  // tool_choice "none": the tools are neither described nor parsed (the model is not told of
  // them). "required" / a named function: the prompt opens the call (see docs/server.md).
  const bool use_tools = !req.tools.empty() && req.tool_choice.mode != ToolChoice::Mode::kNone;
  if (options_.reasoning_only) {
    if (use_tools) {
      return bad_request(
          "this model reasons only and does not call tools: send no 'tools' (or 'tool_choice': "
          "'none')",
          "tools");
    }
    req.thinking = true;
  }
  if (use_tools && req.gen.grammar) {  // (the grammar would keep the model from calling them)
    return bad_request(
        "a JSON 'response_format' cannot be combined with 'tools' (unless 'tool_choice' is "
        "'none')",
        "response_format");
  }
  // DeepSeek-V4's prompt has a latest_reminder role and a "max" reasoning effort (its encoder
  // takes high or max; DeepSeek's API maps low and medium to high); other templates have neither.
  const bool v4 = template_.variant() == ChatTemplate::Variant::kDeepSeekV4;
  for (size_t i = 0; i < req.messages.size() && !v4; ++i) {
    if (req.messages[i].role == "latest_reminder") {
      return bad_request(fmt::format("messages[{}]: the latest_reminder role is DeepSeek-V4's; "
                                     "this model's chat template has no such turn",
                                     i),
                         fmt::format("messages[{}].role", i));
    }
  }
  std::string_view effort;
  if (v4 && req.reasoning_effort && *req.reasoning_effort != "none" &&
      *req.reasoning_effort != "minimal") {
    effort = *req.reasoning_effort == "max" || *req.reasoning_effort == "xhigh" ? "max" : "high";
  }
  Result<std::string> text = template_.render(
      req.messages, /*add_generation_prompt=*/true,
      use_tools ? std::span<const ToolDefinition>(req.tools) : std::span<const ToolDefinition>(),
      req.thinking, effort);
  if (!text.ok()) return bad_request(text.status().message(), "messages");
  PreparedRequest p;
  p.chat = true;
  p.tools.parse = use_tools;
  switch (template_.variant()) {
    case ChatTemplate::Variant::kDeepSeekV3_1:
      p.tools.syntax = ToolCallSyntax::kV3_1;
      break;
    case ChatTemplate::Variant::kDeepSeekV3_2:
      p.tools.syntax = ToolCallSyntax::kDsml;
      break;
    case ChatTemplate::Variant::kDeepSeekV4:
      p.tools.syntax = ToolCallSyntax::kDsmlV4;
      break;
    default:
      p.tools.syntax = ToolCallSyntax::kV3;
  }
  if (!req.parallel_tool_calls) p.tools.max_calls = 1;
  using Mode = ToolChoice::Mode;
  const bool forced =
      req.tool_choice.mode == Mode::kRequired || req.tool_choice.mode == Mode::kFunction;
  std::optional<std::string_view> named;
  if (req.tool_choice.mode == Mode::kFunction) named = req.tool_choice.function;
  // A forced call opens in the prompt, except where the prompt opens <think>: the model reasons
  // first, and its call comes after (R1, V3.1 and V3.2 thinking).
  const bool reasons_first = template_.generation_opens_think(req.thinking);
  if (use_tools && forced && !reasons_first) {
    p.tools.prefill = tool_call_prefill(named, p.tools.syntax);
    *text += p.tools.prefill;
  }
  // The calls constrained (docs/server.md, Tool calls): a forced call's name from `tools` (the
  // named one) and arguments that meet its parameters; with `auto`, the calls the model opens
  // once a function is `strict`. (An output that ignores EOS has no end for the grammar.)
  const bool strict = std::any_of(req.tools.begin(), req.tools.end(),
                                  [](const ToolDefinition& t) { return t.strict; });
  if (use_tools && options_.grammar && !req.gen.ignore_eos && (forced || strict)) {
    const ToolCallFormat f = tool_call_format(p.tools.syntax);
    if (forced && !reasons_first) {
      req.gen.grammar = forced_call_grammar(req.tools, f, named, req.parallel_tool_calls);
    } else {
      // Where the prompt opens <think>, the grammar takes the thinking in, and ends it in time
      // for a call or an answer (thinking_budget).
      std::optional<ThinkingBudget> thinking;
      if (reasons_first) {
        thinking.emplace();
        if (req.gen.max_tokens) thinking->max_tokens = thinking_budget(*req.gen.max_tokens);
      }
      req.gen.grammar = triggered_call_grammar(req.tools, f, named,
                                               req.parallel_tool_calls && !named, forced, thinking);
    }
    if (Status st = options_.grammar->check(*req.gen.grammar); !st.ok()) {
      return bad_request("the tools' parameters cannot constrain their calls: " + st.message(),
                         "tools");
    }
  }
  p.prompt = tokenizer_.encode(*text, /*add_bos=*/false);  // the template writes BOS itself
  p.gen = std::move(req.gen);
  p.reasoning.split = options_.split_reasoning && template_.reasons(req.thinking);
  p.reasoning.starts_in_reasoning =
      p.reasoning.split && template_.generation_opens_think(req.thinking);
  return p;
}

ApiResult<std::shared_ptr<GenerationRun>> OpenAiService::start_chat(ChatCompletionRequest req,
                                                                    std::string_view id_prefix,
                                                                    const RequestContext& ctx) {
  ApiResult<PreparedRequest> p = prepare_chat(req);
  if (!p.ok()) return p.error();
  return start(std::move(*p), id_prefix, ctx);
}

ApiResult<int64_t> OpenAiService::count_chat_tokens(ChatCompletionRequest req) const {
  ApiResult<PreparedRequest> p = prepare_chat(req);
  if (!p.ok()) return p.error();
  return int64_t(p->prompt.size());
}

Reply OpenAiService::completions(std::string_view body, const RequestContext& ctx) {
  ApiResult<CompletionRequest> req = parse_completion_request(body, options_.limits);
  if (!req.ok()) return error_reply(req.error());
  if (auto e = check_model(req->model, options_.served_model_name)) return error_reply(*e);
  PreparedRequest p;
  p.chat = false;
  if (const auto* text = std::get_if<std::string>(&req->prompt)) {
    p.prompt = tokenizer_.encode(*text, tokenizer_.default_add_bos());
  } else {
    p.prompt = std::get<std::vector<int32_t>>(req->prompt);
  }
  p.gen = std::move(req->gen);
  if (req->echo) {
    const auto* text = std::get_if<std::string>(&req->prompt);
    p.echo = text ? *text : tokenizer_.decode(p.prompt, /*skip_special=*/false);
  }
  ApiResult<std::shared_ptr<GenerationRun>> run = start(std::move(p), "cmpl-", ctx);
  if (!run.ok()) return error_reply(run.error());
  return reply(std::move(*run));
}

ApiResult<std::shared_ptr<GenerationRun>> OpenAiService::start(PreparedRequest p,
                                                               std::string_view id_prefix,
                                                               const RequestContext& ctx) {
  const Clock::time_point t0 = Clock::now();
  if (ctx.last_event_id) {
    if (!ctx.idempotency_key) {
      return bad_request(
          "Last-Event-ID resumes a stream: send the Idempotency-Key it was sent with",
          "Last-Event-ID");
    }
    if (!p.gen.stream) return bad_request("Last-Event-ID resumes a stream: set 'stream'", "stream");
    if (p.gen.n != 1) return bad_request("a stream of n > 1 choices cannot be resumed", "n");
    p.resume_after = ctx.last_event_id;
  }
  // The same key, the same completion (docs/fault-tolerance.md): the id and the seed follow
  // from it.
  if (ctx.idempotency_key && !p.gen.seed) p.gen.seed = key_hash(*ctx.idempotency_key + "/seed");
  p.event_ids = ctx.idempotency_key.has_value();
  const int64_t n_prompt = int64_t(p.prompt.size());
  const int64_t context = options_.limits.max_context;
  if (n_prompt == 0) return bad_request("the prompt is empty", "prompt");
  const char* prompt_param = p.chat ? "messages" : "prompt";
  if (n_prompt >= context) {
    return bad_request(
        fmt::format("the prompt is {} tokens; the model's context is {} tokens", n_prompt, context),
        prompt_param);
  }
  const char* max_param = p.chat ? "max_completion_tokens" : "max_tokens";
  if (!p.gen.max_tokens) {
    p.gen.max_tokens = context - n_prompt;
  } else if (n_prompt + *p.gen.max_tokens > context) {
    return bad_request(
        fmt::format("the prompt ({} tokens) plus max_tokens ({}) exceeds the model's context of {} "
                    "tokens",
                    n_prompt, *p.gen.max_tokens, context),
        max_param);
  }
  EngineRequest er;
  er.prompt = p.prompt;
  er.max_tokens = *p.gen.max_tokens;
  er.sampling.temperature = p.gen.temperature;
  er.sampling.top_p = p.gen.top_p;
  er.sampling.top_k = p.gen.top_k;
  er.sampling.min_p = p.gen.min_p;
  er.sampling.presence_penalty = p.gen.presence_penalty;
  er.sampling.frequency_penalty = p.gen.frequency_penalty;
  er.sampling.repetition_penalty = p.gen.repetition_penalty;
  er.sampling.logit_bias = p.gen.logit_bias;
  er.seed = p.gen.seed;
  if (ctx.idempotency_key) {
    er.idempotency_key = *ctx.idempotency_key;
    er.attach_first = ctx.last_event_id.has_value() || !p.gen.stream;
  }
  er.ignore_eos = p.gen.ignore_eos;
  er.stop_token_ids = p.gen.stop_token_ids;
  er.logprobs = p.gen.logprobs;  // without them the engine skips a log-softmax per token
  er.top_logprobs = p.gen.logprobs ? p.gen.top_logprobs : 0;
  if (p.gen.grammar) {
    if (!options_.grammar) {
      return bad_request("this server cannot constrain output to JSON", "response_format");
    }
    // A reasoning model writes its thoughts first; the JSON is the answer after </think>. (A
    // tool-call grammar was placed after the thinking by prepare_chat.)
    if (p.reasoning.starts_in_reasoning &&
        p.gen.grammar->kind != GrammarSpec::Kind::kStructuralTag) {
      std::optional<int32_t> end_think = tokenizer_.token_to_id("</think>");
      if (!end_think) {
        return bad_request(
            "the prompt opens reasoning, and the tokenizer has no </think> token to end it",
            "response_format");
      }
      p.gen.grammar->start_after = *end_think;
    }
    if (Status st = options_.grammar->check(*p.gen.grammar); !st.ok()) {
      return bad_request(st.message(), "response_format");
    }
    er.grammar = p.gen.grammar;
  }

  const std::string id = ctx.idempotency_key
                             ? fmt::format("{}{:016x}", id_prefix, key_hash(*ctx.idempotency_key))
                             : new_id(id_prefix);
  auto job = std::make_shared<GenerationJob>(engine_);
  ++in_flight_;  // from here on the run's destructor gives it back
  // (Engine ids are unique among live requests; a key's id may be sent again while it runs.)
  Status s = job->submit(ctx.idempotency_key ? new_id(id + ".") : id, er, int(p.gen.n));
  if (!s.ok()) {
    --in_flight_;
    return error_from_status(s);
  }
  track(job);
  const RunContext run_ctx{engine_, tokenizer_, metrics_, options_.speculative, in_flight_};
  return std::make_shared<GenerationRun>(run_ctx, std::move(p), id, std::move(job), t0);
}

Reply OpenAiService::reply(std::shared_ptr<GenerationRun> run) {
  if (!run->p.gen.stream) return finish_blocking(*run);
  Reply r;
  r.content_type = "text/event-stream";
  r.stream = std::make_shared<CompletionStream>(std::move(run), options_.served_model_name);
  return r;
}

Reply OpenAiService::finish_blocking(GenerationRun& run) {
  std::vector<ChoiceText> acc = run.collect();
  if (run.error) return error_reply(*run.error);
  const PreparedRequest& p = run.p;
  const bool logprobs = p.gen.logprobs;
  json choices = json::array();
  for (size_t i = 0; i < acc.size(); ++i) {
    json c = {{"index", i}, {"finish_reason", *run.choices[i].out->finish_reason()}};
    if (p.chat) {
      json msg = {{"role", "assistant"}, {"content", acc[i].content}};
      if (p.reasoning.split) msg["reasoning_content"] = acc[i].reasoning;
      if (!acc[i].calls.empty()) {
        if (acc[i].content.empty()) msg["content"] = nullptr;  // OpenAI: only tool calls
        json calls = json::array();
        for (size_t k = 0; k < acc[i].calls.size(); ++k) {
          const ParsedToolCall& c = acc[i].calls[k];
          calls.push_back({{"id", run.call_id(int(i), int64_t(k))},
                           {"type", c.type},
                           {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
        }
        msg["tool_calls"] = std::move(calls);
      }
      c["message"] = std::move(msg);
      c["logprobs"] = logprobs ? chat_logprobs(tokenizer_, acc[i].tokens) : json(nullptr);
    } else {
      c["text"] = p.echo + acc[i].content;
      int64_t offset = 0;
      c["logprobs"] =
          logprobs ? completion_logprobs(tokenizer_, acc[i].tokens, offset) : json(nullptr);
    }
    choices.push_back(std::move(c));
  }
  json body = {{"id", run.id},
               {"object", p.chat ? "chat.completion" : "text_completion"},
               {"created", run.created},
               {"model", options_.served_model_name},
               {"choices", std::move(choices)},
               {"usage", usage_json(run.usage(), options_.speculative)}};
  Reply r;
  r.body = dump(body);
  return r;
}

Reply OpenAiService::models() const {
  json model = {{"id", options_.served_model_name},
                {"object", "model"},
                {"created", created_},
                {"owned_by", "moeserve"},
                {"max_model_len", options_.limits.max_context}};
  Reply r;
  r.body = dump({{"object", "list"}, {"data", json::array({model})}});
  return r;
}

}  // namespace moeserve
