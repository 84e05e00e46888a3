#include "router/pd_transport.h"

#include <fmt/format.h>

namespace moeserve {

Result<std::unique_ptr<PdTransport>> PdTransport::start(UnitRole role, const KvTransferOptions& so,
                                                        const PullOptions& pull) {
  std::unique_ptr<PdTransport> t(new PdTransport());
  t->role_ = role;
  t->pull_ = pull;
  auto ctx = UcxContext::create();
  if (!ctx.ok()) return ctx.status();
  t->ucx_ = *ctx;
  if (role != UnitRole::kDecode) {
    auto s = KvTransferServer::start(t->ucx_, so);
    if (!s.ok()) return s.status();
    t->server_ = std::move(*s);
  }
  return t;
}

PdHooks PdTransport::hooks() {
  PdHooks h;
  if (server_) {
    h.offer = [this](const std::string& handle,
                     std::shared_ptr<const KvHandoff> hand) -> Result<std::string> {
      RETURN_IF_ERROR(server_->offer(handle, std::move(hand)));
      return server_->address();
    };
  }
  if (role_ != UnitRole::kPrefill) {
    h.pull = [this](const std::string& address, const std::string& handle,
                    const std::atomic<bool>* stop) -> Result<std::shared_ptr<KvHandoff>> {
      PullOptions o = pull_;
      o.stop = stop;
      PullStats ps;
      const auto t0 = Clock::now();
      auto got = pull_kv(ucx_, address, handle, fingerprint_.load(), o, &ps);
      if (!got.ok()) {
        pulls_failed_.fetch_add(1);
        return got.status();
      }
      pulls_ok_.fetch_add(1);
      pull_bytes_.fetch_add(ps.bytes);
      pull_us_.fetch_add(
          std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count());
      return got;
    };
  }
  return h;
}

std::string PdTransport::metrics_text() {
  std::string out;
  auto line = [&](const char* name, const char* help, int64_t v, const char* type = "counter") {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, v);
  };
  if (server_) {
    const KvTransferStats s = server_->stats();
    line("moeserve_pd_handoffs_offered_total", "Hand-offs put under lease for decode units",
         s.offered);
    line("moeserve_pd_handoffs_completed_total", "Hand-offs pulled and acknowledged", s.completed);
    line("moeserve_pd_handoffs_expired_total", "Leases that ran out untaken", s.expired);
    line("moeserve_pd_transfer_bytes_sent_total", "KV bytes sent to decode units", s.bytes_sent);
    line("moeserve_pd_transfer_frames_rejected_total", "Malformed or corrupt frames received",
         s.frames_rejected);
    line("moeserve_pd_handoffs_released_total", "Hand-offs released (their requests ended)",
         s.released);
    line("moeserve_pd_handoffs_evicted_total",
         "Pulled hand-offs dropped unreleased (for room or at the end of --kv-retain)", s.evicted);
    line("moeserve_pd_leases", "Hand-offs held now, not pulled yet", s.leases, "gauge");
    line("moeserve_pd_retained", "Pulled hand-offs kept now for failover", s.retained, "gauge");
    line("moeserve_pd_retained_bytes", "Their KV bytes", s.retained_bytes, "gauge");
  }
  if (role_ != UnitRole::kPrefill) {
    line("moeserve_pd_pulls_total", "KV pulls that arrived whole", pulls_ok_.load());
    line("moeserve_pd_pull_failures_total", "KV pulls that failed", pulls_failed_.load());
    line("moeserve_pd_pull_bytes_total", "KV bytes pulled", pull_bytes_.load());
    line("moeserve_pd_pull_microseconds_total", "Time spent pulling KV", pull_us_.load());
  }
  return out;
}

}  // namespace moeserve
