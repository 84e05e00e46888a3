// KV transfer between units (prefill/decode disaggregation, docs/pd.md): the decode unit pulls a
// request's hand-off (engine/handoff.h) from the prefill unit that made it, over UCX
// (ucx_stream.h) in the frames of kv_wire.h.
//
// KvTransferServer (prefill side) holds each hand-off under a lease until a puller has verified
// every block and said so (DoneMsg), an AbortMsg withdraws it, or the lease runs out. A pulled
// hand-off is then retained for failover (a decode unit that takes over the request when the
// first one is lost pulls it again: docs/fault-tolerance.md) until it is released (ReleaseMsg,
// release_kv(): its request has ended), its retention runs out, or room is needed for a new
// offer (retained hand-offs go first, oldest first). pull_kv()
// (decode side) checks every block's checksum; a lost connection or a bad block is retried on a
// new connection that resumes at the first block not yet verified, within the pull's deadline.
// Every wait has a timeout (KvTransferOptions, PullOptions); every error names the peer.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "core/status.h"
#include "engine/handoff.h"
#include "transfer/kv_wire.h"
#include "transfer/ucx_stream.h"

namespace moeserve {

struct KvTransferOptions {
  std::string host = "127.0.0.1";  // where the listener binds (and the address says)
  uint16_t port = 0;               // 0: any free port
  // A hand-off nobody has taken by then is dropped (the decode side gave up or died).
  std::chrono::milliseconds lease{30000};
  // One frame's send or receive, and the wait for a puller's next message.
  std::chrono::milliseconds io_timeout{10000};
  // A pulled hand-off is kept this long for a second pull (failover) unless released first;
  // 0: dropped once pulled.
  std::chrono::milliseconds retain{std::chrono::minutes(10)};
  // Bytes of KV held (leased and retained) at most: offer() drops retained hand-offs to make
  // room, and refuses when the leased ones alone leave none.
  uint64_t max_lease_bytes = uint64_t(8) << 30;
};

struct KvTransferStats {
  int64_t offered = 0;
  int64_t completed = 0;        // pulled and acknowledged (a second pull of a retained one too)
  int64_t expired = 0;          // leases that ran out
  int64_t withdrawn = 0;        // by withdraw() or a puller's abort
  int64_t refused = 0;          // offers over max_lease_bytes
  int64_t pulls = 0;            // pull requests served (resumptions included)
  int64_t pull_errors = 0;      // pulls answered with an abort (unknown handle, fingerprint)
  int64_t frames_rejected = 0;  // malformed, oversized or corrupt frames received
  int64_t bytes_sent = 0;       // block bytes
  int64_t released = 0;         // by a ReleaseMsg (the request ended)
  int64_t evicted = 0;          // retained hand-offs dropped for room or at the end of retain
  int64_t leases = 0;           // now, not pulled yet
  int64_t leased_bytes = 0;     // now, not pulled yet
  int64_t retained = 0;         // now, pulled and kept for failover
  int64_t retained_bytes = 0;   // now
};

class KvTransferServer {
 public:
  static Result<std::unique_ptr<KvTransferServer>> start(std::shared_ptr<UcxContext> ctx,
                                                         const KvTransferOptions& options);
  ~KvTransferServer();  // ends the connections (their waits see the stop) and the listener

  // "host:port", what pullers connect to.
  std::string address() const;
  // Holds `h` under `handle` until it is pulled, withdrawn or its lease ends (then retained, see
  // above). Errors: ResourceExhausted (over max_lease_bytes), InvalidArgument (the handle is in
  // use).
  Status offer(const std::string& handle, std::shared_ptr<const KvHandoff> h);
  void withdraw(const std::string& handle);
  void release(const std::string& handle);
  KvTransferStats stats();

 private:
  // A hand-off as served: its blocks' checksums are computed once, when it is offered, not on
  // the transfer's critical path.
  struct Held {
    std::shared_ptr<const KvHandoff> handoff;
    std::vector<uint64_t> checksums;  // [block] XXH3-64
  };
  struct Lease {
    std::shared_ptr<const Held> held;
    Clock::time_point expires;  // of the lease, then (pulled) of the retention
    uint64_t bytes = 0;
    bool pulled = false;
  };
  struct Connection {
    std::thread thread;
    std::atomic<bool> done{false};
  };

  KvTransferServer(std::shared_ptr<UcxContext> ctx, const KvTransferOptions& o)
      : ctx_(std::move(ctx)), options_(o) {}
  void accept(std::unique_ptr<UcxStream> s);
  void serve(UcxStream& s);
  Status serve_pull(UcxStream& s, const PullMsg& pull);
  std::shared_ptr<const Held> find(const std::string& handle);
  void erase(const std::string& handle, int64_t KvTransferStats::*counter);
  void erase_locked(std::unordered_map<std::string, Lease>::iterator it,
                    int64_t KvTransferStats::*counter);
  void pulled(const std::string& handle);
  void expire_locked(Clock::time_point now);

  std::shared_ptr<UcxContext> ctx_;
  KvTransferOptions options_;
  std::unique_ptr<UcxListener> listener_;
  std::mutex mu_;
  std::unordered_map<std::string, Lease> leases_;
  KvTransferStats stats_;
  std::atomic<bool> stop_{false};
  std::mutex conn_mu_;
  std::list<Connection> connections_;
};

struct PullOptions {
  std::chrono::milliseconds timeout{60000};     // the whole pull, retries included
  std::chrono::milliseconds io_timeout{10000};  // one frame
  int max_attempts = 4;                         // connections tried (the first included)
  const std::atomic<bool>* stop = nullptr;      // when set and true: give up now (Unavailable)
};

struct PullStats {
  int attempts = 0;
  int64_t bytes = 0;          // block bytes received and verified
  int corrupt_frames = 0;     // frames that failed their checksum (then retried)
  uint64_t resumed_from = 0;  // the block the last attempt started at
};

// Tells the KvTransferServer at `address` that hand-off `handle` is no longer needed (its
// request ended): it drops it, pulled or not. OK also when it was not there (any more).
Status release_kv(std::shared_ptr<UcxContext> ctx, const std::string& address,
                  const std::string& handle,
                  std::chrono::milliseconds timeout = std::chrono::milliseconds(2000));

// Pulls the hand-off `handle` from the KvTransferServer at `address` ("host:port"); `fingerprint`
// is the puller's KV fingerprint (the server refuses a hand-off of another). Errors: NotFound
// (no such hand-off there: unknown, taken, expired), InvalidArgument (another fingerprint),
// Unavailable (the unit could not be reached within the deadline and attempts), each naming
// the unit.
Result<std::shared_ptr<KvHandoff>> pull_kv(std::shared_ptr<UcxContext> ctx,
                                           const std::string& address, const std::string& handle,
                                           uint64_t fingerprint, const PullOptions& options = {},
                                           PullStats* stats = nullptr);

// "host:port" split (the host may be a bracketed IPv6 address).
Status split_address(const std::string& address, std::string* host, uint16_t* port);

}  // namespace moeserve
