#include "ep/expert_migration.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include <fmt/format.h>

#include "core/check.h"

namespace moeserve {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

size_t ExpertBlob::size() const {
  size_t n = 0;
  for (const auto& p : parts) n += p.size();
  return n;
}

void ExpertBlob::copy(size_t offset, size_t n, uint8_t* dst) const {
  for (const auto& p : parts) {
    if (n == 0) return;
    if (offset >= p.size()) {
      offset -= p.size();
      continue;
    }
    const size_t take = std::min(n, p.size() - offset);
    std::memcpy(dst, p.data() + offset, take);
    dst += take;
    n -= take;
    offset = 0;
  }
  CHECK(n == 0, "ExpertBlob::copy past the end");
}

MigrationPlan plan_migration(const ExpertPlacement& current, const ExpertPlacement& next,
                             int64_t moe_layers) {
  CHECK(current.n_ranks() == next.n_ranks() && current.n_experts() == next.n_experts(),
        "placements of different groups");
  const int R = current.n_ranks();
  const int32_t E = int32_t(current.n_experts());
  MigrationPlan plan;
  plan.drops.resize(size_t(R));
  std::vector<int64_t> sends(size_t(R), 0);  // transfers assigned to each sender so far
  for (int64_t l = 0; l < moe_layers; ++l) {
    for (int32_t e = 0; e < E; ++e) {
      for (int dst = 0; dst < R; ++dst) {
        if (current.holds(l, dst, e)) {
          if (!next.holds(l, dst, e)) plan.drops[size_t(dst)].push_back({l, e});
          continue;
        }
        if (!next.holds(l, dst, e)) continue;
        int src = -1;
        for (int r = 0; r < R; ++r) {
          if (current.holds(l, r, e) && (src < 0 || sends[size_t(r)] < sends[size_t(src)])) src = r;
        }
        CHECK(src >= 0, "every expert has a copy in a placement");
        ++sends[size_t(src)];
        plan.transfers.push_back({l, e, src, dst});
      }
    }
  }
  return plan;
}

Result<std::unique_ptr<ExpertMigration>> ExpertMigration::start(Communicator& comm,
                                                                ExpertHost& host,
                                                                MigrationPlan plan,
                                                                int64_t bytes_per_step) {
  if (bytes_per_step < 1) return InvalidArgument("EPLB migration: bytes per step must be >= 1");
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<ExpertMigration> m(
      new ExpertMigration(comm, host, std::move(plan), bytes_per_step));
  const size_t n = m->plan_.transfers.size();
  const int R = comm.size(), me = comm.rank();
  m->blob_.resize(n);
  // Sizes of this rank's outgoing experts, then whether it could export them all.
  std::vector<int64_t> mine(n + 1, 0);
  mine[n] = 1;
  Status export_error;
  for (size_t i = 0; i < n; ++i) {
    const ExpertTransfer& t = m->plan_.transfers[i];
    if (t.src != me) continue;
    Result<ExpertBlob> b = host.export_expert(t.moe_layer, t.expert);
    if (!b.ok() || b->size() == 0) {
      mine[n] = 0;
      export_error =
          b.ok()
              ? Internal(fmt::format("MoE layer {} expert {} has no bytes", t.moe_layer, t.expert))
              : b.status();
      continue;
    }
    mine[i] = int64_t(b->size());
    m->blob_[i] = std::move(*b);
  }
  std::vector<int64_t> all(size_t(R) * (n + 1));
  RETURN_IF_ERROR(comm.all_gather(mine, all));
  for (int p = 0; p < R; ++p) {
    if (all[size_t(p) * (n + 1) + n] == 1) continue;
    m->export_failed_ = true;  // every rank sees the same flags: all give up alike
    m->export_error_ =
        p == me
            ? export_error.with_context("EPLB migration")
            : Internal(fmt::format("EPLB migration: rank {} cannot send an expert it holds", p));
    return m;
  }
  m->size_.resize(n);
  m->offset_.resize(n);
  std::vector<int64_t> stream(size_t(R), 0);  // bytes each sender sends in all
  for (size_t i = 0; i < n; ++i) {
    const ExpertTransfer& t = m->plan_.transfers[i];
    m->size_[i] = all[size_t(t.src) * (n + 1) + i];
    // An expert is a header plus three matrices: never empty, never near 2^40 bytes.
    if (m->size_[i] <= 0 || m->size_[i] > (int64_t(1) << 40)) {
      return Corrupt(fmt::format("EPLB migration: rank {} announced {} bytes for an expert", t.src,
                                 m->size_[i]));
    }
    m->offset_[i] = stream[size_t(t.src)];
    stream[size_t(t.src)] += m->size_[i];
    m->report_.group_bytes += m->size_[i];
  }
  for (int p = 0; p < R; ++p) {
    m->steps_ = std::max(m->steps_, (stream[size_t(p)] + bytes_per_step - 1) / bytes_per_step);
  }
  m->incoming_.resize(n);
  m->arrived_.assign(n, 0);
  m->report_.transfers = int64_t(n);
  m->report_.bytes_sent = stream[size_t(me)];
  m->report_.seconds = seconds_since(t0);
  return m;
}

Result<ExpertMigration::Progress> ExpertMigration::advance() {
  CHECK(step_ < steps_, "advance() after the migration's last step");
  const auto t0 = std::chrono::steady_clock::now();
  const int R = comm_.size(), me = comm_.rank();
  const int64_t lo = step_ * bytes_per_step_, hi = lo + bytes_per_step_;
  const auto& T = plan_.transfers;
  // The part of transfer i in this step's window of its sender's stream: [a, b).
  auto window = [&](size_t i, int64_t* a, int64_t* b) {
    *a = std::max(lo, offset_[i]);
    *b = std::min(hi, offset_[i] + size_[i]);
    return *a < *b;
  };
  std::vector<size_t> send_n(size_t(R), 0), send_off(size_t(R), 0);
  std::vector<size_t> recv_n(size_t(R), 0), recv_off(size_t(R), 0);
  int64_t a = 0, b = 0;
  for (size_t i = 0; i < T.size(); ++i) {
    if (!window(i, &a, &b)) continue;
    if (T[i].src == me) send_n[size_t(T[i].dst)] += size_t(b - a);
    if (T[i].dst == me) recv_n[size_t(T[i].src)] += size_t(b - a);
  }
  for (int p = 1; p < R; ++p) {
    send_off[size_t(p)] = send_off[size_t(p - 1)] + send_n[size_t(p - 1)];
    recv_off[size_t(p)] = recv_off[size_t(p - 1)] + recv_n[size_t(p - 1)];
  }
  std::vector<uint8_t> send(send_off.back() + send_n.back());  // [bytes] by destination
  std::vector<uint8_t> recv(recv_off.back() + recv_n.back());  // [bytes] by source
  std::vector<size_t> cursor = send_off;
  for (size_t i = 0; i < T.size(); ++i) {
    if (T[i].src != me || !window(i, &a, &b)) continue;
    blob_[i].copy(size_t(a - offset_[i]), size_t(b - a), send.data() + cursor[size_t(T[i].dst)]);
    cursor[size_t(T[i].dst)] += size_t(b - a);
    if (b == offset_[i] + size_[i]) blob_[i] = {};  // all sent
  }
  RETURN_IF_ERROR(
      comm_.all_to_all_exact(send.data(), {send_n, send_off}, recv.data(), {recv_n, recv_off}));
  cursor = recv_off;
  for (size_t i = 0; i < T.size(); ++i) {
    if (T[i].dst != me || !window(i, &a, &b)) continue;
    std::vector<uint8_t>& in = incoming_[i];
    if (in.empty()) in.resize(size_t(size_[i]));
    std::memcpy(in.data() + (a - offset_[i]), recv.data() + cursor[size_t(T[i].src)],
                size_t(b - a));
    cursor[size_t(T[i].src)] += size_t(b - a);
    arrived_[i] += b - a;
    report_.bytes_received += b - a;
    if (arrived_[i] < size_[i]) continue;
    // Complete: install now (not routed to before the switch).
    Status st = host_.install_expert(T[i].moe_layer, T[i].expert, std::move(in));
    in = {};
    if (st.ok()) {
      installed_.push_back(i);
      ++report_.experts_received;
    } else if (!install_failed_) {
      install_failed_ = true;
      install_error_ = st;
    }
  }
  ++step_;
  report_.steps = step_;
  auto account = [&] {
    const double s = seconds_since(t0);
    report_.seconds += s;
    report_.max_step_seconds = std::max(report_.max_step_seconds, s);
  };
  if (step_ < steps_) {
    account();
    return Progress::kInFlight;
  }
  // The agreement: every rank has every expert it was to receive.
  int64_t ok = install_failed_ ? 0 : 1;
  for (size_t i = 0; i < T.size(); ++i) {
    if (T[i].dst == me && arrived_[i] != size_[i]) ok = 0;
  }
  std::vector<int64_t> all(static_cast<size_t>(R));
  RETURN_IF_ERROR(comm_.all_gather(std::span<const int64_t>(&ok, 1), all));
  account();
  if (std::all_of(all.begin(), all.end(), [](int64_t v) { return v == 1; })) {
    return Progress::kDone;
  }
  if (install_failed_) {
    fmt::print(stderr, "eplb: rank {}: migration cancelled: {}\n", me, install_error_.to_string());
  }
  cancel();
  return Progress::kFailed;
}

void ExpertMigration::finish() {
  const auto t0 = std::chrono::steady_clock::now();
  for (const ExpertKey& k : plan_.drops[size_t(comm_.rank())]) {
    host_.drop_expert(k.moe_layer, k.expert);
    ++report_.experts_dropped;
  }
  report_.ok = true;
  report_.seconds += seconds_since(t0);
}

void ExpertMigration::cancel() {
  for (size_t i : installed_) {
    host_.drop_expert(plan_.transfers[i].moe_layer, plan_.transfers[i].expert);
  }
  installed_.clear();
  report_.experts_received = 0;
}

}  // namespace moeserve
