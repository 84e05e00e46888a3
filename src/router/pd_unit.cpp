#include "router/pd_unit.h"

#include <deque>

#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "router/pd_http.h"
#include "server/api_error.h"

namespace moeserve {

using nlohmann::json;

namespace {

// Splits "http://host:port" (a path after it is ignored).

// A request's outputs as they come from the engine, for one waiting thread.
struct OutputQueue {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<RequestOutput> outputs;
  bool finished = false;

  // The engine may call it after the waiting side has gone (an abandoned stream, a prefill
  // that timed out, the cancel's own final output): it holds the queue, not a pointer to it.
  static OutputCallback callback(std::shared_ptr<OutputQueue> q) {
    return [q = std::move(q)](const RequestOutput& o) {
      std::lock_guard<std::mutex> lock(q->mu);
      q->outputs.push_back(o);
      if (o.finished) q->finished = true;
      q->cv.notify_all();
    };
  }
};

// The decode side's reply: the resumed request's outputs, one JSON line each.
class DecodeStream final : public ReplyStream {
 public:
  DecodeStream(Engine& engine, std::string id, std::shared_ptr<OutputQueue> q)
      : engine_(engine), id_(std::move(id)), queue_(std::move(q)) {}
  ~DecodeStream() override { abandon(); }

  bool next(std::string& out, std::chrono::milliseconds wait) override {
    if (done_) return false;
    std::unique_lock<std::mutex> lock(queue_->mu);
    queue_->cv.wait_for(lock, wait, [&] { return !queue_->outputs.empty(); });
    while (!queue_->outputs.empty()) {
      const RequestOutput o = std::move(queue_->outputs.front());
      queue_->outputs.pop_front();
      out += to_json(o).dump() + "\n";
      if (o.finished) done_ = true;
    }
    return !done_;
  }

  void abandon() override {
    if (!done_) engine_.cancel(id_);
    done_ = true;
  }

 private:
  Engine& engine_;
  std::string id_;
  std::shared_ptr<OutputQueue> queue_;  // (shared: a callback may outlive an abandoned stream)
  bool done_ = false;
};

}  // namespace

// A keyed decode request's outputs, kept for the routers that read them
// (docs/fault-tolerance.md): from the client's first token (PdRequest::before) on.
struct KeptStream {
  std::mutex mu;
  std::condition_variable cv;
  std::string engine_id;
  std::vector<RequestOutput> outputs;  // guarded by mu
  bool finished = false;               // guarded by mu
  int readers = 0;                     // guarded by mu
  Clock::time_point unread_since;      // guarded by mu: when the last reader left
  Clock::time_point finished_at;       // guarded by mu

  static OutputCallback callback(std::shared_ptr<KeptStream> k) {
    return [k = std::move(k)](const RequestOutput& o) {
      std::lock_guard<std::mutex> lock(k->mu);
      k->outputs.push_back(o);
      if (o.finished) {
        k->finished = true;
        k->finished_at = Clock::now();
      }
      k->cv.notify_all();
    };
  }
};

namespace {

// One reader of a KeptStream, from output `from` on, as NDJSON lines. A reader that goes away
// (its router died) leaves the request running: PdUnit::sweep_kept decides its end.
class KeptReader final : public ReplyStream {
 public:
  KeptReader(std::shared_ptr<KeptStream> k, size_t from) : k_(std::move(k)), cursor_(from) {
    std::lock_guard<std::mutex> lock(k_->mu);
    ++k_->readers;
  }
  ~KeptReader() override { abandon(); }

  bool next(std::string& out, std::chrono::milliseconds wait) override {
    if (done_) return false;
    std::unique_lock<std::mutex> lock(k_->mu);
    k_->cv.wait_for(lock, wait, [&] { return cursor_ < k_->outputs.size(); });
    while (cursor_ < k_->outputs.size()) {
      const RequestOutput& o = k_->outputs[cursor_++];
      out += to_json(o).dump() + "\n";
      if (o.finished) done_ = true;
    }
    return !done_;
  }

  void abandon() override {
    if (left_) return;
    left_ = done_ = true;
    std::lock_guard<std::mutex> lock(k_->mu);
    if (--k_->readers == 0) k_->unread_since = Clock::now();
  }

 private:
  std::shared_ptr<KeptStream> k_;
  size_t cursor_;
  bool done_ = false;
  bool left_ = false;
};

}  // namespace

Result<std::unique_ptr<PdUnit>> PdUnit::start(Engine& engine, PdTransport& transport,
                                              const PdUnitOptions& o) {
  std::unique_ptr<PdUnit> u(new PdUnit(engine, transport, o));
  u->info_.role = o.role;
  u->info_.fingerprint = engine.kv_fingerprint();
  u->info_.kv_blocks_total = engine.stats().kv_blocks_total;
  u->info_.transfer = transport.address();
  for (const std::string& url : o.router_urls) {
    std::string host;
    int port = 0;
    RETURN_IF_ERROR(split_http_url(url, &host, &port).with_context("--router"));
  }
  return u;
}

void PdUnit::join(const std::string& url) {
  info_.url = url;
  info_.name = url.rfind("http://", 0) == 0 ? url.substr(7) : url;
  if (heartbeats_.empty()) {  // (one thread per router: a router that hangs delays no other)
    for (const std::string& router : options_.router_urls) {
      heartbeats_.emplace_back([this, router] { heartbeat_loop(router); });
    }
  }
  if (!sweeper_.joinable()) {
    sweeper_ = std::thread([this] {
      std::unique_lock<std::mutex> lock(mu_);
      while (!cv_.wait_for(lock, std::chrono::milliseconds(250), [&] { return stop_; })) {
        lock.unlock();
        sweep_kept();
        lock.lock();
      }
    });
  }
}

PdUnit::~PdUnit() {
  drain();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : heartbeats_) t.join();
  if (sweeper_.joinable()) sweeper_.join();
}

void PdUnit::sweep_kept() {
  const Clock::time_point now = Clock::now();
  std::vector<std::string> cancel;
  std::lock_guard<std::mutex> lock(kept_mu_);
  for (auto it = kept_.begin(); it != kept_.end();) {
    KeptStream& k = *it->second;
    bool drop = false;
    {
      std::lock_guard<std::mutex> klock(k.mu);
      if (k.finished) {
        drop = k.readers == 0 && now - k.finished_at > options_.kept_retention;
      } else if (k.readers == 0 && now - k.unread_since > options_.detached_grace) {
        cancel.push_back(k.engine_id);  // (its router never came back)
        drop = true;
      }
    }
    it = drop ? kept_.erase(it) : std::next(it);
  }
  for (const std::string& id : cancel) engine_.cancel(id);
}

Result<std::shared_ptr<KeptStream>> PdUnit::find_kept(std::string_view body, const char* what,
                                                      bool remove) {
  auto j = parse_json(body, what);
  if (!j.ok()) return j.status();
  auto key = j->find("key");
  if (!j->is_object() || key == j->end() || !key->is_string()) {
    return InvalidArgument(fmt::format("{}: needs 'key' (a string)", what));
  }
  std::lock_guard<std::mutex> lock(kept_mu_);
  auto it = kept_.find(key->get<std::string>());
  if (it == kept_.end()) return std::shared_ptr<KeptStream>();
  std::shared_ptr<KeptStream> k = it->second;
  if (remove) kept_.erase(it);
  return k;
}

Reply PdUnit::cancel_kept(std::string_view body) {
  auto k = find_kept(body, "cancel request", /*remove=*/true);
  if (!k.ok()) return error_reply(k.status());
  if (*k) engine_.cancel((*k)->engine_id);
  return Reply{200, "application/json", json{{"cancelled", *k != nullptr}}.dump(), nullptr};
}

Reply PdUnit::attach(std::string_view body) {
  auto found = find_kept(body, "attach request", /*remove=*/false);
  if (!found.ok()) return error_reply(found.status());
  std::shared_ptr<KeptStream> k = std::move(*found);
  if (!k) {
    return Reply{404, "application/json",
                 json{{"error", {{"message", "no request with that key here"}}}}.dump(), nullptr};
  }
  Reply reply;
  reply.content_type = "application/x-ndjson";
  reply.stream = std::make_shared<KeptReader>(std::move(k), 0);
  return reply;
}

std::vector<HttpRoute> PdUnit::routes() {
  std::vector<HttpRoute> r;
  if (options_.role != UnitRole::kDecode) {
    r.push_back({"POST", "/pd/v1/prefill", [this](std::string_view b) { return prefill(b); }});
  }
  if (options_.role != UnitRole::kPrefill) {
    r.push_back({"POST", "/pd/v1/decode", [this](std::string_view b) { return decode(b); }});
    r.push_back({"POST", "/pd/v1/attach", [this](std::string_view b) { return attach(b); },
                 /*while_draining=*/true});
    r.push_back({"POST", "/pd/v1/cancel", [this](std::string_view b) { return cancel_kept(b); },
                 /*while_draining=*/true});
  }
  r.push_back({"POST", "/pd/v1/drain",
               [this](std::string_view) {
                 drain_requested_.store(true);
                 return Reply{200, "application/json",
                              json{{"status", "draining"}, {"unit", info_.name}}.dump(), nullptr};
               },
               /*while_draining=*/true});
  return r;
}

int64_t PdUnit::wait_handoffs(Clock::time_point deadline) {
  for (;;) {
    const int64_t held = transport_.server_stats().leases;
    if (held == 0 || Clock::now() >= deadline) return held;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

Reply PdUnit::prefill(std::string_view body) {
  auto j = parse_json(body, "prefill request");
  if (!j.ok()) return error_reply(j.status());
  auto p = pd_request_from_json(*j);
  if (!p.ok()) return error_reply(p.status());
  if (draining_.load()) return error_reply(Unavailable("the unit is draining"));
  EngineRequest r = std::move(p->request);
  const std::string id = r.id;
  r.hand_off = true;
  auto q = std::make_shared<OutputQueue>();
  if (Status st = engine_.submit(std::move(r), OutputQueue::callback(q)); !st.ok())
    return error_reply(st);
  PrefillReply reply;
  {
    std::unique_lock<std::mutex> lock(q->mu);
    if (!q->cv.wait_for(lock, options_.prefill_timeout, [&] { return q->finished; })) {
      lock.unlock();
      engine_.cancel(id);
      return error_reply(Unavailable(fmt::format("prefill of '{}' took longer than {} ms", id,
                                                 options_.prefill_timeout.count())));
    }
    for (RequestOutput& o : q->outputs) {
      for (GeneratedToken& t : o.tokens) reply.output.tokens.push_back(std::move(t));
      reply.output.prompt_tokens = o.prompt_tokens;
      reply.output.cached_prompt_tokens = o.cached_prompt_tokens;
      if (o.finished) {
        reply.output.finished = true;
        reply.output.finish_reason = o.finish_reason;
        reply.output.error = o.error;
        reply.output.handoff_at = o.handoff_at;
      }
    }
  }
  if (reply.output.finish_reason == FinishReason::kHandedOff) {
    if (reply.output.handoff_at.empty()) {
      return error_reply(Internal("the engine handed a request off without offering its KV"));
    }
    reply.transfer = reply.output.handoff_at;
    reply.handle = id;
  }
  return Reply{200, "application/json", to_json(reply).dump(), nullptr};
}

Reply PdUnit::decode(std::string_view body) {
  auto j = parse_json(body, "decode request");
  if (!j.ok()) return error_reply(j.status());
  auto p = pd_request_from_json(*j);
  if (!p.ok()) return error_reply(p.status());
  if (p->transfer.empty() || p->handle.empty()) {
    return error_reply(InvalidArgument("decode request: needs 'transfer' and 'handle'"));
  }
  if (draining_.load()) return error_reply(Unavailable("the unit is draining"));
  EngineRequest r = std::move(p->request);
  r.resume_from = p->transfer;
  r.resume_handle = p->handle;
  const std::string id = r.id;
  if (!r.idempotency_key.empty()) {  // kept for a router that attaches after this one died
    const std::string key = r.idempotency_key;
    auto k = std::make_shared<KeptStream>();
    k->engine_id = id;
    k->unread_since = Clock::now();
    size_t from = 0;
    if (p->before) {
      k->outputs.push_back(*p->before);
      k->outputs.back().finished = false;
      from = 1;  // (the router sending this has them)
    }
    if (Status st = engine_.submit(std::move(r), KeptStream::callback(k)); !st.ok()) {
      return error_reply(st);
    }
    {
      std::lock_guard<std::mutex> lock(kept_mu_);
      kept_[key] = k;
    }
    Reply reply;
    reply.content_type = "application/x-ndjson";
    reply.stream = std::make_shared<KeptReader>(std::move(k), from);
    return reply;
  }
  auto q = std::make_shared<OutputQueue>();
  if (Status st = engine_.submit(std::move(r), OutputQueue::callback(q)); !st.ok())
    return error_reply(st);
  Reply reply;
  reply.content_type = "application/x-ndjson";
  reply.stream = std::make_shared<DecodeStream>(engine_, id, std::move(q));
  return reply;
}

Status PdUnit::post(const std::string& router, const std::string& path, const std::string& body,
                    int* status, std::string* reply) {
  std::string host;
  int port = 0;
  RETURN_IF_ERROR(split_http_url(router, &host, &port));
  httplib::Client c(host, port);
  c.set_connection_timeout(1, 0);
  c.set_read_timeout(2, 0);
  c.set_write_timeout(2, 0);
  if (!options_.api_key.empty()) c.set_bearer_token_auth(options_.api_key);
  auto res = c.Post(path, body, "application/json");
  if (!res) {
    return Unavailable(fmt::format("the router at {} does not answer ({})", router,
                                   httplib::to_string(res.error())));
  }
  *status = res->status;
  if (reply) *reply = res->body;
  return Status::Ok();
}

void PdUnit::heartbeat_loop(const std::string& router) {
  bool registered = false;
  bool said_unreachable = false;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (!deregistered_) {
      lock.unlock();
      int status = 0;
      Status st;
      if (!registered) {
        std::string reply;
        st = post(router, "/pd/v1/register", to_json(info_).dump(), &status, &reply);
        registered = st.ok() && status == 200;
        if (st.ok() && status != 200 && !said_unreachable) {
          fmt::print(stderr, "serve: the router at {} refuses this unit (HTTP {}: {}); retrying\n",
                     router, status, reply);
          said_unreachable = true;
        }
        if (registered) {
          fmt::print(stderr, "serve: registered with the router at {} as a {} unit\n", router,
                     to_string(options_.role));
          said_unreachable = false;
        }
      } else {
        const EngineStats s = engine_.stats();
        UnitLoad l{info_.name,       s.running,         s.waiting,
                   s.kv_blocks_used, s.kv_blocks_total, transport_.server_stats().leases,
                   draining_.load()};
        st = post(router, "/pd/v1/heartbeat", to_json(l).dump(), &status);
        // A restarted router does not know the unit (404): register again.
        if (!st.ok() || status == 404) registered = false;
      }
      if (!st.ok() && !said_unreachable) {
        fmt::print(stderr, "serve: {}; retrying every {} ms\n", st.message(),
                   options_.heartbeat.count());
        said_unreachable = true;
      }
      lock.lock();
    }
    cv_.wait_for(lock, options_.heartbeat, [&] { return stop_; });
  }
}

void PdUnit::drain() {
  if (draining_.exchange(true)) return;
  if (options_.router_urls.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    deregistered_ = true;
  }
  for (const std::string& router : options_.router_urls) {
    int status = 0;
    (void)post(router, "/pd/v1/deregister", json{{"name", info_.name}}.dump(), &status);
  }
}

std::string PdUnit::metrics_text() {
  return transport_.metrics_text();
}

}  // namespace moeserve
