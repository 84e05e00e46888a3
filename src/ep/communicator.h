// Communicator: the transport of an EP group (docs/ep-serving.md). R ranks, each with
// one Communicator, exchange bytes with all-to-all-v, small integers with all-gather, and
// messages point to point. Two implementations:
//   in-process  make_in_process_group(R): R communicators joined through shared memory, one per
//               thread (R = 1 is the single-process case; R > 1 is the fast fake of unit tests).
//   Open MPI    make_mpi_communicator(): one rank of `mpirun -np R`; the only code in the tree
//               that calls MPI (mpi_communicator.cpp). Built only when CMake found MPI; without
//               it make_mpi_communicator returns Unimplemented.
//
// Semantics shared by both:
//   - Collectives (all_to_all_v, all_gather, barrier) must be called by every rank of the group
//     in the same order; a rank with nothing to send still calls, with zero counts.
//   - Every wait is bounded by CommOptions::timeout. A peer that does not deliver in time makes
//     the call return Unavailable naming the rank(s) ("no data from rank 2 within 30000 ms");
//     from then on the communicator is failed and every call returns that error again (a group
//     that lost a rank cannot be trusted; the process should exit non-zero and be restarted).
//   - A Communicator is used by one thread at a time (the rank's step thread, or later its
//     communication thread); different communicators of one in-process group run on different
//     threads concurrently.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace moeserve {

struct CommOptions {
  std::chrono::milliseconds timeout{30000};  // longest wait for any peer in one call
};

// Where one rank's bytes for (or from) each peer lie in a buffer: peer p's chunk is
// [offsets[p], offsets[p] + counts[p]) bytes. Both spans have size() == group size.
struct PeerChunks {
  std::span<const size_t> counts;
  std::span<const size_t> offsets;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* transport() const = 0;  // "in-process" or "mpi"

  // All-to-all-v of bytes. Sends send[chunk p] to peer p (itself included). Peer p's bytes land
  // at recv + recv.offsets[p]; at most recv.counts[p] bytes are accepted (the capacity), and the
  // number received is written to received[p]. When the receiver knows the exact sizes (normal
  // mode) capacity == size; the low-latency mode passes a fixed capacity and learns the sizes
  // from the messages themselves (no size round trip). A peer sending more than the capacity is
  // an error naming it.
  virtual Status all_to_all_v(const void* send, PeerChunks send_chunks, void* recv,
                              PeerChunks recv_capacity, std::span<size_t> received) = 0;

  // Point-to-point, for the later request hand-off between ranks. Messages between a pair with
  // the same tag arrive in order. recv returns the message size (it must fit in `buffer`).
  virtual Status send(int peer, int tag, std::span<const uint8_t> bytes) = 0;
  virtual Result<size_t> recv(int peer, int tag, std::span<uint8_t> buffer) = 0;

  // Built on all_to_all_v. all: [size()][mine.size()], rank r's values at r * mine.size();
  // every rank passes the same mine.size().
  Status all_gather(std::span<const int64_t> mine, std::span<int64_t> all);
  Status barrier();
  // all_to_all_v where every received size must equal recv.counts[p] exactly.
  Status all_to_all_exact(const void* send, PeerChunks send_chunks, void* recv,
                          PeerChunks recv_chunks);
};

// R communicators of one in-process group; communicator r has rank r. Hand each to its own
// thread (R = 1: use it directly). The group lives while any of them does.
std::vector<std::unique_ptr<Communicator>> make_in_process_group(int size,
                                                                 CommOptions options = {});

// This process's rank in the MPI world (initializes MPI when no one has). Returns Unimplemented
// when moeserve was built without MPI. Only one may exist at a time per process; destroying it
// finalizes MPI if it initialized it, unless it failed (MPI_Finalize would wait for the dead
// peer), in which case the process should exit non-zero.
Result<std::unique_ptr<Communicator>> make_mpi_communicator(CommOptions options = {});

// Whether this build has the MPI communicator, and whether this process looks like it was
// started by mpirun (Open MPI or PMI environment variables).
bool mpi_available();
bool launched_by_mpirun();

}  // namespace moeserve
