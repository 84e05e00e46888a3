// The in-process communicator group: all-to-all-v contents, capacities, all-gather, barrier,
// point-to-point order, and that a rank that never shows up is named within the timeout.
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <thread>

#include "ep/communicator.h"

namespace moeserve {
namespace {

using namespace std::chrono_literals;

// Runs fn(comm) on one thread per rank and returns each rank's Status.
std::vector<Status> run_group(std::vector<std::unique_ptr<Communicator>>& group,
                              const std::function<Status(Communicator&)>& fn) {
  std::vector<Status> st(group.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < group.size(); ++r) {
    threads.emplace_back([&, r] { st[r] = fn(*group[r]); });
  }
  for (auto& t : threads) t.join();
  return st;
}

// The byte rank `src` sends to rank `dst` at position i.
uint8_t pattern(int src, int dst, size_t i) {
  return uint8_t(src * 31 + dst * 7 + i * 13);
}
size_t chunk_size(int src, int dst) {
  return size_t((src * 5 + dst * 3) % 7) * 11;
}

TEST(InProcessCommunicator, AllToAllVDeliversEveryChunkWhereAsked) {
  for (int R : {1, 2, 3, 4}) {
    auto group = make_in_process_group(R);
    auto st = run_group(group, [R](Communicator& c) -> Status {
      const int me = c.rank();
      const size_t n = static_cast<size_t>(R);
      std::vector<size_t> sc(n), so(n), rc(n), ro(n);
      std::vector<uint8_t> send;
      size_t recv_total = 0;
      for (int p = 0; p < R; ++p) {
        so[size_t(p)] = send.size();
        sc[size_t(p)] = chunk_size(me, p);
        for (size_t i = 0; i < sc[size_t(p)]; ++i) send.push_back(pattern(me, p, i));
        ro[size_t(R - 1 - p)] = 0;  // filled below in reverse order to test offsets
        rc[size_t(p)] = chunk_size(p, me);
      }
      for (int p = R - 1; p >= 0; --p) {  // peers' chunks land in reverse rank order
        ro[size_t(p)] = recv_total;
        recv_total += rc[size_t(p)];
      }
      std::vector<uint8_t> recv(recv_total + 1, 0xee);
      RETURN_IF_ERROR(c.all_to_all_exact(send.data(), {sc, so}, recv.data(), {rc, ro}));
      for (int p = 0; p < R; ++p) {
        for (size_t i = 0; i < rc[size_t(p)]; ++i) {
          if (recv[ro[size_t(p)] + i] != pattern(p, me, i)) return Internal("wrong byte");
        }
      }
      if (recv.back() != 0xee) return Internal("wrote past the chunks");
      return Status::Ok();
    });
    for (int r = 0; r < R; ++r)
      EXPECT_TRUE(st[size_t(r)].ok()) << R << ": " << st[size_t(r)].to_string();
  }
}

TEST(InProcessCommunicator, BoundedReceiveReportsSizesAndRejectsOverflow) {
  auto group = make_in_process_group(3);
  std::vector<std::vector<size_t>> got(3);
  auto st = run_group(group, [&](Communicator& c) -> Status {
    const int me = c.rank();
    std::vector<size_t> sc{size_t(me), size_t(me), size_t(me)}, so{0, 0, 0};
    std::vector<uint8_t> send(8, uint8_t(me + 1));
    std::vector<size_t> cap{4, 4, 4}, co{0, 4, 8}, received(3);
    std::vector<uint8_t> recv(12, 0);
    RETURN_IF_ERROR(c.all_to_all_v(send.data(), {sc, so}, recv.data(), {cap, co}, received));
    got[size_t(me)] = received;
    for (int p = 0; p < 3; ++p) {
      for (size_t i = 0; i < received[size_t(p)]; ++i) {
        if (recv[co[size_t(p)] + i] != uint8_t(p + 1)) return Internal("wrong byte");
      }
    }
    // Now rank 2 sends 6 bytes into a capacity of 4.
    std::vector<size_t> big{6, 6, 6};
    return c.all_to_all_v(send.data(), {me == 2 ? big : sc, so}, recv.data(), {cap, co}, received);
  });
  for (int r = 0; r < 3; ++r) EXPECT_EQ(got[size_t(r)], (std::vector<size_t>{0, 1, 2}));
  EXPECT_EQ(st[0].code(), StatusCode::kCorrupt);
  EXPECT_NE(st[0].message().find("rank 2 sent 6 bytes"), std::string::npos) << st[0].message();
  EXPECT_EQ(st[2].code(), StatusCode::kCorrupt);
}

TEST(InProcessCommunicator, AllGatherAndBarrier) {
  auto group = make_in_process_group(4);
  std::vector<std::vector<int64_t>> all(4, std::vector<int64_t>(8));
  auto st = run_group(group, [&](Communicator& c) -> Status {
    RETURN_IF_ERROR(c.barrier());
    int64_t mine[2] = {c.rank() * 10, -c.rank()};
    RETURN_IF_ERROR(c.all_gather(mine, all[size_t(c.rank())]));
    return c.barrier();
  });
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(st[size_t(r)].ok()) << st[size_t(r)].to_string();
    EXPECT_EQ(all[size_t(r)], (std::vector<int64_t>{0, 0, 10, -1, 20, -2, 30, -3}));
  }
}

TEST(InProcessCommunicator, PointToPointKeepsOrderPerTag) {
  auto group = make_in_process_group(2);
  auto st = run_group(group, [](Communicator& c) -> Status {
    if (c.rank() == 0) {
      for (uint8_t v : {1, 2, 3}) RETURN_IF_ERROR(c.send(1, 5, std::span<const uint8_t>(&v, 1)));
      uint8_t other = 9;
      return c.send(1, 6, std::span<const uint8_t>(&other, 1));
    }
    uint8_t buf[4];
    ASSIGN_OR_RETURN(size_t n, c.recv(0, 6, buf));  // tag 6 first: tags do not block each other
    if (n != 1 || buf[0] != 9) return Internal("tag 6");
    for (uint8_t want : {1, 2, 3}) {
      ASSIGN_OR_RETURN(size_t m, c.recv(0, 5, buf));
      if (m != 1 || buf[0] != want) return Internal("order");
    }
    return Status::Ok();
  });
  EXPECT_TRUE(st[0].ok()) << st[0].to_string();
  EXPECT_TRUE(st[1].ok()) << st[1].to_string();
}

TEST(InProcessCommunicator, DeadPeerIsNamedWithinTheTimeout) {
  auto group = make_in_process_group(3, CommOptions{150ms});
  auto st = run_group(group, [](Communicator& c) -> Status {
    RETURN_IF_ERROR(c.barrier());
    if (c.rank() == 1) return Status::Ok();  // rank 1 "dies" after the first barrier
    return c.barrier();
  });
  for (int r : {0, 2}) {
    EXPECT_EQ(st[size_t(r)].code(), StatusCode::kUnavailable);
    EXPECT_NE(st[size_t(r)].message().find("no data from rank 1 within 150 ms"), std::string::npos)
        << st[size_t(r)].message();
  }
  // A failed communicator stays failed, with the same message.
  Status again = group[0]->barrier();
  EXPECT_EQ(again.message(), st[0].message());
  uint8_t b;
  EXPECT_EQ(group[2]->recv(0, 1, std::span<uint8_t>(&b, 1)).status().code(),
            StatusCode::kUnavailable);
}

TEST(InProcessCommunicator, RecvTimesOutNamingThePeer) {
  auto group = make_in_process_group(2, CommOptions{50ms});
  uint8_t b;
  auto r = group[0]->recv(1, 3, std::span<uint8_t>(&b, 1));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no message from rank 1"), std::string::npos);
}

TEST(Communicator, MpiIsAvailableOrSaysHowToGetIt) {
  if (mpi_available()) GTEST_SKIP() << "built with MPI; tests/ep/mpi runs it under mpirun";
  auto c = make_mpi_communicator();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(c.status().message().find("libopenmpi-dev"), std::string::npos);
}

}  // namespace
}  // namespace moeserve
