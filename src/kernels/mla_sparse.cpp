#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/check.h"
#include "kernels/mla_decode.h"

namespace moeserve {

void mla_sparse(const MlaSparseBatch& b, ThreadPool* pool, const MlaOptions& opt, Isa isa) {
  const int64_t rows = int64_t(b.queries.size());
  const int64_t H = b.shape.heads, D = b.shape.dim(), R = b.shape.kv_lora_rank;
  const int64_t tb = b.cache.token.bytes(), block_bytes = kMlaBlockTokens * tb;
  const int64_t q_bytes = b.q_dtype == DType::kF32 ? 4 : 2;
  const auto* base = static_cast<const uint8_t*>(b.cache.blocks);
  const int64_t stride = b.cache.stride();
  std::vector<uint8_t> arena;
  std::vector<int32_t> ids;
  for (int64_t w0 = 0; w0 < rows; w0 += kMlaSparseWave) {
    const int64_t w1 = std::min(rows, w0 + kMlaSparseWave);
    std::vector<int64_t> first(size_t(w1 - w0 + 1), 0);  // each row's first arena block
    for (int64_t i = w0; i < w1; ++i) {
      const int64_t k = int64_t(b.queries[size_t(i)].positions.size());
      CHECK(k > 0, "a sparse query attends to at least one token");
      first[size_t(i - w0 + 1)] =
          first[size_t(i - w0)] + (k + kMlaBlockTokens - 1) / kMlaBlockTokens;
    }
    const int64_t n_blocks = first.back();
    arena.resize(size_t(n_blocks * block_bytes));
    ids.resize(size_t(n_blocks));
    std::iota(ids.begin(), ids.end(), 0);
    std::vector<MlaSequence> seqs;
    for (int64_t i = w0; i < w1; ++i) {
      const size_t f = size_t(first[size_t(i - w0)]), n = size_t(first[size_t(i - w0 + 1)]) - f;
      seqs.push_back(MlaSequence{std::span(ids).subspan(f, n),
                                 int64_t(b.queries[size_t(i)].positions.size()), 1});
    }
    auto gather = [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const MlaSparseQuery& sq = b.queries[size_t(w0 + i)];
        uint8_t* dst = arena.data() + first[size_t(i)] * block_bytes;  // blocks back to back
        for (int32_t pos : sq.positions) {
          const int64_t block = sq.block_table[size_t(pos / kMlaBlockTokens)];
          CHECK(block >= 0 && block < b.cache.num_blocks, "block id out of range");
          std::memcpy(dst, base + block * stride + (pos % kMlaBlockTokens) * tb, size_t(tb));
          dst += tb;
        }
      }
    };
    pool ? pool->parallel_for(w1 - w0, gather) : gather(0, w1 - w0);
    MlaBatch mb;
    mb.shape = b.shape;
    mb.cache = MlaCacheView{.blocks = arena.data(),
                            .token = b.cache.token,
                            .num_blocks = n_blocks,
                            .block_stride = block_bytes};
    mb.seqs = seqs;
    mb.q = static_cast<const uint8_t*>(b.q) + w0 * H * D * q_bytes;
    mb.q_dtype = b.q_dtype;
    mb.o = b.o + w0 * H * R;
    mb.lse = b.lse ? b.lse + w0 * H : nullptr;
    mla_decode(mb, pool, opt, isa);
  }
}

}  // namespace moeserve
