#include "router/pd_router.h"

#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <optional>

#include <fmt/format.h>
#include <httplib.h>
#include <xxhash.h>
#include <nlohmann/json.hpp>

#include "cache/kv_cache.h"
#include "router/pd_http.h"
#include "server/api_error.h"
#include "transfer/kv_transfer.h"

namespace moeserve {

using nlohmann::json;

namespace {

// 404 for a unit name the router does not have (heartbeat, drain).
Reply unknown_unit_reply(const std::string& name) {
  return Reply{404, "application/json",
               ApiError{404, fmt::format("unit {} is not registered", name),
                        "invalid_request_error", std::nullopt, "unknown_unit"}
                   .to_json(),
               nullptr};
}

Reply json_reply(int status, const json& j) {
  return Reply{status, "application/json", j.dump(), nullptr};
}

// A unit's error reply as a Status (its body is an OpenAI-style error).
Status status_of_reply(int http_status, const std::string& body, const std::string& unit) {
  std::string msg = body;
  json j = json::parse(body, nullptr, false);
  if (!j.is_discarded() && j.contains("error") && j["error"].contains("message") &&
      j["error"]["message"].is_string()) {
    msg = j["error"]["message"].get<std::string>();
  }
  msg = fmt::format("unit {}: {}", unit, msg);
  switch (http_status) {
    case 400:
      return InvalidArgument(msg);
    case 429:
      return ResourceExhausted(msg);
    case 503:
      return Unavailable(msg);
    default:
      return Internal(fmt::format("{} (HTTP {})", msg, http_status));
  }
}

RequestOutput error_output(const Status& st) {
  RequestOutput o;
  o.finished = true;
  o.finish_reason = st.code() == StatusCode::kOk ? FinishReason::kCancelled : FinishReason::kError;
  o.error = st;
  return o;
}

}  // namespace

PdRouter::PdRouter(RouterOptions options) : options_(std::move(options)) {
  const RouterOptions::Planning& pl = options_.planning;
  if (pl.interval.count() > 0) {
    const int64_t period =
        pl.period > 0 ? pl.period : std::max<int64_t>(1, std::chrono::hours(24) / pl.interval);
    if (pl.forecaster == "lstm") {
      planner_ = std::make_unique<Planner>(pl.options, lstm(pl.lstm.requests), lstm(pl.lstm.input),
                                           lstm(pl.lstm.output));
    } else {
      planner_ = std::make_unique<Planner>(pl.options, pl.forecaster == "holt-winters"
                                                           ? holt_winters(period, pl.holt_winters)
                                                           : seasonal_naive(period));
    }
    for (const IntervalLoad& l : pl.history) planner_->observe(l);
    planner_thread_ = std::thread([this] { planner_loop(); });
  }
}

PdRouter::~PdRouter() {
  std::list<Flow> flows;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (Flow& f : flows_) f.cancelled.store(true);
    flows.splice(flows.end(), flows_);
  }
  planner_cv_.notify_all();
  if (planner_thread_.joinable()) planner_thread_.join();
  for (Flow& f : flows) f.thread.join();
}

IntervalLoad PdRouter::take_interval() {
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = Clock::now();
  const double secs = std::max(1e-3, std::chrono::duration<double>(now - interval_start_).count());
  IntervalLoad l;
  l.requests_per_s = double(stats_.requests - interval_requests_) / secs;
  l.input_tokens_per_s = double(prompt_tokens_ - interval_prompt_) / secs;
  l.cached_tokens_per_s = double(cached_tokens_ - interval_cached_) / secs;
  l.output_tokens_per_s = double(generated_tokens_ - interval_generated_) / secs;
  auto p99 = [](std::vector<double>& v) {
    if (v.empty()) return 0.0;
    const size_t k = std::min(v.size() - 1, size_t(std::ceil(0.99 * double(v.size()))) - 1);
    std::nth_element(v.begin(), v.begin() + int64_t(k), v.end());
    return v[k];
  };
  l.ttft_p99_s = p99(ttft_s_);
  l.tpot_p99_s = p99(tpot_s_);
  ttft_s_.clear();
  tpot_s_.clear();
  interval_start_ = now;
  interval_requests_ = stats_.requests;
  interval_prompt_ = prompt_tokens_;
  interval_cached_ = cached_tokens_;
  interval_generated_ = generated_tokens_;
  return l;
}

void PdRouter::planner_loop() {
  const RouterOptions::Planning& pl = options_.planning;
  int64_t last_prefill = -1, last_decode = -1;  // the targets last handed to the hook
  // One decision; the first at once, from the history alone (a fleet is brought up before the
  // first interval is measured).
  auto decide = [&](bool observe) {
    int64_t prefill = 0, decode = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const auto now = Clock::now();
      for (const auto& [name, u] : units_) {
        if (!alive(u, now)) continue;
        prefill += u.info.role != UnitRole::kDecode;
        decode += u.info.role != UnitRole::kPrefill;
      }
    }
    if (observe) planner_->observe(take_interval());
    const PlanDecision d = planner_->decide(prefill, decode);
    fmt::print(stderr, "router: {}\n", d.explain(pl.options, prefill, decode));
    // Run when the targets change, and when the units alive are not what they should be (one
    // died, or one started has not registered yet: the hook must be idempotent).
    if (!pl.hook.empty() && (d.prefill != last_prefill || d.decode != last_decode ||
                             d.prefill != prefill || d.decode != decode)) {
      const std::string cmd = fmt::format("{} {} {}", pl.hook, d.prefill, d.decode);
      if (const int rc = std::system(cmd.c_str()); rc != 0) {
        fmt::print(stderr, "router: the planner's hook '{}' exited with {}\n", cmd, rc);
      }
      last_prefill = d.prefill;
      last_decode = d.decode;
    }
    std::lock_guard<std::mutex> lock(mu_);
    planner_metrics_ = planner_->metrics_text();
  };
  decide(/*observe=*/false);
  take_interval();  // (the first interval starts now)
  std::unique_lock<std::mutex> lock(mu_);
  while (!planner_cv_.wait_for(lock, pl.interval, [&] { return stopping_; })) {
    lock.unlock();
    decide(/*observe=*/true);
    lock.lock();
  }
}

bool PdRouter::alive(const Unit& u, Clock::time_point now) const {
  return !u.draining && !u.load.draining && now - u.last_seen <= options_.unit_timeout;
}

std::vector<uint64_t> PdRouter::block_hashes(const std::vector<int32_t>& prompt) const {
  std::vector<uint64_t> out;
  uint64_t h = 0;
  for (size_t b = 0; (b + 1) * kKvBlockSize <= prompt.size(); ++b) {
    h = XXH3_64bits_withSeed(prompt.data() + b * kKvBlockSize, kKvBlockSize * sizeof(int32_t), h);
    out.push_back(h);
  }
  return out;
}

void PdRouter::reap_locked() {
  for (auto it = flows_.begin(); it != flows_.end();) {
    if (it->done.load()) {
      it->thread.join();
      it = flows_.erase(it);
    } else {
      ++it;
    }
  }
}

Status PdRouter::submit(EngineRequest r, OutputCallback cb) {
  if (planner_) {  // the planner's latencies: TTFT, and TPOT over the tokens after the first
    cb = [this, cb = std::move(cb), start = Clock::now(),
          first = std::optional<Clock::time_point>(),
          tokens = int64_t(0)](const RequestOutput& o) mutable {
      const auto now = Clock::now();
      if (!o.tokens.empty()) {
        if (!first) {
          first = now;
          std::lock_guard<std::mutex> lock(mu_);
          ttft_s_.push_back(std::chrono::duration<double>(now - start).count());
        }
        tokens += int64_t(o.tokens.size());
      }
      if (o.finished && first && tokens > 1) {
        std::lock_guard<std::mutex> lock(mu_);
        tpot_s_.push_back(std::chrono::duration<double>(now - *first).count() / double(tokens - 1));
      }
      cb(o);
    };
  }
  if (r.prompt.empty()) return InvalidArgument("the prompt is empty");
  if (int64_t(r.prompt.size()) + r.max_tokens > options_.max_context) {
    return InvalidArgument(
        fmt::format("prompt ({} tokens) + max_tokens ({}) exceeds the context "
                    "length ({})",
                    r.prompt.size(), r.max_tokens, options_.max_context));
  }
  // Both roles alive, or wait for them up to --unit-wait-ms (a fleet scaling up from none).
  const auto wait_until = Clock::now() + Clock::duration(options_.unit_wait);
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (stopping_) return Unavailable("the router is stopping");
    const auto now = Clock::now();
    bool prefill = false, decode = false;
    for (const auto& [name, u] : units_) {
      if (!alive(u, now)) continue;
      prefill |= u.info.role != UnitRole::kDecode;
      decode |= u.info.role != UnitRole::kPrefill;
    }
    if (prefill && decode) break;
    if (now >= wait_until) {
      return Unavailable(
          fmt::format("no {} unit is registered and alive", !prefill ? "prefill" : "decode"));
    }
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    lock.lock();
  }
  reap_locked();
  Flow& f = flows_.emplace_back();
  f.request = std::move(r);
  f.callback = std::move(cb);
  ++stats_.requests;
  f.thread = std::thread([this, &f] {
    run(f);
    f.done.store(true);
  });
  return Status::Ok();
}

void PdRouter::cancel(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  for (Flow& f : flows_) {
    if (f.request.id == id) f.cancelled.store(true);
  }
}

void PdRouter::run(Flow& f) {
  if (f.request.attach_first) {
    int64_t had = 0;  // tokens the attached stream delivered before its unit went away
    if (attach(f, &had)) return;
    if (had > 0) {
      // Generated again from the start (the same key, the same seed: the same tokens), the
      // client getting only those after the ones it has.
      fmt::print(stderr,
                 "router: request {} generated again after its kept stream's unit went "
                 "away ({} token(s) in)\n",
                 f.request.id, had);
      f.callback = [cb = std::move(f.callback), skip = had](const RequestOutput& o) mutable {
        RequestOutput rest = o;
        const int64_t drop = std::min<int64_t>(skip, int64_t(rest.tokens.size()));
        rest.tokens.erase(rest.tokens.begin(), rest.tokens.begin() + drop);
        skip -= drop;
        if (!rest.tokens.empty() || rest.finished) cb(rest);
      };
    }
  }
  PrefillReply reply;
  std::string unit;
  Status st = run_prefill(f, &reply, &unit);
  if (!st.ok()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.failed;
    }
    f.callback(error_output(st));
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    prompt_tokens_ += reply.output.prompt_tokens;
    cached_tokens_ += reply.output.cached_prompt_tokens;
    generated_tokens_ += int64_t(reply.output.tokens.size());
  }
  const bool handed_off =
      reply.output.finished && reply.output.finish_reason == FinishReason::kHandedOff;
  if (!handed_off) {
    f.callback(reply.output);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.handed_off;
  }
  RequestOutput first = reply.output;
  first.finished = false;
  first.handoff.reset();
  if (!f.request.idempotency_key.empty()) f.delivered_tokens = first.tokens;
  if (!first.tokens.empty()) f.callback(first);
  std::vector<int32_t> delivered;  // what the client has: a re-bound request goes on from there
  for (const GeneratedToken& t : first.tokens) delivered.push_back(t.id);
  std::vector<std::string> avoid;
  DecodeEnd end = DecodeEnd::kDone;
  for (int attempt = 0; attempt < options_.decode_attempts && !f.cancelled.load(); ++attempt) {
    end = run_decode(f, reply, &delivered, &avoid, &st);
    if (end == DecodeEnd::kDone || end == DecodeEnd::kFailed || f.cancelled.load()) break;
    if (attempt + 1 == options_.decode_attempts) break;
    fmt::print(stderr, "router: request {} re-bound after {} token(s): {}\n", f.request.id,
               delivered.size(), st.message());
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.rebinds;
    }
    if (end != DecodeEnd::kNoKv) continue;
    // The KV is gone (its prefill unit lost, or the retention over): prefill again. The prompt's
    // full blocks are mostly in the prefill units' prefix caches, and the same seed gives the
    // same first token and sampler, so the decode unit goes on from `delivered` as before.
    release(reply);
    PrefillReply again;
    st = run_prefill(f, &again, &unit);
    if (st.ok() &&
        (again.output.finish_reason != FinishReason::kHandedOff || again.output.tokens.empty() ||
         delivered.empty() || again.output.tokens[0].id != delivered[0])) {
      st = Internal(fmt::format(
          "request {}: prefilled again for a new decode unit, it did not reach the same first "
          "token; ending it rather than changing its output",
          f.request.id));
    }
    if (!st.ok()) {
      if (!again.handle.empty()) release(again);
      end = DecodeEnd::kFailed;
      break;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.reprefills;
    }
    reply = std::move(again);
  }
  if (end != DecodeEnd::kDone || f.cancelled.load()) {
    if (!f.cancelled.load()) {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.failed;
    }
    f.callback(error_output(f.cancelled.load() ? Status::Ok() : st));
  }
  release(reply);
}

bool PdRouter::attach(Flow& f, int64_t* had) {
  std::vector<std::string> urls;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = Clock::now();
    for (const auto& [name, u] : units_) {
      if (u.info.role != UnitRole::kPrefill && alive(u, now)) urls.push_back(u.info.url);
    }
  }
  const std::string body = nlohmann::json{{"key", f.request.idempotency_key}}.dump();
  for (const std::string& url : urls) {
    std::string host;
    int port = 0;
    if (!split_http_url(url, &host, &port).ok()) continue;
    httplib::Client c(host, port);
    c.set_connection_timeout(1, 0);
    c.set_read_timeout(
        std::chrono::duration_cast<std::chrono::seconds>(options_.decode_idle_timeout).count(), 0);
    if (!options_.api_key.empty()) c.set_bearer_token_auth(options_.api_key);
    int status = 0;
    bool finished = false;
    std::string pending;
    Status line_error;
    httplib::Request req;
    req.method = "POST";
    req.path = "/pd/v1/attach";
    req.body = body;
    req.set_header("Content-Type", "application/json");
    req.response_handler = [&](const httplib::Response& r) {
      status = r.status;
      return r.status == 200;
    };
    req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
      pending.append(data, len);
      size_t nl;
      while ((nl = pending.find('\n')) != std::string::npos) {
        const std::string line = pending.substr(0, nl);
        pending.erase(0, nl + 1);
        auto j = parse_json(line, "attached output");
        auto o = j.ok() ? request_output_from_json(*j) : Result<RequestOutput>(j.status());
        if (!o.ok()) {
          line_error = o.status();
          return false;
        }
        if (o->finished && o->finish_reason != FinishReason::kError) finished = true;
        if (o->finished && !finished) {  // (the kept request failed: generated again below)
          line_error = o->error;
          return false;
        }
        *had += int64_t(o->tokens.size());
        f.callback(*o);
        if (finished) return true;
      }
      return !f.cancelled.load();
    };
    auto res = c.send(req);
    if (status != 200) continue;  // (not there: 404; or the unit did not answer)
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.attached;
    }
    // The unit went away (or the kept request failed) while this router read it: run() generates
    // the request again.
    if (!finished && !f.cancelled.load()) return false;
    return true;
  }
  return false;
}

// The request has ended: its prefill unit may drop the hand-off it retained for failover.
void PdRouter::release(const PrefillReply& reply) {
  if (reply.handle.empty() || reply.transfer.empty()) return;
  std::shared_ptr<UcxContext> ctx;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!ucx_) {
      auto c = UcxContext::create();
      if (!c.ok()) return;  // (the retention bounds it)
      ucx_ = *c;
    }
    ctx = ucx_;
  }
  if (release_kv(ctx, reply.transfer, reply.handle).ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.released;
  }
}

Status PdRouter::run_prefill(Flow& f, PrefillReply* reply, std::string* unit_name) {
  const std::vector<uint64_t> hashes = block_hashes(f.request.prompt);
  const int64_t n = int64_t(f.request.prompt.size());
  std::vector<std::string> tried;
  Status last;
  for (int attempt = 0; attempt < options_.prefill_attempts; ++attempt) {
    std::string name, url;
    double attn = 0;
    int64_t added = 0;  // the load this call puts on the unit until it answers
    {
      std::lock_guard<std::mutex> lock(mu_);
      const auto now = Clock::now();
      std::vector<std::string> names;
      std::vector<RankLoad> loads;
      std::vector<int64_t> cached;
      for (auto& [nm, u] : units_) {
        if (u.info.role == UnitRole::kDecode) continue;
        if (std::find(tried.begin(), tried.end(), nm) != tried.end()) continue;
        names.push_back(nm);
        RankLoad l;
        l.accepting = alive(u, now);
        l.input_tokens = u.input_tokens;
        l.attention = u.attention;
        l.assigned_total = u.assigned_total;
        loads.push_back(l);
        int64_t hit = 0;
        while (hit < int64_t(hashes.size()) && u.prefix.count(hashes[size_t(hit)])) ++hit;
        cached.push_back(hit * kKvBlockSize);
      }
      auto pick = choose_prefill(loads, cached, n, options_.cache_slack);
      if (!pick) break;
      name = names[pick->rank];
      Unit& u = units_[name];
      url = u.info.url;
      const int64_t hit = std::min(cached[pick->rank], n - 1);
      added = n - hit;
      attn = attention_work(added, hit);
      u.input_tokens += added;
      u.attention += attn;
      u.assigned_total += added;
      ++u.prefills_total;
      if (pick->by_cache) ++stats_.by_cache;
      if (attempt > 0) ++stats_.prefill_retries;
      for (uint64_t h : hashes) {
        if (u.prefix.insert(h).second) u.prefix_order.push_back(h);
      }
      while (int64_t(u.prefix_order.size()) > options_.prefix_blocks_per_unit) {
        u.prefix.erase(u.prefix_order.front());
        u.prefix_order.pop_front();
      }
      *unit_name = name;
      tried.push_back(name);
    }
    std::string host;
    int port = 0;
    Status st = split_http_url(url, &host, &port);
    httplib::Result res{nullptr, httplib::Error::Connection};
    if (st.ok()) {
      httplib::Client c(host, port);
      c.set_connection_timeout(2, 0);
      c.set_read_timeout(
          std::chrono::duration_cast<std::chrono::seconds>(options_.prefill_timeout).count(), 0);
      c.set_write_timeout(10, 0);
      if (!options_.api_key.empty()) c.set_bearer_token_auth(options_.api_key);
      res = c.Post("/pd/v1/prefill", to_json(PdRequest{f.request, "", "", std::nullopt}).dump(),
                   "application/json");
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = units_.find(name);
      if (it != units_.end()) {
        it->second.input_tokens = std::max<int64_t>(0, it->second.input_tokens - added);
        it->second.attention = std::max(0.0, it->second.attention - attn);
        if (!res) ++it->second.failures;
      }
    }
    if (!st.ok()) return st;
    if (!res) {  // the unit is gone or unreachable: nothing was handed off; try another
      last = Unavailable(fmt::format("prefill unit {} did not answer ({})", name,
                                     httplib::to_string(res.error())));
      continue;
    }
    if (res->status != 200) return status_of_reply(res->status, res->body, name);
    auto j = parse_json(res->body, "prefill reply");
    if (!j.ok()) return j.status();
    auto r = prefill_reply_from_json(*j);
    if (!r.ok()) return r.status().with_context("unit " + name);
    *reply = std::move(*r);
    return Status::Ok();
  }
  return last.ok() ? Unavailable("no prefill unit is registered and alive") : last;
}

PdRouter::DecodeEnd PdRouter::run_decode(Flow& f, const PrefillReply& reply,
                                         std::vector<int32_t>* delivered,
                                         std::vector<std::string>* avoid, Status* error) {
  std::string name, url, key;
  const int64_t blocks = blocks_for(int64_t(f.request.prompt.size()) + f.request.max_tokens);
  // A re-bound request waits a while for a decode unit (one restarting, say); a new one does not.
  const auto wait_until = Clock::now() + (avoid->empty() ? Clock::duration(options_.unit_wait)
                                                         : Clock::duration(options_.rebind_wait));
  for (;;) {
    std::unique_lock<std::mutex> lock(mu_);
    const auto now = Clock::now();
    std::vector<std::string> names;
    std::vector<RankLoad> loads;
    for (auto& [nm, u] : units_) {
      if (u.info.role == UnitRole::kPrefill) continue;
      const std::string k = fmt::format("{}#{}", nm, u.epoch);
      if (std::find(avoid->begin(), avoid->end(), k) != avoid->end()) continue;
      names.push_back(nm);
      RankLoad l;
      l.accepting = alive(u, now);
      l.requests = std::max(u.decodes, u.load.running + u.load.waiting);
      l.kv_used = u.load.kv_blocks_used;
      l.kv_total = u.load.kv_blocks_total > 0 ? u.load.kv_blocks_total : u.info.kv_blocks_total;
      loads.push_back(l);
    }
    if (auto pick = choose_decode(loads, blocks)) {
      name = names[*pick];
      Unit& u = units_[name];
      url = u.info.url;
      key = fmt::format("{}#{}", name, u.epoch);
      ++u.decodes;
      ++u.decodes_total;
      break;
    }
    if (now >= wait_until || f.cancelled.load() || stopping_) {
      *error = Unavailable(avoid->empty() ? std::string("no decode unit is registered and alive")
                                          : fmt::format("no other decode unit is registered and "
                                                        "alive (waited {} ms)",
                                                        options_.rebind_wait.count()));
      return DecodeEnd::kFailed;
    }
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  auto release_slot = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = units_.find(name);
    if (it != units_.end()) it->second.decodes = std::max<int64_t>(0, it->second.decodes - 1);
  };
  std::string host;
  int port = 0;
  if (Status st = split_http_url(url, &host, &port); !st.ok()) {
    release_slot();
    *error = st;
    return DecodeEnd::kFailed;
  }
  httplib::Client c(host, port);
  c.set_connection_timeout(2, 0);
  c.set_read_timeout(
      std::chrono::duration_cast<std::chrono::seconds>(options_.decode_idle_timeout).count(), 0);
  if (!options_.api_key.empty()) c.set_bearer_token_auth(options_.api_key);
  std::string pending;  // a partial line
  bool finished = false;
  Status line_error, unit_error;  // a malformed line; the unit's own error output
  int64_t tokens_here = 0;        // tokens this unit sent
  std::string error_body;
  int status = 0;
  PdRequest pr{f.request, reply.transfer, reply.handle, std::nullopt};
  if (delivered->size() > 1) pr.request.resume_generated = *delivered;
  if (!f.request.idempotency_key.empty()) {  // (where a router that attaches starts reading)
    pr.before.emplace();
    pr.before->tokens = f.delivered_tokens;
  }
  httplib::Request req;
  req.method = "POST";
  req.path = "/pd/v1/decode";
  req.body = to_json(pr).dump();
  req.set_header("Content-Type", "application/json");
  req.response_handler = [&](const httplib::Response& r) {
    status = r.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    if (status != 200) {
      error_body.append(data, len);
      return true;
    }
    pending.append(data, len);
    size_t nl;
    while ((nl = pending.find('\n')) != std::string::npos) {
      std::string line = pending.substr(0, nl);
      pending.erase(0, nl + 1);
      auto j = parse_json(line, "decode output");
      auto o = j.ok() ? request_output_from_json(*j) : Result<RequestOutput>(j.status());
      if (!o.ok()) {
        line_error = o.status().with_context("decode unit " + name);
        return false;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        generated_tokens_ += int64_t(o->tokens.size());
      }
      tokens_here += int64_t(o->tokens.size());
      for (const GeneratedToken& t : o->tokens) delivered->push_back(t.id);
      if (!f.request.idempotency_key.empty()) {
        f.delivered_tokens.insert(f.delivered_tokens.end(), o->tokens.begin(), o->tokens.end());
      }
      if (o->finished && o->finish_reason == FinishReason::kError) {
        // The error is not the client's yet: another unit may go on (run() decides); the
        // tokens before it are.
        unit_error = o->error.with_context("decode unit " + name);
        if (!o->tokens.empty()) {
          RequestOutput part = *o;
          part.finished = false;
          part.error = Status::Ok();
          f.callback(part);
        }
        return false;
      }
      if (o->finished) finished = true;
      f.callback(*o);
      if (finished) return true;
    }
    return !f.cancelled.load();
  };
  // A unit that stops answering without closing the stream (stopped, hung, cut off) would hold
  // the request until decode_idle_timeout: a watch ends the stream once the unit's heartbeats
  // are older than unit_timeout. (A unit that deregistered while draining is not watched: it
  // finishes what it runs.)
  std::mutex watch_mu;
  std::condition_variable watch_cv;
  bool streaming = true;
  int64_t silent_ms = -1;  // set when the watch ended the stream
  std::thread watch([&] {
    std::unique_lock<std::mutex> wl(watch_mu);
    while (!watch_cv.wait_for(wl, std::chrono::milliseconds(100), [&] { return !streaming; })) {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = units_.find(name);
      if (it == units_.end()) continue;
      const auto quiet = Clock::now() - it->second.last_seen;
      if (quiet > options_.unit_timeout) {
        silent_ms = std::chrono::duration_cast<std::chrono::milliseconds>(quiet).count();
        c.stop();
        return;
      }
    }
  });
  auto res = c.send(req);
  {
    std::lock_guard<std::mutex> wl(watch_mu);
    streaming = false;
  }
  watch_cv.notify_all();
  watch.join();
  release_slot();
  if (!finished && f.cancelled.load() && !f.request.idempotency_key.empty()) {
    // A keyed request goes on at its unit when the stream drops (for a router that attaches
    // after this one died); a cancel is not that: tell the unit.
    httplib::Client cc(host, port);
    cc.set_connection_timeout(1, 0);
    cc.set_read_timeout(2, 0);
    if (!options_.api_key.empty()) cc.set_bearer_token_auth(options_.api_key);
    (void)cc.Post("/pd/v1/cancel", nlohmann::json{{"key", f.request.idempotency_key}}.dump(),
                  "application/json");
  }
  if (finished || f.cancelled.load()) return DecodeEnd::kDone;
  if (!line_error.ok()) {
    *error = line_error;
    return DecodeEnd::kFailed;
  }
  auto count_failure = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = units_.find(name);
    if (it != units_.end()) ++it->second.failures;
  };
  if (status != 0 && status != 200) {
    *error = status_of_reply(status, error_body, name);
    if (status == 503 || status == 429) {  // draining, stopping or full: another one may take it
      avoid->push_back(key);
      return DecodeEnd::kRefused;
    }
    return DecodeEnd::kFailed;
  }
  if (!unit_error.ok()) {
    *error = unit_error;
    count_failure();
    switch (unit_error.code()) {
      case StatusCode::kNotFound:  // the hand-off is not at the prefill unit any more
        return DecodeEnd::kNoKv;
      case StatusCode::kUnavailable:  // before any token: the pull could not reach the KV
        if (tokens_here == 0) return DecodeEnd::kNoKv;
        avoid->push_back(key);
        return DecodeEnd::kLost;
      case StatusCode::kInternal:  // the unit's engine failed
        avoid->push_back(key);
        return DecodeEnd::kLost;
      default:
        return DecodeEnd::kFailed;
    }
  }
  count_failure();
  avoid->push_back(key);
  if (silent_ms >= 0) {
    *error = Unavailable(fmt::format(
        "decode unit {} stopped answering mid-stream (no heartbeat for {} ms; --unit-timeout-ms "
        "{})",
        name, silent_ms, options_.unit_timeout.count()));
  } else {
    *error = Unavailable(
        fmt::format("decode unit {} went away mid-stream ({})", name,
                    res ? std::string("the stream ended early") : httplib::to_string(res.error())));
  }
  return DecodeEnd::kLost;
}

EngineStats PdRouter::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  EngineStats s;
  for (const auto& [name, u] : units_) {
    s.running += u.load.running;
    s.waiting += u.load.waiting;
    s.kv_blocks_used += u.load.kv_blocks_used;
    s.kv_blocks_total += u.load.kv_blocks_total;
  }
  s.prompt_tokens = prompt_tokens_;
  s.generated_tokens = generated_tokens_;
  return s;
}

RouterStats PdRouter::router_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

Reply PdRouter::register_unit(std::string_view body) {
  auto j = parse_json(body, "unit registration");
  if (!j.ok()) return error_reply(j.status());
  auto info = unit_info_from_json(*j);
  if (!info.ok()) return error_reply(info.status());
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [name, u] : units_) {
    if (name != info->name && alive(u, Clock::now()) && u.info.fingerprint != info->fingerprint) {
      return error_reply(InvalidArgument(fmt::format(
          "unit {} serves KV of fingerprint {:016x}, unit {} already here {:016x}: another model "
          "or KV format",
          info->name, info->fingerprint, name, u.info.fingerprint)));
    }
  }
  Unit& u = units_[info->name];
  const bool rejoin = !u.info.name.empty();
  u.epoch = ++registrations_;  // (a re-bound request avoids a lost unit, not its restart)
  u.info = *info;
  u.load = UnitLoad{};
  u.load.name = info->name;
  u.load.kv_blocks_total = info->kv_blocks_total;
  u.draining = false;
  u.last_seen = Clock::now();
  fmt::print(stderr, "router: {} {} unit {} ({})\n", rejoin ? "re-registered" : "registered",
             to_string(info->role), info->name, info->url);
  return json_reply(200, {{"status", "registered"}});
}

Reply PdRouter::heartbeat(std::string_view body) {
  auto j = parse_json(body, "unit heartbeat");
  if (!j.ok()) return error_reply(j.status());
  auto l = unit_load_from_json(*j);
  if (!l.ok()) return error_reply(l.status());
  std::lock_guard<std::mutex> lock(mu_);
  auto it = units_.find(l->name);
  if (it == units_.end()) {
    return unknown_unit_reply(l->name);
  }
  it->second.load = *l;
  it->second.last_seen = Clock::now();
  return json_reply(200, {{"status", "ok"}});
}

Reply PdRouter::deregister(std::string_view body) {
  auto j = parse_json(body, "unit deregistration");
  if (!j.ok()) return error_reply(j.status());
  std::string name = j->value("name", "");
  std::lock_guard<std::mutex> lock(mu_);
  if (units_.erase(name) == 0) return error_reply(InvalidArgument("unknown unit '" + name + "'"));
  fmt::print(stderr, "router: unit {} deregistered\n", name);
  return json_reply(200, {{"status", "deregistered"}});
}

Reply PdRouter::drain_unit(std::string_view body) {
  auto j = parse_json(body, "drain request");
  if (!j.ok()) return error_reply(j.status());
  if (!j->is_object() || !j->contains("unit") || !(*j)["unit"].is_string()) {
    return error_reply(InvalidArgument("a drain request is {\"unit\": NAME} (GET /admin/units)"));
  }
  const std::string name = (*j)["unit"].get<std::string>();
  std::string url;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = units_.find(name);
    if (it == units_.end()) {
      return unknown_unit_reply(name);
    }
    it->second.draining = true;  // out of the choice from now on
    url = it->second.info.url;
  }
  fmt::print(stderr, "router: draining unit {}\n", name);
  std::string host;
  int port = 0;
  Status st = split_http_url(url, &host, &port);
  if (st.ok()) {
    httplib::Client c(host, port);
    c.set_connection_timeout(2, 0);
    c.set_read_timeout(5, 0);
    c.set_write_timeout(5, 0);
    if (!options_.api_key.empty()) c.set_bearer_token_auth(options_.api_key);
    auto res = c.Post("/pd/v1/drain", "{}", "application/json");
    if (!res) {
      st = Unavailable(fmt::format("unit {} at {} does not answer ({})", name, url,
                                   httplib::to_string(res.error())));
    } else if (res->status != 200) {
      st = Unavailable(
          fmt::format("unit {} at {} answered {}: {}", name, url, res->status, res->body));
    }
  }
  if (!st.ok()) {  // it still gets no new work from here
    return Reply{502, "application/json",
                 ApiError{502, st.message() + "; it gets no new work from this router",
                          "server_error", std::nullopt, "unit_unreachable"}
                     .to_json(),
                 nullptr};
  }
  return json_reply(200, {{"unit", name}, {"state", "draining"}});
}

std::string PdRouter::units_json() const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = Clock::now();
  json out = json::array();
  for (const auto& [name, u] : units_) {
    json j = to_json(u.info);
    j["state"] = u.draining || u.load.draining ? "draining" : alive(u, now) ? "active" : "lost";
    j["load"] = to_json(u.load);
    j["last_seen_ms"] =
        std::chrono::duration_cast<std::chrono::milliseconds>(now - u.last_seen).count();
    j["router"] = {{"input_tokens", u.input_tokens},
                   {"attention", u.attention},
                   {"decodes", u.decodes},
                   {"prefills_total", u.prefills_total},
                   {"decodes_total", u.decodes_total},
                   {"failures", u.failures}};
    out.push_back(std::move(j));
  }
  return json{{"units", std::move(out)}}.dump();
}

std::vector<HttpRoute> PdRouter::routes() {
  return {
      {"POST", "/pd/v1/register", [this](std::string_view b) { return register_unit(b); }},
      {"POST", "/pd/v1/heartbeat", [this](std::string_view b) { return heartbeat(b); }, true},
      {"POST", "/pd/v1/deregister", [this](std::string_view b) { return deregister(b); }, true},
      {"GET", "/admin/units",
       [this](std::string_view) {
         return Reply{200, "application/json", units_json(), nullptr};
       }},
      {"POST", "/admin/drain", [this](std::string_view b) { return drain_unit(b); }},
  };
}

std::string PdRouter::metrics_text() const {
  std::string out;
  const RouterStats s = router_stats();
  auto line = [&](const std::string& name, const char* help, double v, const char* type,
                  const std::string& labels = "") {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{}{} {}\n", name, help, name, type, name,
                       labels, v);
  };
  line("moeserve_router_requests_total", "Requests the router accepted", double(s.requests),
       "counter");
  line("moeserve_router_handoffs_total", "Requests handed from prefill to decode",
       double(s.handed_off), "counter");
  line("moeserve_router_prefill_retries_total",
       "Prefill units that did not answer, tried elsewhere", double(s.prefill_retries), "counter");
  line("moeserve_router_rebinds_total",
       "Requests moved to another decode unit after theirs was lost mid-stream", double(s.rebinds),
       "counter");
  line("moeserve_router_reprefills_total",
       "Re-bound requests whose KV was gone, prefilled again first", double(s.reprefills),
       "counter");
  line("moeserve_router_releases_total", "Hand-offs released at their prefill units",
       double(s.released), "counter");
  line("moeserve_router_failed_total", "Requests that ended in an error", double(s.failed),
       "counter");
  line("moeserve_router_cache_aware_choices_total", "Prefill choices decided by a cached prefix",
       double(s.by_cache), "counter");
  {
    std::lock_guard<std::mutex> lock(mu_);
    out += planner_metrics_;
  }
  line("moeserve_router_attached_total",
       "Keyed requests resumed from a decode unit that kept them (their router had died)",
       double(s.attached), "counter");
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = Clock::now();
  out +=
      "# HELP moeserve_router_unit_up Whether the unit heartbeats and takes work\n# TYPE "
      "moeserve_router_unit_up gauge\n";
  for (const auto& [name, u] : units_) {
    out += fmt::format("moeserve_router_unit_up{{unit=\"{}\",role=\"{}\"}} {}\n", name,
                       to_string(u.info.role), alive(u, now) ? 1 : 0);
  }
  out +=
      "# HELP moeserve_router_unit_running Requests running at the unit (its heartbeat)\n# TYPE "
      "moeserve_router_unit_running gauge\n";
  for (const auto& [name, u] : units_)
    out += fmt::format("moeserve_router_unit_running{{unit=\"{}\"}} {}\n", name, u.load.running);
  out +=
      "# HELP moeserve_router_unit_kv_blocks_used KV blocks in use at the unit\n# TYPE "
      "moeserve_router_unit_kv_blocks_used gauge\n";
  for (const auto& [name, u] : units_)
    out += fmt::format("moeserve_router_unit_kv_blocks_used{{unit=\"{}\"}} {}\n", name,
                       u.load.kv_blocks_used);
  out +=
      "# HELP moeserve_router_unit_input_tokens Prompt tokens sent to the unit and not answered "
      "yet\n# TYPE moeserve_router_unit_input_tokens gauge\n";
  for (const auto& [name, u] : units_)
    out +=
        fmt::format("moeserve_router_unit_input_tokens{{unit=\"{}\"}} {}\n", name, u.input_tokens);
  out +=
      "# HELP moeserve_router_unit_failures_total Calls to the unit that failed\n# TYPE "
      "moeserve_router_unit_failures_total counter\n";
  for (const auto& [name, u] : units_)
    out += fmt::format("moeserve_router_unit_failures_total{{unit=\"{}\"}} {}\n", name, u.failures);
  return out;
}

}  // namespace moeserve
