// KV transfer over UCX (docs/pd.md): a hand-off pulled from a KvTransferServer arrives bit for
// bit; every bad input at the boundary (malformed, oversized or corrupt frames, unknown handles,
// another fingerprint, expired leases) gives a clear error and leaves other transfers alone; a
// damaged block or a dropped connection resumes at the first block not verified; a silent or
// absent peer fails within the stated timeouts.
#include "transfer/kv_transfer.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <thread>

#include <fmt/format.h>

namespace moeserve {
namespace {

using namespace std::chrono_literals;

std::shared_ptr<UcxContext> context() {
  static auto ctx = [] {
    auto c = UcxContext::create();
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    return c.ok() ? *c : nullptr;
  }();
  return ctx;
}

std::shared_ptr<KvHandoff> handoff(int n_blocks, uint64_t block_bytes = 4096, uint64_t seed = 1) {
  auto h = std::make_shared<KvHandoff>();
  h->fingerprint = 0xfeedbeef;
  h->block_bytes = block_bytes;
  h->n_prompt = n_blocks * 64 - 10;
  h->n_computed = h->n_prompt;
  h->n_cached_prompt = 64;
  std::mt19937_64 rng(seed);
  for (int64_t i = 0; i < h->n_prompt + 1; ++i) h->tokens.push_back(int32_t(rng() % 129280));
  for (int b = 0; b < n_blocks; ++b) {
    KvBytes bytes(block_bytes);
    for (auto& x : bytes) x = uint8_t(rng());
    h->blocks.push_back(std::move(bytes));
  }
  std::ostringstream st;
  st << rng;
  h->rng_state = st.str();
  return h;
}

std::string name(int i) {
  return fmt::format("c{}", i);
}

std::unique_ptr<KvTransferServer> server(KvTransferOptions o = {}) {
  auto s = KvTransferServer::start(context(), o);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return s.ok() ? std::move(*s) : nullptr;
}

TEST(KvTransfer, PulledHandoffEqualsOfferedIsRetainedForFailoverUntilReleased) {
  auto srv = server();
  ASSERT_TRUE(srv);
  auto h = handoff(5, 64 * 1024);
  ASSERT_TRUE(srv->offer("req-1", h).ok());
  EXPECT_EQ(srv->stats().leases, 1);
  PullStats ps;
  auto got = pull_kv(context(), srv->address(), "req-1", h->fingerprint, {}, &ps);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(**got, *h);
  EXPECT_EQ(ps.attempts, 1);
  EXPECT_EQ(ps.bytes, 5 * 64 * 1024);
  KvTransferStats st = srv->stats();
  EXPECT_EQ(st.completed, 1);
  EXPECT_EQ(st.leases, 0);  // the lease ended: a leaving unit does not wait for it
  EXPECT_EQ(st.leased_bytes, 0);
  EXPECT_EQ(st.retained, 1);
  EXPECT_EQ(st.retained_bytes, 5 * 64 * 1024);
  EXPECT_EQ(st.bytes_sent, 5 * 64 * 1024);
  // A second decode unit (the first was lost) pulls the same bytes again.
  auto again = pull_kv(context(), srv->address(), "req-1", h->fingerprint);
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(**again, *h);
  EXPECT_EQ(srv->stats().completed, 2);
  EXPECT_EQ(srv->stats().retained, 1);
  // The request ended: released, it is gone; releasing it again (or an unknown one) is fine.
  ASSERT_TRUE(release_kv(context(), srv->address(), "req-1").ok());
  ASSERT_TRUE(release_kv(context(), srv->address(), "req-1").ok());
  st = srv->stats();
  EXPECT_EQ(st.released, 1);
  EXPECT_EQ(st.retained, 0);
  EXPECT_EQ(st.retained_bytes, 0);
  auto gone = pull_kv(context(), srv->address(), "req-1", h->fingerprint);
  EXPECT_EQ(gone.status().code(), StatusCode::kNotFound) << gone.status().to_string();
  // An unpulled one can be released too (a request cancelled before its decode).
  ASSERT_TRUE(srv->offer("req-2", h).ok());
  ASSERT_TRUE(release_kv(context(), srv->address(), "req-2").ok());
  EXPECT_EQ(srv->stats().leases, 0);
  EXPECT_EQ(srv->stats().released, 2);
  // A release to no server fails, naming nothing worse than the address.
  EXPECT_FALSE(release_kv(context(), "127.0.0.1:1", "req-1", 300ms).ok());
}

TEST(KvTransfer, WithoutRetentionAPulledHandoffIsGone) {
  KvTransferOptions o;
  o.retain = 0ms;
  auto srv = server(o);
  ASSERT_TRUE(srv);
  auto h = handoff(2);
  ASSERT_TRUE(srv->offer("r", h).ok());
  ASSERT_TRUE(pull_kv(context(), srv->address(), "r", h->fingerprint).ok());
  EXPECT_EQ(srv->stats().retained, 0);
  auto again = pull_kv(context(), srv->address(), "r", h->fingerprint);
  EXPECT_EQ(again.status().code(), StatusCode::kNotFound) << again.status().to_string();
}

TEST(KvTransfer, RetainedHandoffsMakeRoomOldestFirstAndRunOut) {
  KvTransferOptions o;
  o.max_lease_bytes = 3 * 4096;
  o.retain = 300ms;
  auto srv = server(o);
  ASSERT_TRUE(srv);
  auto a = handoff(1), b = handoff(1);
  ASSERT_TRUE(srv->offer("a", a).ok());
  ASSERT_TRUE(pull_kv(context(), srv->address(), "a", a->fingerprint).ok());
  std::this_thread::sleep_for(5ms);
  ASSERT_TRUE(srv->offer("b", b).ok());
  ASSERT_TRUE(pull_kv(context(), srv->address(), "b", b->fingerprint).ok());
  EXPECT_EQ(srv->stats().retained, 2);
  // Two blocks more: only one retained block has to go, the older ("a").
  ASSERT_TRUE(srv->offer("c", handoff(2)).ok());
  KvTransferStats st = srv->stats();
  EXPECT_EQ(st.evicted, 1);
  EXPECT_EQ(st.retained, 1);
  EXPECT_EQ(pull_kv(context(), srv->address(), "a", a->fingerprint).status().code(),
            StatusCode::kNotFound);
  EXPECT_TRUE(pull_kv(context(), srv->address(), "b", b->fingerprint).ok());
  // Leased bytes are never dropped for room: one block more than the unpulled ones leave.
  EXPECT_EQ(srv->offer("d", handoff(2)).code(), StatusCode::kResourceExhausted);
  // The retention runs out.
  std::this_thread::sleep_for(350ms);
  st = srv->stats();
  EXPECT_EQ(st.retained, 0);
  EXPECT_EQ(st.retained_bytes, 0);
  EXPECT_EQ(st.evicted, 2);
}

TEST(KvTransfer, ZeroBlocksAndManyConcurrentPulls) {
  auto srv = server();
  ASSERT_TRUE(srv);
  auto empty = handoff(0);
  empty->n_prompt = 3;
  empty->n_computed = 0;
  empty->tokens = {1, 2, 3, 4};
  ASSERT_TRUE(srv->offer("empty", empty).ok());
  auto got = pull_kv(context(), srv->address(), "empty", empty->fingerprint);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(**got, *empty);

  std::vector<std::shared_ptr<KvHandoff>> hs;
  for (int i = 0; i < 6; ++i) {
    hs.push_back(handoff(1 + i, 8192, 10 + i));
    ASSERT_TRUE(srv->offer(name(int(i)), hs.back()).ok());
  }
  std::vector<std::thread> ts;
  std::vector<Result<std::shared_ptr<KvHandoff>>> rs(hs.size(),
                                                     Status(StatusCode::kInternal, "unset"));
  for (size_t i = 0; i < hs.size(); ++i) {
    ts.emplace_back(
        [&, i] { rs[i] = pull_kv(context(), srv->address(), name(int(i)), hs[i]->fingerprint); });
  }
  for (auto& t : ts) t.join();
  for (size_t i = 0; i < hs.size(); ++i) {
    ASSERT_TRUE(rs[i].ok()) << i << ": " << rs[i].status().to_string();
    EXPECT_EQ(**rs[i], *hs[i]);
  }
}

TEST(KvTransfer, UnknownHandleAndOtherFingerprintAreRefusedAndTheLeaseStays) {
  auto srv = server();
  ASSERT_TRUE(srv);
  auto h = handoff(2);
  ASSERT_TRUE(srv->offer("r", h).ok());
  auto unknown = pull_kv(context(), srv->address(), "nope", h->fingerprint);
  EXPECT_EQ(unknown.status().code(), StatusCode::kNotFound);
  EXPECT_NE(unknown.status().message().find("'nope'"), std::string::npos)
      << unknown.status().message();
  EXPECT_NE(unknown.status().message().find(srv->address()), std::string::npos);
  auto other = pull_kv(context(), srv->address(), "r", h->fingerprint + 1);
  EXPECT_EQ(other.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(other.status().message().find("fingerprint"), std::string::npos);
  auto good = pull_kv(context(), srv->address(), "r", h->fingerprint);
  ASSERT_TRUE(good.ok()) << good.status().to_string();
  EXPECT_EQ(**good, *h);
  EXPECT_EQ(srv->stats().pull_errors, 2);
  EXPECT_EQ(srv->offer("x", h).code(), StatusCode::kOk);
  EXPECT_EQ(srv->offer("x", h).code(), StatusCode::kInvalidArgument);  // name in use
}

TEST(KvTransfer, LeasesRunOutAndBoundTheBytesHeld) {
  KvTransferOptions o;
  o.lease = 100ms;
  o.max_lease_bytes = 3 * 4096;
  auto srv = server(o);
  ASSERT_TRUE(srv);
  ASSERT_TRUE(srv->offer("a", handoff(2)).ok());
  EXPECT_EQ(srv->offer("b", handoff(2)).code(), StatusCode::kResourceExhausted);
  std::this_thread::sleep_for(150ms);
  auto late = pull_kv(context(), srv->address(), "a", 0xfeedbeef);
  EXPECT_EQ(late.status().code(), StatusCode::kNotFound);
  const KvTransferStats st = srv->stats();
  EXPECT_EQ(st.expired, 1);
  EXPECT_EQ(st.refused, 1);
  EXPECT_EQ(st.leased_bytes, 0);
  EXPECT_TRUE(srv->offer("b", handoff(2)).ok());  // room again
  srv->withdraw("b");
  EXPECT_EQ(srv->stats().withdrawn, 1);
}

// A raw client: bytes of its own choosing, then what the server answers.
struct RawClient {
  std::unique_ptr<UcxStream> s;
  explicit RawClient(const std::string& address) {
    std::string host;
    uint16_t port = 0;
    EXPECT_TRUE(split_address(address, &host, &port).ok());
    auto c = UcxStream::connect(context(), host, port);
    EXPECT_TRUE(c.ok());
    s = std::move(*c);
  }
  Status send(const std::vector<uint8_t>& bytes) { return s->send(bytes, Clock::now() + 5s); }
  Result<KvMessage> recv() {
    FrameHeader h;
    RETURN_IF_ERROR(s->recv({reinterpret_cast<uint8_t*>(&h), sizeof(h)}, Clock::now() + 5s));
    RETURN_IF_ERROR(check_header(h, kKvWireMaxBody));
    std::vector<uint8_t> body(h.length);
    RETURN_IF_ERROR(s->recv(body, Clock::now() + 5s));
    return decode(h, body);
  }
};

void expect_abort(RawClient& c, const std::string& says) {
  auto m = c.recv();
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  auto* a = std::get_if<AbortMsg>(&*m);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(StatusCode(a->code), StatusCode::kInvalidArgument);
  EXPECT_NE(a->reason.find(says), std::string::npos) << a->reason;
}

TEST(KvTransfer, MalformedOversizedAndCorruptFramesAreRejectedAndHarmNoOtherPull) {
  auto srv = server();
  ASSERT_TRUE(srv);
  auto h = handoff(3);
  ASSERT_TRUE(srv->offer("keep", h).ok());
  {
    RawClient c(srv->address());
    std::vector<uint8_t> junk(32, 0xab);
    ASSERT_TRUE(c.send(junk).ok());
    expect_abort(c, "magic");
  }
  {
    RawClient c(srv->address());
    FrameHeader fh = frame_header(MsgType::kPull, {});
    fh.length = uint64_t(100) << 20;
    std::vector<uint8_t> frame(sizeof(fh));
    std::memcpy(frame.data(), &fh, sizeof(fh));
    ASSERT_TRUE(c.send(frame).ok());
    expect_abort(c, "allowed");
  }
  {
    RawClient c(srv->address());
    std::vector<uint8_t> frame = encode(PullMsg{"keep", h->fingerprint, 0});
    frame.back() ^= 1;  // the body no longer matches its checksum
    ASSERT_TRUE(c.send(frame).ok());
    auto m = c.recv();
    ASSERT_TRUE(m.ok());
    ASSERT_TRUE(std::holds_alternative<AbortMsg>(*m));
    EXPECT_EQ(StatusCode(std::get<AbortMsg>(*m).code), StatusCode::kCorrupt);
  }
  {
    RawClient c(srv->address());
    FrameHeader fh = frame_header(MsgType::kPull, {});
    fh.version = 9;
    std::vector<uint8_t> frame(sizeof(fh));
    std::memcpy(frame.data(), &fh, sizeof(fh));
    ASSERT_TRUE(c.send(frame).ok());
    expect_abort(c, "version");
  }
  {
    RawClient c(srv->address());  // a structurally malformed pull (its handle overruns the body)
    std::vector<uint8_t> body(16, 0xff);
    const FrameHeader fh = frame_header(MsgType::kPull, body);
    std::vector<uint8_t> frame(sizeof(fh) + body.size());
    std::memcpy(frame.data(), &fh, sizeof(fh));
    std::memcpy(frame.data() + sizeof(fh), body.data(), body.size());
    ASSERT_TRUE(c.send(frame).ok());
    expect_abort(c, "malformed");
  }
  {
    RawClient c(srv->address());  // a block sent by a puller
    ASSERT_TRUE(c.send(encode(BlockMsg{0, {1, 2, 3}})).ok());
    expect_abort(c, "pull first");
  }
  EXPECT_EQ(srv->stats().frames_rejected, 6);
  auto good = pull_kv(context(), srv->address(), "keep", h->fingerprint);
  ASSERT_TRUE(good.ok()) << good.status().to_string();
  EXPECT_EQ(**good, *h);
}

TEST(KvTransfer, PullerAbortWithdrawsTheLeaseAndResumptionServesTheRest) {
  auto srv = server();
  ASSERT_TRUE(srv);
  auto h = handoff(4);
  ASSERT_TRUE(srv->offer("r", h).ok());
  {
    RawClient c(srv->address());  // resume at block 2: the header, then blocks 2 and 3 only
    ASSERT_TRUE(c.send(encode(PullMsg{"r", h->fingerprint, 2})).ok());
    auto head = c.recv();
    ASSERT_TRUE(head.ok());
    ASSERT_TRUE(std::holds_alternative<HeaderMsg>(*head));
    EXPECT_EQ(std::get<HeaderMsg>(*head).n_blocks, 4u);
    for (uint64_t b : {2u, 3u}) {
      auto m = c.recv();
      ASSERT_TRUE(m.ok());
      ASSERT_TRUE(std::holds_alternative<BlockMsg>(*m));
      EXPECT_EQ(std::get<BlockMsg>(*m).index, b);
      const std::vector<uint8_t>& got = std::get<BlockMsg>(*m).bytes;
      EXPECT_TRUE(std::equal(got.begin(), got.end(), h->blocks[b].begin(), h->blocks[b].end()));
    }
    ASSERT_TRUE(c.send(encode(AbortMsg{uint64_t(StatusCode::kUnavailable), "cancelled"})).ok());
  }
  for (int i = 0; i < 100 && srv->stats().leases > 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(srv->stats().leases, 0);
  EXPECT_EQ(srv->stats().withdrawn, 1);
}

// A misbehaving prefill unit: for connection i, fault(i, stream, pull) serves as it likes.
struct FakeUnit {
  std::unique_ptr<UcxListener> listener;
  std::vector<std::thread> threads;
  std::atomic<int> connections{0};
  std::vector<uint64_t> from_blocks;
  std::mutex mu;

  template <typename Serve>
  explicit FakeUnit(Serve serve) {
    auto l =
        UcxListener::listen(context(), "127.0.0.1", 0, [this, serve](std::unique_ptr<UcxStream> s) {
          const int i = connections++;
          threads.emplace_back([this, serve, i, st = std::shared_ptr<UcxStream>(std::move(s))] {
            serve(i, *st, this);
          });
        });
    EXPECT_TRUE(l.ok()) << l.status().to_string();
    listener = std::move(*l);
  }
  ~FakeUnit() {
    listener.reset();
    for (auto& t : threads) t.join();
  }
  std::string address() const { return fmt::format("127.0.0.1:{}", listener->port()); }

  // Reads the pull (recording from_block).
  std::optional<PullMsg> read_pull(UcxStream& s) {
    FrameHeader h;
    if (!s.recv({reinterpret_cast<uint8_t*>(&h), sizeof(h)}, Clock::now() + 5s).ok()) return {};
    std::vector<uint8_t> body(h.length);
    if (!s.recv(body, Clock::now() + 5s).ok()) return {};
    auto m = decode(h, body);
    if (!m.ok() || !std::holds_alternative<PullMsg>(*m)) return {};
    std::lock_guard<std::mutex> lock(mu);
    from_blocks.push_back(std::get<PullMsg>(*m).from_block);
    return std::get<PullMsg>(*m);
  }
};

void send_header(UcxStream& s, const KvHandoff& h) {
  HeaderMsg m{h.fingerprint, h.block_bytes,     h.blocks.size(), h.n_prompt,
              h.n_computed,  h.n_cached_prompt, h.tokens,        h.rng_state};
  ASSERT_TRUE(s.send(encode(m), Clock::now() + 5s).ok());
}

void send_block(UcxStream& s, const KvHandoff& h, uint64_t b, bool corrupt = false) {
  std::vector<uint8_t> frame =
      encode(BlockMsg{b, std::vector<uint8_t>(h.blocks[b].begin(), h.blocks[b].end())});
  if (corrupt) frame.back() ^= 0x40;
  ASSERT_TRUE(s.send(frame, Clock::now() + 5s).ok());
}

void finish(UcxStream& s) {  // the puller's done, then ours
  FrameHeader fh;
  if (!s.recv({reinterpret_cast<uint8_t*>(&fh), sizeof(fh)}, Clock::now() + 5s).ok()) return;
  std::vector<uint8_t> body(fh.length);
  (void)s.recv(body, Clock::now() + 5s);
  (void)s.send(encode(DoneMsg{}), Clock::now() + 5s);
}

TEST(KvTransfer, ACorruptBlockIsFetchedAgainFromWhereTheVerifiedOnesEnd) {
  auto h = handoff(4);
  FakeUnit unit([&](int i, UcxStream& s, FakeUnit* u) {
    auto pull = u->read_pull(s);
    if (!pull) return;
    send_header(s, *h);
    for (uint64_t b = pull->from_block; b < h->blocks.size(); ++b) {
      send_block(s, *h, b, /*corrupt=*/i == 0 && b == 2);
    }
    finish(s);
  });
  PullStats ps;
  auto got = pull_kv(context(), unit.address(), "r", h->fingerprint, {}, &ps);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(**got, *h);
  EXPECT_EQ(ps.attempts, 2);
  EXPECT_EQ(ps.corrupt_frames, 1);
  EXPECT_EQ(unit.from_blocks, (std::vector<uint64_t>{0, 2}));
}

TEST(KvTransfer, ADroppedConnectionResumesAtTheFirstMissingBlock) {
  auto h = handoff(5);
  FakeUnit unit([&](int i, UcxStream& s, FakeUnit* u) {
    auto pull = u->read_pull(s);
    if (!pull) return;
    send_header(s, *h);
    for (uint64_t b = pull->from_block; b < h->blocks.size(); ++b) {
      if (i == 0 && b == 3) return;  // the connection drops (the stream closes)
      send_block(s, *h, b);
    }
    finish(s);
  });
  PullStats ps;
  auto got = pull_kv(context(), unit.address(), "r", h->fingerprint, {}, &ps);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(**got, *h);
  EXPECT_EQ(ps.attempts, 2);
  EXPECT_EQ(ps.resumed_from, 3u);
  EXPECT_EQ(unit.from_blocks, (std::vector<uint64_t>{0, 3}));
}

TEST(KvTransfer, ASilentUnitTimesOutAndAnAbsentOneFailsFast) {
  std::atomic<bool> release{false};
  FakeUnit unit([&](int, UcxStream& s, FakeUnit* u) {
    (void)u->read_pull(s);
    while (!release.load()) std::this_thread::sleep_for(10ms);  // never answers
  });
  PullOptions o;
  o.io_timeout = 300ms;
  o.timeout = 2s;
  o.max_attempts = 2;
  const auto t0 = Clock::now();
  auto got = pull_kv(context(), unit.address(), "r", 1, o);
  const auto took = Clock::now() - t0;
  release.store(true);
  EXPECT_EQ(got.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(got.status().message().find("timed out"), std::string::npos) << got.status().message();
  EXPECT_NE(got.status().message().find(unit.address()), std::string::npos);
  EXPECT_LT(took, 2s);

  // Nobody listens on that port any more.
  const std::string gone = [] {
    auto srv = server();
    return srv->address();
  }();
  const auto t1 = Clock::now();
  auto absent = pull_kv(context(), gone, "r", 1, o);
  EXPECT_EQ(absent.status().code(), StatusCode::kUnavailable) << absent.status().to_string();
  EXPECT_LT(Clock::now() - t1, 2500ms);
}

TEST(KvTransfer, WireMessagesRoundTripAndMalformedBodiesAreRefused) {
  const KvHandoff h = *handoff(1);
  HeaderMsg head{h.fingerprint, h.block_bytes,     1,        h.n_prompt,
                 h.n_computed,  h.n_cached_prompt, h.tokens, h.rng_state};
  for (const KvMessage& m :
       {KvMessage(PullMsg{"id", 7, 3}), KvMessage(head), KvMessage(BlockMsg{5, {1, 2, 3}}),
        KvMessage(DoneMsg{}), KvMessage(AbortMsg{2, "why"})}) {
    const std::vector<uint8_t> frame = encode(m);
    FrameHeader fh;
    std::memcpy(&fh, frame.data(), sizeof(fh));
    ASSERT_TRUE(check_header(fh, kKvWireMaxBody).ok());
    auto back = decode(fh, std::span<const uint8_t>(frame).subspan(sizeof(fh)));
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    EXPECT_EQ(back->index(), m.index());
    EXPECT_EQ(encode(*back), frame);
  }
  // Every truncation of a header message's body is refused.
  const std::vector<uint8_t> frame = encode(head);
  for (size_t n = 0; n + sizeof(FrameHeader) < frame.size(); n += 7) {
    std::span<const uint8_t> body = std::span<const uint8_t>(frame).subspan(sizeof(FrameHeader), n);
    const FrameHeader fh = frame_header(MsgType::kHeader, body);
    EXPECT_FALSE(decode(fh, body).ok()) << n;
  }
}

}  // namespace
}  // namespace moeserve
