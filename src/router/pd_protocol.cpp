#include "router/pd_protocol.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace moeserve {

using nlohmann::json;

namespace {

// Field access that turns every type or presence error into one message.
template <typename T>
bool get(const json& j, const char* key, T* out, std::string* err, bool required = true) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) *err = fmt::format("missing field '{}'", key);
    return !required;
  }
  try {
    *out = it->get<T>();
    return true;
  } catch (const json::exception&) {
    *err = fmt::format("field '{}' has the wrong type", key);
    return false;
  }
}

Status bad(std::string_view what, const std::string& err) {
  return InvalidArgument(fmt::format("{}: {}", what, err));
}

std::string_view reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
    case FinishReason::kHandedOff:
      return "handed_off";
  }
  return "error";
}

bool parse_reason(std::string_view s, FinishReason* r) {
  for (FinishReason x : {FinishReason::kLength, FinishReason::kStop, FinishReason::kCancelled,
                         FinishReason::kError, FinishReason::kHandedOff}) {
    if (reason_name(x) == s) {
      *r = x;
      return true;
    }
  }
  return false;
}

}  // namespace

std::string_view to_string(UnitRole r) {
  switch (r) {
    case UnitRole::kPrefill:
      return "prefill";
    case UnitRole::kDecode:
      return "decode";
    case UnitRole::kBoth:
      return "both";
  }
  return "both";
}

Result<UnitRole> parse_unit_role(std::string_view s) {
  for (UnitRole r : {UnitRole::kPrefill, UnitRole::kDecode, UnitRole::kBoth}) {
    if (to_string(r) == s) return r;
  }
  return InvalidArgument(fmt::format("unknown unit role '{}' (prefill, decode or both)", s));
}

Result<json> parse_json(std::string_view body, std::string_view what) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgument(fmt::format("{}: the body is not a JSON object", what));
  }
  return j;
}

json to_json(const UnitInfo& u) {
  return {{"name", u.name},
          {"url", u.url},
          {"role", to_string(u.role)},
          {"transfer", u.transfer},
          {"fingerprint", fmt::format("{:016x}", u.fingerprint)},
          {"ranks", u.ranks},
          {"kv_blocks_total", u.kv_blocks_total}};
}

Result<UnitInfo> unit_info_from_json(const json& j) {
  UnitInfo u;
  std::string err, role, fp;
  if (!get(j, "name", &u.name, &err) || !get(j, "url", &u.url, &err) ||
      !get(j, "role", &role, &err) || !get(j, "transfer", &u.transfer, &err, false) ||
      !get(j, "fingerprint", &fp, &err) || !get(j, "ranks", &u.ranks, &err, false) ||
      !get(j, "kv_blocks_total", &u.kv_blocks_total, &err, false)) {
    return bad("unit registration", err);
  }
  auto r = parse_unit_role(role);
  if (!r.ok()) return bad("unit registration", r.status().message());
  u.role = *r;
  char* end = nullptr;
  u.fingerprint = std::strtoull(fp.c_str(), &end, 16);
  if (fp.empty() || *end != '\0') return bad("unit registration", "fingerprint is not hex");
  if (u.name.empty() || u.url.empty()) return bad("unit registration", "empty name or url");
  if (u.ranks < 1) return bad("unit registration", "ranks must be >= 1");
  if (u.role != UnitRole::kDecode && u.transfer.empty()) {
    return bad("unit registration", "a prefill unit needs its KV transfer address");
  }
  return u;
}

json to_json(const UnitLoad& l) {
  return {{"name", l.name},
          {"running", l.running},
          {"waiting", l.waiting},
          {"kv_blocks_used", l.kv_blocks_used},
          {"kv_blocks_total", l.kv_blocks_total},
          {"leases", l.leases},
          {"draining", l.draining}};
}

Result<UnitLoad> unit_load_from_json(const json& j) {
  UnitLoad l;
  std::string err;
  if (!get(j, "name", &l.name, &err) || !get(j, "running", &l.running, &err) ||
      !get(j, "waiting", &l.waiting, &err) || !get(j, "kv_blocks_used", &l.kv_blocks_used, &err) ||
      !get(j, "kv_blocks_total", &l.kv_blocks_total, &err) ||
      !get(j, "leases", &l.leases, &err, false) || !get(j, "draining", &l.draining, &err, false)) {
    return bad("unit heartbeat", err);
  }
  return l;
}

json to_json(const PdRequest& p) {
  const EngineRequest& r = p.request;
  json j = {{"id", r.id},
            {"prompt", r.prompt},
            {"max_tokens", r.max_tokens},
            {"temperature", r.sampling.temperature},
            {"top_p", r.sampling.top_p},
            {"top_k", r.sampling.top_k},
            {"ignore_eos", r.ignore_eos},
            {"stop_token_ids", r.stop_token_ids},
            {"logprobs", r.logprobs},
            {"top_logprobs", r.top_logprobs}};
  if (r.seed) j["seed"] = *r.seed;
  // The logit adjustments, when the request has any (a unit of an older build never sees them).
  const SamplingParams& sp = r.sampling;
  if (sp.min_p != 0.0f) j["min_p"] = sp.min_p;
  if (sp.presence_penalty != 0.0f) j["presence_penalty"] = sp.presence_penalty;
  if (sp.frequency_penalty != 0.0f) j["frequency_penalty"] = sp.frequency_penalty;
  if (sp.repetition_penalty != 1.0f) j["repetition_penalty"] = sp.repetition_penalty;
  if (!sp.logit_bias.empty()) j["logit_bias"] = sp.logit_bias;  // [[id, bias], ...]
  if (r.grammar) {
    const GrammarSpec::Kind k = r.grammar->kind;
    json g = {{"kind", k == GrammarSpec::Kind::kJsonSchema      ? "json_schema"
                       : k == GrammarSpec::Kind::kStructuralTag ? "structural_tag"
                                                                : "json_object"},
              {"strict", r.grammar->strict}};
    if (k != GrammarSpec::Kind::kJsonObject) g["schema"] = r.grammar->schema;
    if (r.grammar->start_after) g["start_after"] = *r.grammar->start_after;
    j["grammar"] = std::move(g);
  }
  if (!p.transfer.empty()) j["transfer"] = p.transfer;
  if (!p.handle.empty()) j["handle"] = p.handle;
  if (!r.resume_generated.empty()) j["generated"] = r.resume_generated;
  if (!r.idempotency_key.empty()) j["idempotency_key"] = r.idempotency_key;
  if (p.before) j["before"] = to_json(*p.before);
  return j;
}

Result<PdRequest> pd_request_from_json(const json& j) {
  PdRequest p;
  EngineRequest& r = p.request;
  std::string err;
  uint64_t seed = 0;
  bool has_seed = j.contains("seed") && !j["seed"].is_null();
  if (!get(j, "id", &r.id, &err) || !get(j, "prompt", &r.prompt, &err) ||
      !get(j, "max_tokens", &r.max_tokens, &err) ||
      !get(j, "temperature", &r.sampling.temperature, &err) ||
      !get(j, "top_p", &r.sampling.top_p, &err) || !get(j, "top_k", &r.sampling.top_k, &err) ||
      !get(j, "ignore_eos", &r.ignore_eos, &err) ||
      !get(j, "stop_token_ids", &r.stop_token_ids, &err) ||
      !get(j, "logprobs", &r.logprobs, &err) || !get(j, "top_logprobs", &r.top_logprobs, &err) ||
      (has_seed && !get(j, "seed", &seed, &err)) || !get(j, "transfer", &p.transfer, &err, false) ||
      !get(j, "handle", &p.handle, &err, false) ||
      !get(j, "generated", &r.resume_generated, &err, false) ||
      !get(j, "min_p", &r.sampling.min_p, &err, false) ||
      !get(j, "presence_penalty", &r.sampling.presence_penalty, &err, false) ||
      !get(j, "frequency_penalty", &r.sampling.frequency_penalty, &err, false) ||
      !get(j, "repetition_penalty", &r.sampling.repetition_penalty, &err, false) ||
      !get(j, "logit_bias", &r.sampling.logit_bias, &err, false) ||
      !get(j, "idempotency_key", &r.idempotency_key, &err, false)) {
    return bad("PD request", err);
  }
  if (has_seed) r.seed = seed;
  if (auto it = j.find("before"); it != j.end() && !it->is_null()) {
    auto o = request_output_from_json(*it);
    if (!o.ok()) return o.status().with_context("PD request: field 'before'");
    p.before = std::move(*o);
  }
  if (auto it = j.find("grammar"); it != j.end() && !it->is_null()) {
    GrammarSpec g;
    std::string kind;
    int32_t start = 0;
    const bool has_start = it->is_object() && it->contains("start_after");
    if (!it->is_object() || !get(*it, "kind", &kind, &err) ||
        !get(*it, "strict", &g.strict, &err, false) ||
        !get(*it, "schema", &g.schema, &err, false) ||
        (has_start && !get(*it, "start_after", &start, &err))) {
      return bad("PD request", err.empty() ? "field 'grammar' is not an object" : err);
    }
    if (kind == "json_schema") {
      g.kind = GrammarSpec::Kind::kJsonSchema;
    } else if (kind == "structural_tag") {
      g.kind = GrammarSpec::Kind::kStructuralTag;
    } else if (kind != "json_object") {
      return bad("PD request", fmt::format("unknown grammar kind '{}'", kind));
    }
    if (has_start) g.start_after = start;
    r.grammar = std::move(g);
  }
  return p;
}

json to_json(const RequestOutput& o) {
  json tokens = json::array();
  for (const GeneratedToken& t : o.tokens) {
    json top = json::array();
    for (const TokenLogprob& x : t.top) top.push_back({x.id, x.logprob});
    tokens.push_back({{"id", t.id}, {"logprob", t.logprob}, {"top", std::move(top)}});
  }
  json j = {{"tokens", std::move(tokens)},
            {"finished", o.finished},
            {"prompt_tokens", o.prompt_tokens},
            {"cached_prompt_tokens", o.cached_prompt_tokens}};
  if (o.finished) j["finish_reason"] = reason_name(o.finish_reason);
  if (!o.error.ok()) {
    j["error"] = o.error.message();
    j["error_code"] = status_code_name(o.error.code());
  }
  return j;
}

Result<RequestOutput> request_output_from_json(const json& j) {
  RequestOutput o;
  std::string err;
  json tokens;
  if (!get(j, "tokens", &tokens, &err) || !tokens.is_array() ||
      !get(j, "finished", &o.finished, &err) || !get(j, "prompt_tokens", &o.prompt_tokens, &err) ||
      !get(j, "cached_prompt_tokens", &o.cached_prompt_tokens, &err)) {
    return bad("unit output", err.empty() ? "tokens is not an array" : err);
  }
  try {
    for (const json& t : tokens) {
      GeneratedToken g;
      g.id = t.at("id").get<int32_t>();
      g.logprob = t.at("logprob").get<float>();
      for (const json& x : t.at("top")) {
        g.top.push_back({x.at(0).get<int32_t>(), x.at(1).get<float>()});
      }
      o.tokens.push_back(std::move(g));
    }
  } catch (const json::exception& e) {
    return bad("unit output", std::string("a malformed token: ") + e.what());
  }
  if (o.finished) {
    std::string reason;
    if (!get(j, "finish_reason", &reason, &err) || !parse_reason(reason, &o.finish_reason)) {
      return bad("unit output", err.empty() ? "unknown finish_reason" : err);
    }
    std::string msg;
    if (o.finish_reason == FinishReason::kError) {
      std::string code;
      (void)get(j, "error", &msg, &err, false);
      (void)get(j, "error_code", &code, &err, false);
      StatusCode c = StatusCode::kUnavailable;  // (a unit that names no code)
      for (int k = int(StatusCode::kInvalidArgument); k <= int(StatusCode::kInternal); ++k) {
        if (code == status_code_name(StatusCode(k))) c = StatusCode(k);
      }
      o.error = Status(c, msg.empty() ? "the unit reported an error" : msg);
    }
  }
  return o;
}

json to_json(const PrefillReply& r) {
  json j = to_json(r.output);
  if (!r.transfer.empty()) j["transfer"] = r.transfer;
  if (!r.handle.empty()) j["handle"] = r.handle;
  return j;
}

Result<PrefillReply> prefill_reply_from_json(const json& j) {
  auto o = request_output_from_json(j);
  if (!o.ok()) return o.status();
  PrefillReply r;
  r.output = std::move(*o);
  std::string err;
  if (!get(j, "transfer", &r.transfer, &err, false) || !get(j, "handle", &r.handle, &err, false)) {
    return bad("prefill reply", err);
  }
  if (r.output.finish_reason == FinishReason::kHandedOff && r.output.finished &&
      (r.transfer.empty() || r.handle.empty())) {
    return bad("prefill reply", "a hand-off without its transfer address and handle");
  }
  return r;
}

}  // namespace moeserve
