#include "eplb/replica_router.h"

#include <algorithm>
#include <cstdint>

#include "core/check.h"

namespace moeserve::eplb {

ReplicaRouter::ReplicaRouter(const Placement& placement) : placement_(placement) {
  const Placement& p = placement_;
  const int32_t G = p.num_gpus();
  offsets_.reserve(size_t(p.num_layers()) * p.num_logical() * G + 1);
  offsets_.push_back(0);
  std::vector<int32_t> room;       // [c] units a replica can still take
  std::vector<int32_t> supply(G);  // [G] units a rank has still to place
  std::vector<std::vector<ReplicaShare>> per_rank(G);
  for (int32_t l = 0; l < p.num_layers(); ++l) {
    for (int32_t e = 0; e < p.num_logical(); ++e) {
      const std::span<const int32_t> slots = p.replicas(l, e);
      const int32_t c = static_cast<int32_t>(slots.size());
      room.assign(c, G);
      std::fill(supply.begin(), supply.end(), c);
      for (auto& v : per_rank) v.clear();
      // Pass 0: same GPU, 1: same node, 2: anywhere. Units only move, so after pass 2 every
      // rank has placed its c units and every replica holds exactly G.
      for (int pass = 0; pass < 3; ++pass) {
        for (int32_t g = 0; g < G; ++g) {
          for (int32_t r = 0; r < c && supply[g] > 0; ++r) {
            const int32_t gpu = p.gpu_of_slot(slots[r]);
            const bool eligible = pass == 2 || (pass == 0 && gpu == g) ||
                                  (pass == 1 && p.node_of_gpu(gpu) == p.node_of_gpu(g));
            if (!eligible || room[r] == 0) continue;
            const int32_t units = std::min(room[r], supply[g]);
            room[r] -= units;
            supply[g] -= units;
            auto& mine = per_rank[g];
            auto it = std::find_if(mine.begin(), mine.end(),
                                   [&](const ReplicaShare& s) { return s.slot == slots[r]; });
            if (it == mine.end()) {
              mine.push_back({slots[r], units});
            } else {
              it->units += units;
            }
          }
        }
      }
      for (int32_t g = 0; g < G; ++g) {
        CHECK(supply[g] == 0, "every rank's traffic is placed");
        shares_.insert(shares_.end(), per_rank[g].begin(), per_rank[g].end());
        CHECK(shares_.size() <= UINT32_MAX, "share table fits 32-bit offsets");
        offsets_.push_back(static_cast<uint32_t>(shares_.size()));
      }
    }
  }
}

std::span<const ReplicaShare> ReplicaRouter::shares(int32_t layer, int32_t logical,
                                                    int32_t src_rank) const {
  const size_t k = key(layer, logical, src_rank);
  return {shares_.data() + offsets_[k], offsets_[k + 1] - offsets_[k]};
}

int32_t ReplicaRouter::select(int32_t layer, int32_t logical, int32_t src_rank,
                              uint64_t token_seq) const {
  const std::span<const ReplicaShare> s = shares(layer, logical, src_rank);
  const int32_t c = placement_.logcnt(layer, logical);
  int64_t pos = static_cast<int64_t>(token_seq % static_cast<uint64_t>(c));
  for (const ReplicaShare& share : s) {
    if (pos < share.units) return share.slot;
    pos -= share.units;
  }
  CHECK(false, "shares sum to logcnt");
  return -1;
}

}  // namespace moeserve::eplb
