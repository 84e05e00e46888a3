// mla_decode: validation, work partition (split-KV) among threads, and the combine step.
//
// Query rows are cut into groups (one decode query, or up to ~128 query x head rows of a
// prefill chunk) that each make one pass over the cache blocks they see. The groups' work is
// laid end to end and cut into `parts` equal shares, as FlashMLA's tile scheduler does: a group
// that straddles a cut is split over its KV blocks, each piece writes a partial o and lse, and
// the combine merges the pieces with their log-sum-exp weights. The piece kernel is picked by
// ISA level and shape (fast_piece); the partition and combine are the same at every level.
// With fixed splits (MlaOptions::split_blocks) the groups run in waves of bounded partial
// output (a long prefill's partials would be hundreds of MB), into a scratch the calling thread
// keeps between calls; neither changes a bit of the results.
#include "kernels/mla_decode.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "core/check.h"
#include "kernels/mla_decode_internal.h"

namespace moeserve {

static_assert(mla_detail::kFp8Tile == kKvFp8Tile);

namespace mla_detail {

void validate(const MlaBatch& b) {
  const MlaShape& s = b.shape;
  CHECK(s.heads > 0 && s.kv_lora_rank > 0 && s.rope_dim >= 0, "mla: bad shape");
  CHECK(s.q_zero_dims >= 0 && s.q_zero_dims % 2 == 0 && s.q_zero_dims <= s.kv_lora_rank,
        "mla: q_zero_dims is even and at most kv_lora_rank");
  CHECK(b.cache.token.kv_lora_rank == s.kv_lora_rank && b.cache.token.rope_dim == s.rope_dim,
        "mla: cache tokens of another shape");
  CHECK(kv_token_format_status(b.cache.token).ok(), "mla: cache is BF16, FP8 or F32");
  CHECK(b.q_dtype == DType::kBF16 || b.q_dtype == DType::kF32, "mla: q is BF16 or F32");
  for (const MlaSequence& q : b.seqs) {
    CHECK(q.n_queries >= 0 && q.context_len >= q.n_queries, "mla: context shorter than queries");
    const int64_t nb = (q.context_len + kMlaBlockTokens - 1) / kMlaBlockTokens;
    CHECK(int64_t(q.block_table.size()) >= nb, "mla: block table shorter than the context");
    for (int64_t i = 0; i < nb; ++i) {
      CHECK(q.block_table[size_t(i)] >= 0 && q.block_table[size_t(i)] < b.cache.num_blocks,
            "mla: block id outside the pool");
    }
  }
  if (mla_rows(b.seqs) > 0) {
    CHECK(b.q && b.o && b.cache.blocks, "mla: null buffer");
  }
}

namespace {

// A thread's buffer, 64-byte aligned, grown on demand (by a quarter more than asked, so that
// slowly growing requests do not reallocate every time) and kept for the thread's lifetime.
struct GrownBuffer {
  char* base = nullptr;
  size_t size = 0;
  ~GrownBuffer() { std::free(base); }
  char* get(size_t bytes) {
    if (bytes > size) {
      std::free(base);
      size = (bytes + (bytes >> 2) + 63) / 64 * 64;
      base = static_cast<char*>(std::aligned_alloc(64, size));
      CHECK(base != nullptr, "mla: out of memory for kernel scratch");
    }
    return base;
  }
};

}  // namespace

void thread_scratch_parts(const size_t* bytes, size_t n, char** parts) {
  auto aligned = [](size_t b) { return (b + 63) / 64 * 64; };
  size_t total = 0;
  for (size_t i = 0; i < n; ++i) total += aligned(bytes[i]);
  thread_local GrownBuffer t;
  char* p = t.get(total);
  for (size_t i = 0; i < n; ++i) {
    parts[i] = p;
    p += aligned(bytes[i]);
  }
}

}  // namespace mla_detail

int64_t mla_rows(std::span<const MlaSequence> seqs) {
  int64_t rows = 0;
  for (const MlaSequence& s : seqs) rows += s.n_queries;
  return rows;
}

namespace {

// Query x head rows per group of a prefill chunk: enough to amortise each block's V re-layout
// and keep Q, S and O of the group in L2 (docs/kernels-mla.md).
constexpr int64_t kGroupRows = 128;
// Fixed cost of a piece (packing Q, writing o) in units of one block's work.
constexpr int64_t kPieceOverheadBlocks = 1;
// With fixed splits, groups are run in waves whose partial outputs take at most about this many
// bytes (at least one group per wave): the partials of a long prefill (hundreds of MB in one
// call) then stay bounded and mostly in cache. Bits do not depend on it: a piece's bounds and
// a group's combine order depend only on its sequence.
constexpr int64_t kWaveBytes = int64_t(32) << 20;

std::atomic<uint64_t> g_next_call_id{1};

// The calling thread's partial-output scratch, kept between calls (fresh pages for each call
// cost more than the combine). Not zeroed: every piece writes all of its rows.
float* partial_scratch(size_t floats) {
  thread_local mla_detail::GrownBuffer t;
  return reinterpret_cast<float*>(t.get(floats * sizeof(float)));
}

struct Group {
  const MlaSequence* seq;
  int64_t q_row;           // global index of the group's first query
  int64_t n_q;             // queries in the group
  int64_t first_pos;       // position of its first query
  int64_t n_blocks;        // cache blocks it sees
  int64_t weight;          // cost of one block: row vectors + 1 for the memory traffic
  int64_t h0 = 0, nh = 0;  // its heads: all (n_q x heads rows), or, for one query, a range

  int64_t rows() const { return n_q * nh; }
  int64_t row0(int64_t heads) const { return q_row * heads + h0; }  // first global row
};

struct PieceRef {
  int64_t group, b0, b1;
  int64_t part;
  int64_t slot = -1;  // partial-output slot when the group is split
};

// head_rows: the heads a one-query group holds at most (a multiple of 16, the kernels' row
// tile); H for none split. A row's bits do not depend on the other rows of its piece (each row's
// scores, softmax and output are its own), so this may follow the thread count.
std::vector<Group> make_groups(const MlaBatch& b, int64_t head_rows) {
  const int64_t H = b.shape.heads;
  const int64_t per_group = std::max<int64_t>(1, kGroupRows / H);
  std::vector<Group> groups;
  int64_t q_row = 0;
  for (const MlaSequence& s : b.seqs) {
    for (int64_t q0 = 0; q0 < s.n_queries; q0 += per_group) {
      Group g;
      g.seq = &s;
      g.q_row = q_row + q0;
      g.n_q = std::min(per_group, s.n_queries - q0);
      g.first_pos = s.context_len - s.n_queries + q0;
      g.n_blocks = (g.first_pos + g.n_q + kMlaBlockTokens - 1) / kMlaBlockTokens;
      const int64_t step = g.n_q == 1 ? head_rows : H;
      for (g.h0 = 0; g.h0 < H; g.h0 += step) {
        g.nh = std::min(step, H - g.h0);
        g.weight = (g.rows() + 15) / 16 + 1;
        groups.push_back(g);
      }
    }
    q_row += s.n_queries;
  }
  return groups;
}

// The heads per one-query group for `parts` shares: all of them when the blocks already give
// every part a piece (split_blocks > 0: a piece per split_blocks blocks; else one per group),
// otherwise fewer, in 16-row tiles, so that a decode step of few sequences at short contexts
// (one piece each) still spreads over the threads (a 128-head sequence under 256 tokens is
// one piece of 128 rows, one thread's work, without it).
int64_t decode_head_rows(const MlaBatch& b, int64_t parts, int64_t split_blocks) {
  const int64_t H = b.shape.heads;
  if (parts <= 1 || H < 32) return H;
  int64_t pieces = 0;
  for (const Group& g : make_groups(b, H)) {
    pieces += split_blocks > 0 ? (g.n_blocks + split_blocks - 1) / split_blocks : 1;
  }
  if (pieces >= parts) return H;
  const int64_t chunks = std::min(H / 16, (parts + pieces - 1) / pieces);
  return (H / chunks + 15) / 16 * 16;
}

// Lays the groups' costs end to end and cuts them into `parts` shares of equal cost.
std::vector<PieceRef> partition(const std::vector<Group>& groups, int64_t parts) {
  double total = 0;
  for (const Group& g : groups) total += double((g.n_blocks + kPieceOverheadBlocks) * g.weight);
  const double cap = total / double(parts);
  std::vector<PieceRef> pieces;
  int64_t part = 0;
  double used = 0;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const Group& g = groups[gi];
    int64_t b = 0;
    while (b < g.n_blocks) {
      const double rest = double((g.n_blocks - b + kPieceOverheadBlocks) * g.weight);
      if (part == parts - 1 || used + rest <= cap * 1.02) {
        pieces.push_back(PieceRef{int64_t(gi), b, g.n_blocks, part});
        used += rest;
        b = g.n_blocks;
        break;
      }
      const int64_t fit = int64_t((cap - used) / double(g.weight)) - kPieceOverheadBlocks;
      if (fit >= 1) {
        pieces.push_back(PieceRef{int64_t(gi), b, b + fit, part});
        b += fit;
      }
      ++part;
      used = 0;
    }
  }
  return pieces;
}

// Every group cut at fixed multiples of split_blocks blocks (so its pieces depend only on its
// own length), each piece given to the least loaded part so far; ordered by part.
std::vector<PieceRef> partition_fixed(const std::vector<Group>& groups, int64_t parts,
                                      int64_t split_blocks) {
  std::vector<PieceRef> pieces;
  std::vector<double> load(static_cast<size_t>(parts), 0.0);
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const Group& g = groups[gi];
    for (int64_t b0 = 0; b0 < g.n_blocks; b0 += split_blocks) {
      const int64_t b1 = std::min(g.n_blocks, b0 + split_blocks);
      const size_t p = size_t(std::min_element(load.begin(), load.end()) - load.begin());
      load[p] += double((b1 - b0 + kPieceOverheadBlocks) * g.weight);
      pieces.push_back(PieceRef{int64_t(gi), b0, b1, int64_t(p)});
    }
  }
  std::stable_sort(pieces.begin(), pieces.end(),
                   [](const PieceRef& a, const PieceRef& b) { return a.part < b.part; });
  return pieces;
}

using PieceFn = void (*)(const mla_detail::Ctx&, const mla_detail::Piece&);

// The piece kernel for this level and batch, or null where only the reference applies (an F32
// cache, the scalar level, or a shape no kernel takes). At the BF16 level a shape the BF16
// kernel does not take goes to the AVX-512F kernel (same CPU, FP32 arithmetic).
PieceFn fast_piece(const MlaBatch& b, Isa isa) {
  if (b.cache.token.dtype == DType::kF32) return nullptr;
  const MlaShape& s = b.shape;
  if (isa >= Isa::kAvx512Bf16 && s.kv_lora_rank % 32 == 0 && s.rope_dim % 2 == 0) {
    // The AMX form needs whole 32-wide K steps over the token (docs/kernels-amx.md, "MLA").
    if (isa == Isa::kAmx && (s.kv_lora_rank + s.rope_dim) % 32 == 0) return mla_detail::piece_amx;
    return mla_detail::piece_avx512bf16;
  }
  if (s.kv_lora_rank % 16 != 0) return nullptr;
  if (isa_at_most(Isa::kAvx512, isa)) return mla_detail::piece_avx512f;
  if (isa == Isa::kAvx2) return mla_detail::piece_avx2;
  return nullptr;
}

// Runs groups[g0, g1) (their pieces, then the combine of the split ones).
void run_groups(const MlaBatch& b, ThreadPool* pool, const MlaOptions& opt, PieceFn piece_fn,
                const mla_detail::Ctx& ctx, const std::vector<Group>& all, size_t g0, size_t g1,
                int64_t parts) {
  const int64_t H = b.shape.heads, R = b.shape.kv_lora_rank;
  const std::vector<Group> groups(all.begin() + long(g0), all.begin() + long(g1));
  std::vector<PieceRef> pieces = opt.split_blocks > 0
                                     ? partition_fixed(groups, parts, opt.split_blocks)
                                     : partition(groups, parts);

  // Split groups get partial-output slots: o [rows][R] and lse [rows] per piece.
  std::vector<int64_t> n_pieces(groups.size(), 0);
  for (const PieceRef& p : pieces) ++n_pieces[size_t(p.group)];
  std::vector<int64_t> slot_row;  // first scratch row of each slot
  int64_t scratch_rows = 0;
  for (PieceRef& p : pieces) {
    if (n_pieces[size_t(p.group)] > 1) {
      p.slot = int64_t(slot_row.size());
      slot_row.push_back(scratch_rows);
      scratch_rows += groups[size_t(p.group)].rows();
    }
  }
  float* const part_o = partial_scratch(size_t(scratch_rows * (R + 1)));  // [scratch rows, R]
  float* const part_lse = part_o + scratch_rows * R;                      // [scratch rows]

  const size_t q_esize = b.q_dtype == DType::kBF16 ? 2 : 4;
  auto run_piece = [&](const PieceRef& p, const PieceRef* next) {
    const Group& g = groups[size_t(p.group)];
    const int64_t row = g.row0(H);  // first query x head row
    mla_detail::Piece pc;
    pc.q = static_cast<const char*>(b.q) + size_t(row * ctx.dim) * q_esize;
    pc.q_bf16 = b.q_dtype == DType::kBF16;
    pc.n_q = g.n_q;
    pc.first_pos = g.first_pos;
    pc.block_table = g.seq->block_table.data();
    pc.context_len = g.seq->context_len;
    pc.b0 = p.b0;
    pc.b1 = p.b1;
    pc.next_block = nullptr;
    pc.next_bytes = 0;
    if (next) {
      const Group& ng = groups[size_t(next->group)];
      const int64_t t0 = next->b0 * kMlaBlockTokens;
      const int64_t nt = std::min(kMlaBlockTokens, ng.first_pos + ng.n_q - t0);
      const int64_t id = ng.seq->block_table[size_t(next->b0)];
      pc.next_block = ctx.blocks + id * ctx.block_stride;
      pc.next_bytes = nt * ctx.token_bytes;
    }
    if (p.slot < 0) {
      pc.o = b.o + row * R;
      pc.lse = b.lse ? b.lse + row : nullptr;
    } else {
      pc.o = part_o + slot_row[size_t(p.slot)] * R;
      pc.lse = part_lse + slot_row[size_t(p.slot)];
    }
    if (g.nh == H) {
      piece_fn(ctx, pc);
    } else {  // a one-query group's head range: its rows as the kernel's "heads"
      mla_detail::Ctx c = ctx;
      c.heads = g.nh;
      piece_fn(c, pc);
    }
  };
  // Pieces come out of partition() ordered by part.
  std::vector<size_t> part_begin(size_t(parts + 1), pieces.size());
  for (size_t i = pieces.size(); i-- > 0;) part_begin[size_t(pieces[i].part)] = i;
  for (int64_t p = parts - 1; p >= 0; --p) {
    part_begin[size_t(p)] = std::min(part_begin[size_t(p)], part_begin[size_t(p + 1)]);
  }
  auto run_parts = [&](int64_t p0, int64_t p1) {
    const size_t end = part_begin[size_t(p1)];
    for (size_t i = part_begin[size_t(p0)]; i < end; ++i) {
      run_piece(pieces[i], i + 1 < end ? &pieces[i + 1] : nullptr);
    }
  };
  if (pool && parts > 1) {
    pool->parallel_for(parts, run_parts);
  } else {
    run_parts(0, parts);
  }
  if (scratch_rows == 0) return;

  // Combine: o = sum_i exp(lse_i - lse) o_i with lse = log sum_i exp(lse_i).
  // A group's pieces are merged in KV order (by first block), whichever part ran them.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> pieces_of(groups.size());  // (b0, slot)
  std::vector<int64_t> split_groups;
  for (const PieceRef& p : pieces) {
    if (p.slot < 0) continue;
    if (pieces_of[size_t(p.group)].empty()) split_groups.push_back(p.group);
    pieces_of[size_t(p.group)].emplace_back(p.b0, p.slot);
  }
  std::sort(split_groups.begin(), split_groups.end());
  std::vector<std::vector<int64_t>> slots_of(groups.size());
  for (int64_t gi : split_groups) {
    auto& v = pieces_of[size_t(gi)];
    std::sort(v.begin(), v.end());
    for (const auto& [b0, slot] : v) slots_of[size_t(gi)].push_back(slot);
  }
  auto combine = [&](int64_t i0, int64_t i1) {
    std::vector<float> wts;
    std::vector<const float*> srcs;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t gi = split_groups[size_t(i)];
      const Group& g = groups[size_t(gi)];
      const std::vector<int64_t>& slots = slots_of[size_t(gi)];
      wts.resize(slots.size());
      srcs.resize(slots.size());
      for (int64_t r = 0; r < g.rows(); ++r) {
        float mx = -INFINITY;
        for (int64_t s : slots) mx = std::max(mx, part_lse[slot_row[size_t(s)] + r]);
        // Every row sees token 0, which lies in the group's first piece: mx is finite.
        double sum = 0;
        for (size_t k = 0; k < slots.size(); ++k) {
          wts[k] = std::exp(part_lse[slot_row[size_t(slots[k])] + r] - mx);
          sum += wts[k];
        }
        const float inv = float(1.0 / sum);
        for (size_t k = 0; k < slots.size(); ++k) {
          wts[k] *= inv;
          srcs[k] = part_o + (slot_row[size_t(slots[k])] + r) * R;  // [R]
        }
        float* out = b.o + (g.row0(H) + r) * R;  // [R]
        // Accumulated in registers, 64 values at a time; the sums are those of
        // out = 0, out += w_0 o_0, out += w_1 o_1, ... in this order.
        constexpr int64_t kChunk = 64;
        int64_t j0 = 0;
        for (; j0 + kChunk <= R; j0 += kChunk) {  // a fixed trip count: vectorised
          float acc[kChunk] = {};
          for (size_t k = 0; k < slots.size(); ++k) {
            const float wk = wts[k];
            const float* src = srcs[k] + j0;
            for (int64_t j = 0; j < kChunk; ++j) acc[j] += wk * src[j];
          }
          std::copy_n(acc, kChunk, out + j0);
        }
        for (; j0 < R; ++j0) {
          float acc = 0.0f;
          for (size_t k = 0; k < slots.size(); ++k) acc += wts[k] * srcs[k][j0];
          out[j0] = acc;
        }
        if (b.lse) b.lse[g.row0(H) + r] = mx + float(std::log(sum));
      }
    }
  };
  const int64_t n_split = int64_t(split_groups.size());
  if (pool && n_split > 1) {
    pool->parallel_for(n_split, combine);
  } else {
    combine(0, n_split);
  }
}

void run_fast(const MlaBatch& b, ThreadPool* pool, const MlaOptions& opt, PieceFn piece_fn) {
  const int64_t H = b.shape.heads, R = b.shape.kv_lora_rank;
  const int64_t threads = pool ? pool->size() : 1;
  const int64_t parts = opt.parts > 0 ? opt.parts : threads;
  const std::vector<Group> groups = make_groups(b, decode_head_rows(b, parts, opt.split_blocks));
  if (groups.empty()) return;
  const KvTokenFormat& tok = b.cache.token;
  const mla_detail::Ctx ctx{static_cast<const uint8_t*>(b.cache.blocks),
                            b.cache.stride(),
                            tok.bytes(),
                            tok.dtype == DType::kF8E4M3,
                            tok.fp8_rope_offset(),
                            H,
                            R,
                            b.shape.dim(),
                            b.shape.softmax_scale,
                            b.q_dtype == DType::kF32,
                            opt.split_p,
                            b.shape.q_zero_dims / 2,
                            g_next_call_id.fetch_add(1, std::memory_order_relaxed)};
  if (opt.split_blocks <= 0) {  // equal shares of the whole batch: one wave
    run_groups(b, pool, opt, piece_fn, ctx, groups, 0, groups.size(), parts);
    return;
  }
  size_t g0 = 0;
  while (g0 < groups.size()) {
    size_t g1 = g0;
    int64_t bytes = 0;
    while (g1 < groups.size()) {
      const Group& g = groups[g1];
      const int64_t n_split = (g.n_blocks + opt.split_blocks - 1) / opt.split_blocks;
      const int64_t gb = n_split > 1 ? n_split * g.rows() * (R + 1) * 4 : 0;
      if (g1 > g0 && bytes + gb > kWaveBytes) break;
      bytes += gb;
      ++g1;
    }
    run_groups(b, pool, opt, piece_fn, ctx, groups, g0, g1, parts);
    g0 = g1;
  }
}

}  // namespace

void mla_decode(const MlaBatch& batch, ThreadPool* pool, const MlaOptions& opt, Isa isa) {
  CHECK(isa_at_most(isa, cpu_isa()), "mla_decode: ISA level above what this CPU supports");
  mla_detail::validate(batch);
  const PieceFn piece_fn = fast_piece(batch, isa);
  if (!piece_fn) {
    mla_decode_ref(batch, pool);
    return;
  }
  run_fast(batch, pool, opt, piece_fn);
}

}  // namespace moeserve
