// The Open MPI communicator: the only file in the tree that calls MPI.
//
// Every exchange is non-blocking point-to-point (MPI_Isend/MPI_Irecv, one pair per peer, a
// zero-byte message where there is nothing to say) completed by polling MPI_Testsome against a
// deadline, so a peer that never sends is named instead of hanging the rank. Collectives and
// point-to-point messages travel on two separate duplicates of MPI_COMM_WORLD, so user tags can
// never match a collective's message. Errors are returned (MPI_ERRORS_RETURN), never fatal.
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "ep/communicator.h"

namespace moeserve {

namespace {

constexpr int kCollectiveTag = 7;

std::string mpi_error(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string(text, size_t(len));
}

std::string rank_list(const std::vector<int>& ranks) {
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ", "));
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(CommOptions options, bool owns_mpi, MPI_Comm coll, MPI_Comm p2p)
      : options_(options), owns_mpi_(owns_mpi), coll_(coll), p2p_(p2p) {
    MPI_Comm_rank(coll_, &rank_);
    MPI_Comm_size(coll_, &size_);
  }

  ~MpiCommunicator() override {
    // After a failure a peer may be gone: freeing or finalizing would wait for it.
    if (!failed_.ok()) return;
    MPI_Comm_free(&coll_);
    MPI_Comm_free(&p2p_);
    if (owns_mpi_) MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* transport() const override { return "mpi"; }

  Status all_to_all_v(const void* send, PeerChunks send_chunks, void* recv,
                      PeerChunks recv_capacity, std::span<size_t> received) override {
    if (!failed_.ok()) return failed_;
    const auto* s = static_cast<const uint8_t*>(send);
    auto* r = static_cast<uint8_t*>(recv);
    for (int p = 0; p < size_; ++p) {
      if (send_chunks.counts[size_t(p)] > size_t(INT_MAX) ||
          recv_capacity.counts[size_t(p)] > size_t(INT_MAX)) {
        return ResourceExhausted(
            fmt::format("all-to-all: a chunk for rank {} is over 2 GiB; use smaller batches", p));
      }
    }
    // Requests [0, size) receive from peer p, [size, 2 size) send to peer p; self is a copy.
    std::vector<MPI_Request> reqs(size_t(2 * size_), MPI_REQUEST_NULL);
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      int rc = MPI_Irecv(r + recv_capacity.offsets[size_t(p)], int(recv_capacity.counts[size_t(p)]),
                         MPI_BYTE, p, kCollectiveTag, coll_, &reqs[size_t(p)]);
      if (rc != MPI_SUCCESS) return fail(Unavailable("MPI_Irecv: " + mpi_error(rc)));
    }
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      int rc = MPI_Isend(s + send_chunks.offsets[size_t(p)], int(send_chunks.counts[size_t(p)]),
                         MPI_BYTE, p, kCollectiveTag, coll_, &reqs[size_t(size_ + p)]);
      if (rc != MPI_SUCCESS) return fail(Unavailable("MPI_Isend: " + mpi_error(rc)));
    }
    const size_t self = send_chunks.counts[size_t(rank_)];
    if (self > recv_capacity.counts[size_t(rank_)]) {
      return fail(Internal("all-to-all: the chunk to self is over its capacity"));
    }
    if (self > 0) {
      std::memmove(r + recv_capacity.offsets[size_t(rank_)], s + send_chunks.offsets[size_t(rank_)],
                   self);
    }
    received[size_t(rank_)] = self;

    std::vector<MPI_Status> statuses(reqs.size());
    RETURN_IF_ERROR(wait_all(reqs, statuses, "all-to-all"));
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      int count = 0;
      MPI_Get_count(&statuses[size_t(p)], MPI_BYTE, &count);
      received[size_t(p)] = size_t(count);
    }
    return Status::Ok();
  }

  Status send(int peer, int tag, std::span<const uint8_t> bytes) override {
    if (!failed_.ok()) return failed_;
    if (peer < 0 || peer >= size_) return InvalidArgument(fmt::format("send: no rank {}", peer));
    if (bytes.size() > size_t(INT_MAX)) return ResourceExhausted("send: message over 2 GiB");
    std::vector<MPI_Request> req(1, MPI_REQUEST_NULL);
    int rc = MPI_Isend(bytes.data(), int(bytes.size()), MPI_BYTE, peer, tag, p2p_, &req[0]);
    if (rc != MPI_SUCCESS) return fail(Unavailable("MPI_Isend: " + mpi_error(rc)));
    std::vector<MPI_Status> st(1);
    return wait_all(req, st, fmt::format("send to rank {}", peer), peer);
  }

  Result<size_t> recv(int peer, int tag, std::span<uint8_t> buffer) override {
    if (!failed_.ok()) return failed_;
    if (peer < 0 || peer >= size_) return InvalidArgument(fmt::format("recv: no rank {}", peer));
    int cap = int(std::min(buffer.size(), size_t(INT_MAX)));
    std::vector<MPI_Request> req(1, MPI_REQUEST_NULL);
    int rc = MPI_Irecv(buffer.data(), cap, MPI_BYTE, peer, tag, p2p_, &req[0]);
    if (rc != MPI_SUCCESS) return fail(Unavailable("MPI_Irecv: " + mpi_error(rc)));
    std::vector<MPI_Status> st(1);
    RETURN_IF_ERROR(wait_all(req, st, fmt::format("recv from rank {}", peer), peer));
    int count = 0;
    MPI_Get_count(&st[0], MPI_BYTE, &count);
    return size_t(count);
  }

 private:
  // Polls until every request completes or the deadline passes. Request i concerns peer
  // i % size_ (or `peer` when given); on timeout the pending ones are cancelled and named.
  Status wait_all(std::vector<MPI_Request>& reqs, std::vector<MPI_Status>& statuses,
                  const std::string& what, std::optional<int> peer = std::nullopt) {
    const auto started = std::chrono::steady_clock::now();
    const auto deadline = started + options_.timeout;
    std::vector<int> done(reqs.size());
    std::vector<MPI_Status> got(reqs.size());
    for (MPI_Status& st : statuses) st.MPI_ERROR = MPI_SUCCESS;
    int remaining = 0;
    for (MPI_Request q : reqs) remaining += q != MPI_REQUEST_NULL;
    int idle = 0;
    while (remaining > 0) {
      int n_done = 0;
      int rc = MPI_Testsome(int(reqs.size()), reqs.data(), &n_done, done.data(), got.data());
      if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) {
        return fail(Unavailable(fmt::format("{} on rank {}: {}", what, rank_, mpi_error(rc))));
      }
      for (int j = 0; rc == MPI_ERR_IN_STATUS && j < n_done; ++j) {
        int e = got[size_t(j)].MPI_ERROR;
        if (e == MPI_SUCCESS) continue;
        int p = peer.value_or(done[size_t(j)] % size_);
        int cls = 0;
        MPI_Error_class(e, &cls);
        std::string msg = fmt::format("{} on rank {}: rank {}: {}", what, rank_, p, mpi_error(e));
        return fail(cls == MPI_ERR_TRUNCATE ? Corrupt(msg + " (sent over the receive capacity)")
                                            : Unavailable(msg));
      }
      for (int j = 0; j < n_done && n_done != MPI_UNDEFINED; ++j) {
        statuses[size_t(done[size_t(j)])] = got[size_t(j)];
      }
      if (n_done == MPI_UNDEFINED) break;
      if (n_done > 0) {
        remaining -= n_done;
        idle = 0;
        continue;
      }
      // Nothing moved: give the core to the peers (ranks may share cores) and check the clock.
      if (++idle % 64 == 0 && std::chrono::steady_clock::now() > deadline) {
        std::vector<int> missing;
        for (size_t i = 0; i < reqs.size(); ++i) {
          if (reqs[i] == MPI_REQUEST_NULL) continue;
          int p = peer.value_or(int(i) % size_);
          if (missing.empty() || missing.back() != p) missing.push_back(p);
          MPI_Cancel(&reqs[i]);
        }
        std::sort(missing.begin(), missing.end());
        missing.erase(std::unique(missing.begin(), missing.end()), missing.end());
        return fail(Unavailable(
            fmt::format("{} on rank {}: no answer from {} within {} ms "
                        "(dead or hung?)",
                        what, rank_, rank_list(missing), int64_t(options_.timeout.count()))));
      }
      // Yield for the first couple of milliseconds (an exchange inside a step completes in
      // that time), then sleep in short naps: a rank waiting for an idle group's next heartbeat
      // should not burn a core its peers on the same host could use.
      if (idle < 4096 ||
          std::chrono::steady_clock::now() - started < std::chrono::milliseconds(2)) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    }
    return Status::Ok();
  }

  Status fail(Status s) {
    failed_ = s;
    return s;
  }

  CommOptions options_;
  bool owns_mpi_;
  MPI_Comm coll_, p2p_;
  int rank_ = 0, size_ = 1;
  Status failed_;
};

}  // namespace

bool mpi_available() {
  return true;
}

Result<std::unique_ptr<Communicator>> make_mpi_communicator(CommOptions options) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  bool owns = false;
  if (!initialized) {
    int provided = 0;
    // SERIALIZED: the step thread and, later, a communication thread take turns.
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
      return Unavailable("MPI_Init_thread failed");
    }
    owns = true;
  }
  MPI_Comm coll, p2p;
  if (MPI_Comm_dup(MPI_COMM_WORLD, &coll) != MPI_SUCCESS ||
      MPI_Comm_dup(MPI_COMM_WORLD, &p2p) != MPI_SUCCESS) {
    return Unavailable("MPI_Comm_dup failed");
  }
  MPI_Comm_set_errhandler(coll, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(p2p, MPI_ERRORS_RETURN);
  return std::unique_ptr<Communicator>(new MpiCommunicator(options, owns, coll, p2p));
}

}  // namespace moeserve
