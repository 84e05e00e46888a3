#include "transfer/kv_transfer.h"

#include <cstring>

#include <fmt/format.h>
#include <xxhash.h>

namespace moeserve {

namespace {

// What a puller may send: PullMsg, DoneMsg, AbortMsg (a handle and a reason).
constexpr uint64_t kMaxControlBody = 1 << 20;
// A block is received in slices of this size, each hashed while it is in cache.
constexpr size_t kRecvSlice = size_t(1) << 20;

Status send_msg(UcxStream& s, const KvMessage& m, Clock::time_point deadline) {
  return s.send(encode(m), deadline);
}

Status send_abort(UcxStream& s, const Status& why, Clock::time_point deadline) {
  return send_msg(s, AbortMsg{uint64_t(why.code()), why.message()}, deadline);
}

Result<FrameHeader> recv_header(UcxStream& s, uint64_t max_body, Clock::time_point deadline) {
  FrameHeader h;
  RETURN_IF_ERROR(s.recv({reinterpret_cast<uint8_t*>(&h), sizeof(h)}, deadline));
  RETURN_IF_ERROR(check_header(h, max_body));
  return h;
}

Result<KvMessage> recv_msg(UcxStream& s, uint64_t max_body, Clock::time_point deadline) {
  auto h = recv_header(s, max_body, deadline);
  if (!h.ok()) return h.status();
  std::vector<uint8_t> body(h->length);
  RETURN_IF_ERROR(s.recv(body, deadline));
  return decode(*h, body);
}

Status abort_status(const AbortMsg& a, const std::string& peer) {
  return Status(StatusCode(a.code), fmt::format("the unit at {} says: {}", peer, a.reason));
}

}  // namespace

Status split_address(const std::string& address, std::string* host, uint16_t* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return InvalidArgument(fmt::format("'{}' is not host:port", address));
  }
  std::string h = address.substr(0, colon);
  if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  const std::string p = address.substr(colon + 1);
  char* end = nullptr;
  const long v = std::strtol(p.c_str(), &end, 10);
  if (*end != '\0' || v <= 0 || v > 65535) {
    return InvalidArgument(fmt::format("'{}' has no valid port", address));
  }
  *host = std::move(h);
  *port = uint16_t(v);
  return Status::Ok();
}

// ---- the server ----

Result<std::unique_ptr<KvTransferServer>> KvTransferServer::start(std::shared_ptr<UcxContext> ctx,
                                                                  const KvTransferOptions& o) {
  std::unique_ptr<KvTransferServer> s(new KvTransferServer(ctx, o));
  auto l = UcxListener::listen(ctx, o.host, o.port, [p = s.get()](std::unique_ptr<UcxStream> c) {
    p->accept(std::move(c));
  });
  if (!l.ok()) return l.status();
  s->listener_ = std::move(*l);
  return s;
}

KvTransferServer::~KvTransferServer() {
  stop_.store(true);
  listener_.reset();  // no new connections
  std::lock_guard<std::mutex> lock(conn_mu_);
  for (Connection& c : connections_) c.thread.join();
}

std::string KvTransferServer::address() const {
  return fmt::format("{}:{}", options_.host, listener_->port());
}

void KvTransferServer::erase_locked(std::unordered_map<std::string, Lease>::iterator it,
                                    int64_t KvTransferStats::*counter) {
  const int64_t bytes = int64_t(it->second.bytes);
  if (it->second.pulled) {
    stats_.retained_bytes -= bytes;
    --stats_.retained;
  } else {
    stats_.leased_bytes -= bytes;
    --stats_.leases;
  }
  leases_.erase(it);
  ++(stats_.*counter);
}

void KvTransferServer::expire_locked(Clock::time_point now) {
  for (auto it = leases_.begin(); it != leases_.end();) {
    auto next = std::next(it);
    if (it->second.expires <= now) {
      erase_locked(it, it->second.pulled ? &KvTransferStats::evicted : &KvTransferStats::expired);
    }
    it = next;
  }
}

Status KvTransferServer::offer(const std::string& handle, std::shared_ptr<const KvHandoff> h) {
  uint64_t bytes = 0;
  for (const auto& b : h->blocks) bytes += b.size();
  auto held = std::make_shared<Held>();
  held->checksums.reserve(h->blocks.size());
  for (const auto& b : h->blocks) held->checksums.push_back(XXH3_64bits(b.data(), b.size()));
  held->handoff = std::move(h);
  std::lock_guard<std::mutex> lock(mu_);
  expire_locked(Clock::now());
  if (leases_.count(handle)) {
    return InvalidArgument(fmt::format("a hand-off named '{}' is already held", handle));
  }
  if (uint64_t(stats_.leased_bytes) + bytes > options_.max_lease_bytes) {
    ++stats_.refused;
    return ResourceExhausted(
        fmt::format("hand-offs held ({} bytes) + this one ({}) exceed the limit ({} bytes)",
                    stats_.leased_bytes, bytes, options_.max_lease_bytes));
  }
  // Room from the retained ones, those closest to the end of their retention first.
  while (uint64_t(stats_.leased_bytes + stats_.retained_bytes) + bytes > options_.max_lease_bytes) {
    auto oldest = leases_.end();
    for (auto it = leases_.begin(); it != leases_.end(); ++it) {
      if (it->second.pulled &&
          (oldest == leases_.end() || it->second.expires < oldest->second.expires)) {
        oldest = it;
      }
    }
    erase_locked(oldest, &KvTransferStats::evicted);  // (one exists: leased alone fit above)
  }
  leases_[handle] = Lease{std::move(held), Clock::now() + options_.lease, bytes};
  stats_.leased_bytes += int64_t(bytes);
  ++stats_.leases;
  ++stats_.offered;
  return Status::Ok();
}

void KvTransferServer::withdraw(const std::string& handle) {
  erase(handle, &KvTransferStats::withdrawn);
}

void KvTransferServer::release(const std::string& handle) {
  erase(handle, &KvTransferStats::released);
}

void KvTransferServer::erase(const std::string& handle, int64_t KvTransferStats::*counter) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = leases_.find(handle);
  if (it != leases_.end()) erase_locked(it, counter);
}

// A puller has every block: the lease ends and the retention begins (or, without retention,
// the hand-off goes).
void KvTransferServer::pulled(const std::string& handle) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = leases_.find(handle);
  if (it == leases_.end()) return;
  if (options_.retain.count() <= 0) {
    erase_locked(it, &KvTransferStats::completed);
    return;
  }
  ++stats_.completed;
  Lease& l = it->second;
  if (!l.pulled) {
    l.pulled = true;
    stats_.leased_bytes -= int64_t(l.bytes);
    --stats_.leases;
    stats_.retained_bytes += int64_t(l.bytes);
    ++stats_.retained;
  }
  l.expires = Clock::now() + options_.retain;
}

std::shared_ptr<const KvTransferServer::Held> KvTransferServer::find(const std::string& handle) {
  std::lock_guard<std::mutex> lock(mu_);
  expire_locked(Clock::now());
  auto it = leases_.find(handle);
  return it == leases_.end() ? nullptr : it->second.held;
}

KvTransferStats KvTransferServer::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  expire_locked(Clock::now());
  return stats_;
}

void KvTransferServer::accept(std::unique_ptr<UcxStream> s) {
  std::lock_guard<std::mutex> lock(conn_mu_);
  for (auto it = connections_.begin(); it != connections_.end();) {  // reap the finished
    if (it->done.load()) {
      it->thread.join();
      it = connections_.erase(it);
    } else {
      ++it;
    }
  }
  if (stop_.load()) return;
  Connection& c = connections_.emplace_back();
  c.thread = std::thread([this, &c, stream = std::shared_ptr<UcxStream>(std::move(s))] {
    stream->set_stop_flag(&stop_);
    serve(*stream);
    c.done.store(true);
  });
}

// One connection: pull requests until the puller is done, aborts, goes away or is silent for
// io_timeout.
void KvTransferServer::serve(UcxStream& s) {
  std::string handle;  // of the last pull on this connection
  auto reject = [&](const Status& why, Clock::time_point deadline) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.frames_rejected;
    }
    (void)send_abort(s, why, deadline);
  };
  while (!stop_.load()) {
    const auto deadline = Clock::now() + options_.io_timeout;
    auto m = recv_msg(s, kMaxControlBody, deadline);
    if (!m.ok()) {
      if (!s.failed()) reject(m.status(), deadline);  // a bad frame, not a lost or silent peer
      return;
    }
    if (auto* pull = std::get_if<PullMsg>(&*m)) {
      handle = pull->handle;
      if (!serve_pull(s, *pull).ok()) return;
    } else if (std::holds_alternative<DoneMsg>(*m) && !handle.empty()) {
      pulled(handle);
      (void)send_msg(s, DoneMsg{}, deadline);
      return;
    } else if (auto* rel = std::get_if<ReleaseMsg>(&*m); rel && handle.empty()) {
      release(rel->handle);
      (void)send_msg(s, DoneMsg{}, deadline);
      return;
    } else if (std::holds_alternative<AbortMsg>(*m)) {
      if (!handle.empty()) erase(handle, &KvTransferStats::withdrawn);
      return;
    } else {
      reject(InvalidArgument("a puller sends a pull first, then done or abort (or a release "
                             "alone)"),
             deadline);
      return;
    }
  }
}

// The header, then blocks from_block on; the lease stays until the puller's DoneMsg.
Status KvTransferServer::serve_pull(UcxStream& s, const PullMsg& pull) {
  const auto deadline = Clock::now() + options_.io_timeout;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.pulls;
  }
  std::shared_ptr<const Held> held = find(pull.handle);
  const KvHandoff* h = held ? held->handoff.get() : nullptr;
  Status refused;
  if (!h) {
    refused = NotFound(fmt::format(
        "no hand-off '{}' here (never made, already taken, or its lease of {} ms ran out)",
        pull.handle, options_.lease.count()));
  } else if (h->fingerprint != pull.fingerprint) {
    refused = InvalidArgument(fmt::format(
        "hand-off '{}' holds KV of another model or format (fingerprint {:016x}, the puller's "
        "{:016x})",
        pull.handle, h->fingerprint, pull.fingerprint));
  } else if (pull.from_block > h->blocks.size()) {
    refused = InvalidArgument(fmt::format("hand-off '{}' has {} blocks, not {}", pull.handle,
                                          h->blocks.size(), pull.from_block));
  }
  if (!refused.ok()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.pull_errors;
    }
    (void)send_abort(s, refused, deadline);
    return refused;
  }
  HeaderMsg head{h->fingerprint, h->block_bytes, uint64_t(h->blocks.size()),
                 h->n_prompt,    h->n_computed,  h->n_cached_prompt,
                 h->tokens,      h->rng_state};
  RETURN_IF_ERROR(send_msg(s, head, deadline));
  for (uint64_t b = pull.from_block; b < h->blocks.size(); ++b) {
    const KvBytes& bytes = h->blocks[b];
    FrameHeader fh;
    fh.type = uint16_t(MsgType::kBlock);
    fh.length = bytes.size();
    fh.seq = b;
    fh.checksum = held->checksums[b];
    const std::span<const uint8_t> parts[] = {{reinterpret_cast<const uint8_t*>(&fh), sizeof(fh)},
                                              bytes};
    RETURN_IF_ERROR(s.send(parts, Clock::now() + options_.io_timeout));
    std::lock_guard<std::mutex> lock(mu_);
    stats_.bytes_sent += int64_t(bytes.size());
  }
  return Status::Ok();
}

// ---- the puller ----

namespace {

// One connection's attempt: the header (checked against what an earlier attempt got), then the
// blocks from out->blocks.size() on, each verified before it is kept.
Status pull_once(UcxStream& s, const std::string& handle, uint64_t fingerprint,
                 const PullOptions& o, Clock::time_point end, bool* have_header, KvHandoff* out,
                 PullStats* stats) {
  auto frame_deadline = [&] { return std::min(end, Clock::now() + o.io_timeout); };
  const uint64_t from = out->blocks.size();
  if (stats) stats->resumed_from = from;
  RETURN_IF_ERROR(send_msg(s, PullMsg{handle, fingerprint, from}, frame_deadline()));
  auto m = recv_msg(s, kKvWireMaxBody, frame_deadline());
  if (!m.ok()) return m.status();
  if (auto* a = std::get_if<AbortMsg>(&*m)) return abort_status(*a, s.peer());
  auto* head = std::get_if<HeaderMsg>(&*m);
  if (!head)
    return InvalidArgument(fmt::format("the unit at {} answered a pull with no header", s.peer()));
  if (head->fingerprint != fingerprint || head->n_blocks > kKvWireMaxBody ||
      head->block_bytes > kKvWireMaxBody) {
    return InvalidArgument(
        fmt::format("the unit at {} sent a header that does not fit the pull", s.peer()));
  }
  if (*have_header) {  // a resumption: the same hand-off
    if (head->tokens != out->tokens || head->n_blocks < from ||
        head->block_bytes != out->block_bytes) {
      return InvalidArgument(fmt::format("the unit at {} changed hand-off '{}' between connections",
                                         s.peer(), handle));
    }
  } else {
    out->fingerprint = head->fingerprint;
    out->block_bytes = head->block_bytes;
    out->tokens = std::move(head->tokens);
    out->n_prompt = head->n_prompt;
    out->n_computed = head->n_computed;
    out->n_cached_prompt = head->n_cached_prompt;
    out->rng_state = std::move(head->rng_state);
    out->blocks.reserve(head->n_blocks);
    *have_header = true;
  }
  std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> hash_state(XXH3_createState(),
                                                                             XXH3_freeState);
  for (uint64_t b = from; b < head->n_blocks; ++b) {
    auto fh = recv_header(s, kKvWireMaxBody, frame_deadline());
    if (!fh.ok()) return fh.status();
    if (fh->type == uint16_t(MsgType::kAbort)) {
      std::vector<uint8_t> body(fh->length);
      RETURN_IF_ERROR(s.recv(body, frame_deadline()));
      auto a = decode(*fh, body);
      if (a.ok()) return abort_status(std::get<AbortMsg>(*a), s.peer());
      return a.status();
    }
    // (A block may be shorter: its main region alone, KvHandoff::blocks; the engine checks.)
    if (fh->type != uint16_t(MsgType::kBlock) || fh->seq != b || fh->length > out->block_bytes) {
      return InvalidArgument(
          fmt::format("the unit at {} sent frame type {} seq {} ({} bytes) for block {}", s.peer(),
                      fh->type, fh->seq, fh->length, b));
    }
    // Received in slices, each hashed while it is still in cache.
    KvBytes body(fh->length);
    XXH3_state_t* state = hash_state.get();
    XXH3_64bits_reset(state);
    for (size_t off = 0; off < body.size(); off += kRecvSlice) {
      const size_t n = std::min(kRecvSlice, body.size() - off);
      RETURN_IF_ERROR(s.recv({body.data() + off, n}, frame_deadline()));
      XXH3_64bits_update(state, body.data() + off, n);
    }
    if (XXH3_64bits_digest(state) != fh->checksum) {
      if (stats) ++stats->corrupt_frames;
      return Corrupt(
          fmt::format("block {} of hand-off '{}' from {} fails its checksum", b, handle, s.peer()));
    }
    if (stats) stats->bytes += int64_t(body.size());
    out->blocks.push_back(std::move(body));
  }
  RETURN_IF_ERROR(send_msg(s, DoneMsg{}, frame_deadline()));
  auto done = recv_msg(s, kMaxControlBody, frame_deadline());
  if (!done.ok()) return done.status();
  if (auto* a = std::get_if<AbortMsg>(&*done)) return abort_status(*a, s.peer());
  if (!std::holds_alternative<DoneMsg>(*done)) {
    return InvalidArgument(fmt::format("the unit at {} did not acknowledge the pull", s.peer()));
  }
  return Status::Ok();
}

}  // namespace

Status release_kv(std::shared_ptr<UcxContext> ctx, const std::string& address,
                  const std::string& handle, std::chrono::milliseconds timeout) {
  std::string host;
  uint16_t port = 0;
  RETURN_IF_ERROR(split_address(address, &host, &port));
  const auto deadline = Clock::now() + timeout;
  auto s = UcxStream::connect(ctx, host, port);
  if (!s.ok()) return s.status();
  RETURN_IF_ERROR(send_msg(**s, ReleaseMsg{handle}, deadline));
  auto m = recv_msg(**s, kMaxControlBody, deadline);
  if (!m.ok()) return m.status();
  if (auto* a = std::get_if<AbortMsg>(&*m)) return abort_status(*a, (*s)->peer());
  if (!std::holds_alternative<DoneMsg>(*m)) {
    return InvalidArgument(
        fmt::format("the unit at {} did not acknowledge the release of '{}'", address, handle));
  }
  return Status::Ok();
}

namespace {

// Worth another connection: the peer went away or was silent, or a block was damaged on the way.
bool retriable(const Status& st) {
  return st.code() == StatusCode::kUnavailable || st.code() == StatusCode::kCorrupt;
}

}  // namespace

Result<std::shared_ptr<KvHandoff>> pull_kv(std::shared_ptr<UcxContext> ctx,
                                           const std::string& address, const std::string& handle,
                                           uint64_t fingerprint, const PullOptions& o,
                                           PullStats* stats) {
  std::string host;
  uint16_t port = 0;
  RETURN_IF_ERROR(split_address(address, &host, &port));
  const auto end = Clock::now() + o.timeout;
  auto out = std::make_shared<KvHandoff>();
  bool have_header = false;
  Status last;
  for (int attempt = 0; attempt < o.max_attempts && Clock::now() < end; ++attempt) {
    if (stats) stats->attempts = attempt + 1;
    if (o.stop && o.stop->load())
      return Unavailable(fmt::format("pulling hand-off '{}': stopping", handle));
    auto s = UcxStream::connect(ctx, host, port);
    if (!s.ok()) return s.status();
    (*s)->set_stop_flag(o.stop);
    last = pull_once(**s, handle, fingerprint, o, end, &have_header, out.get(), stats);
    if (last.ok()) return out;
    if (!retriable(last)) return last;
    if (attempt + 1 < o.max_attempts) {  // a short pause before reconnecting
      std::this_thread::sleep_for(std::chrono::milliseconds(20 << attempt));
    }
  }
  return Unavailable(fmt::format("pulling hand-off '{}' from {}: gave up after {} attempt(s): {}",
                                 handle, address, stats ? stats->attempts : o.max_attempts,
                                 last.message()));
}

}  // namespace moeserve
