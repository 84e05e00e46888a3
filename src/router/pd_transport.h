// PdTransport: one rank's side of KV transfer in a unit (docs/pd.md): the KvTransferServer that
// holds its hand-offs under lease (prefill) and the puller (decode), as the PdHooks its engine
// calls. Every rank of an EP unit has its own, so the KV goes to and from the rank that owns
// the request (DP attention), never through rank 0.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "core/status.h"
#include "engine/handoff.h"
#include "router/pd_protocol.h"
#include "transfer/kv_transfer.h"

namespace moeserve {

class PdTransport {
 public:
  // role kDecode: no transfer server; kPrefill: no puller; kBoth: both.
  static Result<std::unique_ptr<PdTransport>> start(UnitRole role, const KvTransferOptions& server,
                                                    const PullOptions& pull);
  PdHooks hooks();
  // The engine's KV fingerprint, sent with every pull (the prefill unit refuses a hand-off of
  // another model or format). Set once the engine exists, before requests come.
  void set_fingerprint(uint64_t f) { fingerprint_.store(f); }
  // "host:port" of the transfer server (empty without one).
  std::string address() const { return server_ ? server_->address() : std::string(); }
  KvTransferStats server_stats() { return server_ ? server_->stats() : KvTransferStats{}; }
  // Prometheus lines (appended to the unit's /metrics).
  std::string metrics_text();

 private:
  PdTransport() = default;

  UnitRole role_ = UnitRole::kBoth;
  std::shared_ptr<UcxContext> ucx_;
  std::unique_ptr<KvTransferServer> server_;
  PullOptions pull_;
  std::atomic<uint64_t> fingerprint_{0};
  std::atomic<int64_t> pulls_ok_{0}, pulls_failed_{0}, pull_bytes_{0}, pull_us_{0};
};

}  // namespace moeserve
