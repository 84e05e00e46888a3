// EP over Open MPI, run by ctest under `mpirun -np 2` and `-np 4` (tests/ep/mpi/CMakeLists.txt).
// Every rank runs the same tests in the same order (they are collective); each checks its own
// results, and the process exit code is the worst over all ranks.
//
//   ep_mpi_test                 the GoogleTest suite
//   ep_mpi_test --dead-peer MS  the last rank dies in the middle of a dispatch (after the size
//                               exchange, before the records); the others must fail within MS
//                               milliseconds, naming it (checked by dead_peer.sh).
#include <gtest/gtest.h>

#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "../ep_test_util.h"
#include "ep/communicator.h"
#include "ep/ep_dispatcher.h"

namespace moeserve {
namespace {

using namespace ep_testing;

Communicator* world = nullptr;  // set by main before the tests run

TEST(MpiCommunicator, AllToAllVAndAllGather) {
  Communicator& c = *world;
  const int R = c.size(), me = c.rank();
  ASSERT_STREQ(c.transport(), "mpi");
  // Rank me sends (me + 2p) % 5 * 1000 bytes of value me*16+p to peer p.
  const size_t n = static_cast<size_t>(R);
  std::vector<size_t> sc(n), so(n), rc(n), ro(n);
  std::vector<uint8_t> send;
  size_t total = 0;
  for (int p = 0; p < R; ++p) {
    sc[size_t(p)] = size_t((me + 2 * p) % 5) * 1000;
    so[size_t(p)] = send.size();
    send.insert(send.end(), sc[size_t(p)], uint8_t(me * 16 + p));
    rc[size_t(p)] = size_t((p + 2 * me) % 5) * 1000;
    ro[size_t(p)] = total;
    total += rc[size_t(p)];
  }
  std::vector<uint8_t> recv(total);
  ASSERT_TRUE(c.all_to_all_exact(send.data(), {sc, so}, recv.data(), {rc, ro}).ok());
  for (int p = 0; p < R; ++p) {
    for (size_t i = 0; i < rc[size_t(p)]; ++i)
      ASSERT_EQ(recv[ro[size_t(p)] + i], uint8_t(p * 16 + me));
  }
  // Bounded: capacity 5000 each, sizes learned from the messages.
  std::vector<size_t> cap(n, 5000), co(n), got(n);
  for (size_t p = 0; p < n; ++p) co[p] = p * 5000;
  std::vector<uint8_t> slabs(n * 5000);
  ASSERT_TRUE(c.all_to_all_v(send.data(), {sc, so}, slabs.data(), {cap, co}, got).ok());
  EXPECT_EQ(got, rc);
  std::vector<int64_t> all(n * 2);
  int64_t mine[2] = {me, 100 + me};
  ASSERT_TRUE(c.all_gather(mine, all).ok());
  for (int p = 0; p < R; ++p) {
    EXPECT_EQ(all[size_t(2 * p)], p);
    EXPECT_EQ(all[size_t(2 * p + 1)], 100 + p);
  }
  ASSERT_TRUE(c.barrier().ok());
}

TEST(MpiCommunicator, PointToPointRing) {
  Communicator& c = *world;
  const int R = c.size(), me = c.rank();
  if (R < 2) GTEST_SKIP();
  uint8_t out[3] = {uint8_t(me), 1, 2}, in[8] = {};
  // Even ranks send first, odd ranks receive first (no reliance on buffering).
  int next = (me + 1) % R, prev = (me + R - 1) % R;
  if (me % 2 == 0) {
    ASSERT_TRUE(c.send(next, 4, out).ok());
    auto n = c.recv(prev, 4, in);
    ASSERT_TRUE(n.ok()) << n.status().to_string();
    EXPECT_EQ(*n, 3u);
  } else {
    auto n = c.recv(prev, 4, in);
    ASSERT_TRUE(n.ok()) << n.status().to_string();
    EXPECT_EQ(*n, 3u);
    ASSERT_TRUE(c.send(next, 4, out).ok());
  }
  EXPECT_EQ(in[0], uint8_t(prev));
}

struct MpiCase {
  EpMode mode;
  DispatchDType dtype;
};

class MpiEpDispatcher : public ::testing::TestWithParam<MpiCase> {};

TEST_P(MpiEpDispatcher, MatchesTheEmulationAndLocalDispatcher) {
  Communicator& c = *world;
  const int R = c.size(), me = c.rank();
  const MpiCase p = GetParam();
  auto d = EpDispatcher::create(c, *ExpertPlacement::contiguous(E, R), {p.dtype, p.mode, H, K, 24});
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  // Step 0: rank 1 has no tokens. Step 1: rank r's tokens use only experts held elsewhere.
  const int64_t per_rank = E / R;
  Tokens t0 = random_tokens(me == 1 ? 0 : 7 + 3 * me, uint32_t(10 + me), any_expert);
  Tokens t1 = random_tokens(11 + me, uint32_t(20 + me),
                            [&](int32_t e) { return R == 1 || e / per_rank != me; });
  for (const Tokens* t : {&t0, &t1}) {
    auto y = moe_step(**d, *t);
    ASSERT_TRUE(y.ok()) << y.status().to_string();
    expect_matches(*t, *y, p.dtype, fmt::format("rank {} of {}", me, R));
  }
}

INSTANTIATE_TEST_SUITE_P(All, MpiEpDispatcher,
                         ::testing::Values(MpiCase{EpMode::kNormal, DispatchDType::kBf16},
                                           MpiCase{EpMode::kNormal, DispatchDType::kFp8},
                                           MpiCase{EpMode::kLowLatency, DispatchDType::kBf16},
                                           MpiCase{EpMode::kLowLatency, DispatchDType::kFp8},
                                           MpiCase{EpMode::kNormal, DispatchDType::kF32}));

// Passes calls through, but the process exits (without a word to MPI) right after the
// `die_after`-th all_to_all_v: a rank killed between two messages of one dispatch.
class DyingCommunicator final : public Communicator {
 public:
  DyingCommunicator(Communicator& inner, int die_after) : inner_(inner), left_(die_after) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  const char* transport() const override { return inner_.transport(); }
  Status all_to_all_v(const void* s, PeerChunks sc, void* r, PeerChunks rc,
                      std::span<size_t> got) override {
    Status st = inner_.all_to_all_v(s, sc, r, rc, got);
    if (--left_ == 0) {
      std::fprintf(stderr, "rank %d: exiting in the middle of a dispatch\n", rank());
      std::fflush(stderr);
      _exit(0);
    }
    return st;
  }
  Status send(int p, int tag, std::span<const uint8_t> b) override {
    return inner_.send(p, tag, b);
  }
  Result<size_t> recv(int p, int tag, std::span<uint8_t> b) override {
    return inner_.recv(p, tag, b);
  }

 private:
  Communicator& inner_;
  int left_;
};

int dead_peer_main(Communicator& c) {
  const int me = c.rank(), R = c.size();
  // One whole step (2 exchanges for a normal-mode dispatch, 1 for the combine), then the last
  // rank dies after the size exchange of the second dispatch.
  DyingCommunicator dying(c, me == R - 1 ? 4 : -1);
  auto placement = ExpertPlacement::contiguous(E, R);
  if (!placement.ok()) {
    std::fprintf(stderr, "%s\n", placement.status().message().c_str());
    return 2;
  }
  auto d = EpDispatcher::create(dying, *placement, {});
  if (!d.ok()) return 2;
  Tokens t = random_tokens(6, uint32_t(me), any_expert);
  for (int step = 0; step < 2; ++step) {
    auto y = moe_step(**d, t);
    if (!y.ok()) {
      std::fprintf(stderr, "rank %d failed: %s\n", me, y.status().message().c_str());
      return 1;
    }
  }
  std::fprintf(stderr, "rank %d: the dead peer went unnoticed\n", me);
  return 3;
}

}  // namespace
}  // namespace moeserve

int main(int argc, char** argv) {
  using namespace moeserve;
  int dead_peer_ms = 0;
  if (argc == 3 && std::strcmp(argv[1], "--dead-peer") == 0) dead_peer_ms = std::atoi(argv[2]);
  CommOptions options;
  options.timeout = std::chrono::milliseconds(dead_peer_ms > 0 ? dead_peer_ms : 60000);
  auto comm = make_mpi_communicator(options);
  if (!comm.ok()) {
    std::fprintf(stderr, "%s\n", comm.status().message().c_str());
    return 1;
  }
  if (dead_peer_ms > 0) return dead_peer_main(**comm);

  ::testing::InitGoogleTest(&argc, argv);
  world = comm->get();
  int rc = RUN_ALL_TESTS();
  std::vector<int64_t> all(size_t((*comm)->size()));
  int64_t mine = rc;
  if (!(*comm)->all_gather(std::span<const int64_t>(&mine, 1), all).ok()) return 1;
  for (int64_t r : all) rc = std::max(rc, int(r));
  return rc;
}
