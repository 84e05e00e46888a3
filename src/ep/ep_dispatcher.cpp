#include "ep/ep_dispatcher.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <fmt/format.h>

#include "core/dtype.h"
#include "kernels/convert.h"
#include "kernels/quant.h"

namespace moeserve {

namespace {

// Chunk descriptors for records or rows of `unit` bytes at the given bases.
struct Chunks {
  std::vector<size_t> counts, offsets;
  Chunks(const std::vector<size_t>& n, const std::vector<size_t>& base, size_t unit) {
    for (size_t p = 0; p < n.size(); ++p) {
      counts.push_back(n[p] * unit);
      offsets.push_back(base[p] * unit);
    }
  }
  PeerChunks view() const { return {counts, offsets}; }
};

std::vector<size_t> prefix_bases(const std::vector<size_t>& n) {
  std::vector<size_t> base(n.size(), 0);
  for (size_t p = 1; p < n.size(); ++p) base[p] = base[p - 1] + n[p - 1];
  return base;
}

std::vector<size_t> fixed_bases(size_t n_ranks, size_t capacity) {
  std::vector<size_t> base(n_ranks);
  for (size_t p = 0; p < n_ranks; ++p) base[p] = p * capacity;
  return base;
}

// Rows of a batch at least this large are written with non-temporal stores: they are larger than
// a core's share of the cache, so reading each line in before overwriting it (what a plain store
// does) only doubles the memory traffic; 0.47-0.58 against 0.76-0.85 ms for 8 MB of rows
// (docs/ep-wire-format.md, "Cost beyond the exchange").
constexpr size_t kStreamRowsBytes = size_t(4) << 20;

// memcpy with non-temporal stores where dst is 16-byte aligned (SSE2, in every x86-64); a
// plain memcpy elsewhere. stream_fence() orders the stores before the rows are handed on.
void stream_copy(uint8_t* dst, const void* src, size_t bytes) {
#if defined(__SSE2__)
  if (reinterpret_cast<uintptr_t>(dst) % 16 == 0) {
    const auto* s = static_cast<const uint8_t*>(src);
    size_t i = 0;
    for (; i + 16 <= bytes; i += 16) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i),
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
    }
    if (i < bytes) std::memcpy(dst + i, s + i, bytes - i);
    return;
  }
#endif
  std::memcpy(dst, src, bytes);
}

void stream_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

template <typename T>
void put(uint8_t* dst, size_t offset, T v) {
  std::memcpy(dst + offset, &v, sizeof(T));
}
template <typename T>
T get(const uint8_t* src, size_t offset) {
  T v;
  std::memcpy(&v, src + offset, sizeof(T));
  return v;
}

}  // namespace

const char* ep_mode_name(EpMode m) {
  return m == EpMode::kNormal ? "normal" : "low-latency";
}

std::optional<EpMode> ep_mode_from_name(std::string_view name) {
  if (name == "normal") return EpMode::kNormal;
  if (name == "low-latency") return EpMode::kLowLatency;
  return std::nullopt;
}

Result<std::unique_ptr<EpDispatcher>> EpDispatcher::create(Communicator& comm,
                                                           ExpertPlacement placement,
                                                           EpOptions options) {
  if (placement.n_ranks() != comm.size()) {
    return InvalidArgument(fmt::format("EP placement is for {} ranks, the group has {}",
                                       placement.n_ranks(), comm.size()));
  }
  if (options.mode == EpMode::kLowLatency &&
      (options.hidden <= 0 || options.top_k <= 0 || options.max_tokens_per_rank <= 0)) {
    return InvalidArgument(
        "low-latency EP needs hidden, top_k and max_tokens_per_rank to size its buffers");
  }
  return std::unique_ptr<EpDispatcher>(new EpDispatcher(comm, std::move(placement), options));
}

EpDispatcher::EpDispatcher(Communicator& comm, ExpertPlacement placement, EpOptions options)
    : comm_(comm), placement_(std::move(placement)), options_(options) {
  if (options_.mode != EpMode::kLowLatency) return;
  // Preallocate the fixed per-peer slabs once (DeepEP's low-latency buffers).
  const size_t R = size_t(comm_.size()), T = size_t(options_.max_tokens_per_rank);
  const auto L = DispatchRecordLayout::make(options_.hidden, options_.top_k, options_.dtype);
  dispatch_send_.assign(R * T * L.bytes, 0);
  dispatch_recv_.assign(R * T * L.bytes, 0);
  const size_t bytes =
      R * T * size_t(options_.top_k) * combine_row_bytes(options_.hidden, options_.dtype);
  combine_send_.assign(bytes / 2, 0);  // BF16 (or F32) rows as 16-bit units
  combine_recv_.assign(bytes / 2, 0);
}

Status EpDispatcher::set_placement(ExpertPlacement placement) {
  if (placement.n_ranks() != comm_.size() || placement.n_experts() != placement_.n_experts()) {
    return InvalidArgument(fmt::format(
        "EP placement of {} experts on {} ranks cannot replace one of {} experts on {}",
        placement.n_experts(), placement.n_ranks(), placement_.n_experts(), comm_.size()));
  }
  placement_ = std::move(placement);
  seq_.clear();
  return Status::Ok();
}

Result<ExpertBatch> EpDispatcher::dispatch(int64_t moe_layer, const float* x, int64_t n_tokens,
                                           int64_t hidden, const int32_t* topk_ids,
                                           const float* topk_weights, int64_t top_k) {
  const bool low_latency = options_.mode == EpMode::kLowLatency;
  const int R = comm_.size();
  if (hidden <= 0 || top_k <= 0 || n_tokens < 0) {
    return InvalidArgument("dispatch: hidden and top_k must be positive");
  }
  if (low_latency) {
    if (hidden != options_.hidden || top_k != options_.top_k) {
      return InvalidArgument(fmt::format(
          "low-latency dispatch: buffers are for hidden {} top-k {}, called with {} and {}",
          options_.hidden, options_.top_k, hidden, top_k));
    }
    if (n_tokens > options_.max_tokens_per_rank) {
      return ResourceExhausted(fmt::format(
          "low-latency dispatch: {} tokens on rank {}, over the capacity of {} per rank", n_tokens,
          comm_.rank(), options_.max_tokens_per_rank));
    }
  }
  for (int64_t i = 0; i < n_tokens * top_k; ++i) {
    if (topk_ids[i] < 0 || topk_ids[i] >= placement_.n_experts()) {
      return InvalidArgument(fmt::format("dispatch: expert id {} out of range [0, {})", topk_ids[i],
                                         placement_.n_experts()));
    }
  }
  if (!placement_.valid_layer(moe_layer)) {
    return InvalidArgument(fmt::format("dispatch: MoE layer {} outside the placement's {} layers",
                                       moe_layer, placement_.layers()));
  }
  const auto L = DispatchRecordLayout::make(hidden, top_k, options_.dtype);

  // Layout: the rank computing each (token, expert): one of the expert's replicas, the k-th
  // token this rank sends to the expert in this layer going to route(..., k) (k counts across
  // calls, so that decode steps of a token or two also spread over the replicas); then records
  // (tokens) and entries (token, expert) per destination rank.
  const int me = comm_.rank();
  dest_.resize(size_t(n_tokens * top_k));
  if (size_t(moe_layer) >= seq_.size()) seq_.resize(size_t(moe_layer) + 1);
  std::vector<uint64_t>& seq = seq_[size_t(moe_layer)];
  seq.resize(size_t(placement_.n_experts()), 0);
  for (int64_t i = 0; i < n_tokens * top_k; ++i) {
    const int32_t e = topk_ids[i];
    dest_[size_t(i)] = int32_t(placement_.route(moe_layer, e, me, seq[size_t(e)]++));
  }
  if (counter_) {
    counter_->on_dispatch(moe_layer, {topk_ids, size_t(n_tokens * top_k)},
                          {dest_.data(), dest_.size()});
  }
  std::vector<size_t> records(size_t(R), 0), entries(size_t(R), 0);
  std::vector<uint8_t> seen(size_t(R), 0);
  for (int64_t t = 0; t < n_tokens; ++t) {
    const int32_t* dest = &dest_[size_t(t * top_k)];
    for (int64_t j = 0; j < top_k; ++j) {
      int r = dest[j];
      ++entries[size_t(r)];
      if (!seen[size_t(r)]) ++records[size_t(r)];
      seen[size_t(r)] = 1;
    }
    for (int64_t j = 0; j < top_k; ++j) seen[size_t(dest[j])] = 0;
  }
  const size_t T = size_t(options_.max_tokens_per_rank);
  std::vector<size_t> rec_base = low_latency ? fixed_bases(size_t(R), T) : prefix_bases(records);
  EpRoute route;
  route.top_k = top_k;
  route.weights.assign(topk_weights, topk_weights + n_tokens * top_k);
  route.recv_rows = entries;
  route.recv_row_base =
      low_latency ? fixed_bases(size_t(R), T * size_t(top_k)) : prefix_bases(entries);
  route.slot_row.resize(size_t(n_tokens * top_k));
  route.sum_order.resize(size_t(n_tokens * top_k));
  for (int64_t t = 0; t < n_tokens; ++t) {
    int32_t* order = &route.sum_order[size_t(t * top_k)];
    const int32_t* ids = topk_ids + t * top_k;
    // Stable insertion sort by expert id (top_k is small; std::stable_sort would allocate a
    // buffer per token).
    for (int64_t j = 0; j < top_k; ++j) {
      int64_t i = j;
      for (; i > 0 && ids[order[i - 1]] > ids[j]; --i) order[i] = order[i - 1];
      order[i] = int32_t(j);
    }
  }

  // Payload: each token converted once, whatever the number of ranks it goes to. FP8: the
  // quantization of the BF16 rounding of x, in one pass over x.
  if (L.dtype == DispatchDType::kBf16) {
    x_bf16_.resize(size_t(n_tokens * hidden));  // [n_tokens, hidden]
    f32_to_bf16_row_isa(x, n_tokens * hidden, x_bf16_.data());
  }
  if (L.dtype == DispatchDType::kFp8 && n_tokens > 0) {
    x_fp8_.resize(size_t(n_tokens * hidden));         // [n_tokens, hidden]
    x_scales_.resize(size_t(n_tokens * L.n_scales));  // [n_tokens, n_scales]
    quantize_fp8_1x128_f32(x, n_tokens, hidden, hidden, x_fp8_.data(), hidden, x_scales_.data());
  }

  // Pack the records, rank by rank in token order.
  const size_t payload_bytes = L.dtype == DispatchDType::kFp8    ? 1
                               : L.dtype == DispatchDType::kBf16 ? 2
                                                                 : 4;
  if (!low_latency) {
    size_t total = 0;
    for (size_t r : records) total += r;
    dispatch_send_.resize(total * L.bytes);  // every byte of every record is written below
  }
  std::vector<size_t> rec_cursor(size_t(R), 0), entry_cursor(size_t(R), 0);
  for (int64_t t = 0; t < n_tokens; ++t) {
    const int32_t* ids = topk_ids + t * top_k;
    const int32_t* dest = &dest_[size_t(t * top_k)];
    for (int64_t j = 0; j < top_k; ++j) {
      const int r = dest[j];
      if (seen[size_t(r)]) continue;  // this token's record to r is already written
      seen[size_t(r)] = 1;
      uint8_t* rec = &dispatch_send_[(rec_base[size_t(r)] + rec_cursor[size_t(r)]++) * L.bytes];
      std::memset(rec, 0, L.payload_offset);
      int32_t count = 0;
      for (int64_t jj = j; jj < top_k; ++jj) {  // slots on r, in slot order
        if (dest[jj] != r) continue;
        put<int32_t>(rec, L.ids_offset + 4 * size_t(count), ids[jj]);
        put<float>(rec, L.weights_offset + 4 * size_t(count), topk_weights[t * top_k + jj]);
        route.slot_row[size_t(t * top_k + jj)] =
            int64_t(route.recv_row_base[size_t(r)] + entry_cursor[size_t(r)]++);
        ++count;
      }
      put<int32_t>(rec, kRecordCountOffset, count);
      if (L.dtype == DispatchDType::kFp8) {
        std::memcpy(rec + L.scales_offset, &x_scales_[size_t(t * L.n_scales)],
                    size_t(L.n_scales) * 4);
        std::memcpy(rec + L.payload_offset, &x_fp8_[size_t(t * hidden)], size_t(hidden));
      } else if (L.dtype == DispatchDType::kBf16) {
        std::memcpy(rec + L.payload_offset, &x_bf16_[size_t(t * hidden)], size_t(hidden) * 2);
      } else {
        std::memcpy(rec + L.payload_offset, x + t * hidden, size_t(hidden) * 4);
      }
      const size_t payload_end = L.payload_offset + size_t(hidden) * payload_bytes;
      std::memset(rec + payload_end, 0, L.bytes - payload_end);  // the padding
    }
    for (int64_t j = 0; j < top_k; ++j) seen[size_t(dest[j])] = 0;
  }

  // Exchange.
  std::vector<size_t> recv_records(size_t(R), 0), recv_base;
  if (low_latency) {
    // No size round trip: every peer may send up to T records into its fixed slab.
    recv_base = fixed_bases(size_t(R), T);
    std::vector<size_t> capacity(size_t(R), T), received(size_t(R), 0);
    Chunks send(records, rec_base, L.bytes), recv(capacity, recv_base, L.bytes);
    RETURN_IF_ERROR(comm_
                        .all_to_all_v(dispatch_send_.data(), send.view(), dispatch_recv_.data(),
                                      recv.view(), received)
                        .with_context("EP dispatch"));
    for (int p = 0; p < R; ++p) {
      if (received[size_t(p)] % L.bytes != 0) {
        return Corrupt(fmt::format("dispatch: rank {} sent {} bytes, not whole records of {}", p,
                                   received[size_t(p)], L.bytes));
      }
      recv_records[size_t(p)] = received[size_t(p)] / L.bytes;
    }
  } else {
    // Normal mode: record counts first (DeepEP's notify step), then exact sizes.
    std::vector<int64_t> n_send(records.begin(), records.end()), n_recv(size_t(R), 0);
    std::vector<size_t> one(size_t(R), 1), base_i(static_cast<size_t>(R));
    for (int p = 0; p < R; ++p) base_i[size_t(p)] = size_t(p);
    Chunks cs(one, base_i, sizeof(int64_t));
    RETURN_IF_ERROR(comm_.all_to_all_exact(n_send.data(), cs.view(), n_recv.data(), cs.view())
                        .with_context("EP dispatch (sizes)"));
    // A record is one token; no step has anywhere near 2^24 tokens on one rank.
    constexpr int64_t kMaxRecords = int64_t(1) << 24;
    for (int p = 0; p < R; ++p) {
      if (n_recv[size_t(p)] < 0 || n_recv[size_t(p)] > kMaxRecords)
        return Corrupt(fmt::format("dispatch: rank {} announced {} records", p, n_recv[size_t(p)]));
      recv_records[size_t(p)] = size_t(n_recv[size_t(p)]);
    }
    recv_base = prefix_bases(recv_records);
    size_t total = 0;
    for (size_t r : recv_records) total += r;
    dispatch_recv_.resize(total * L.bytes);
    Chunks send(records, rec_base, L.bytes), recv(recv_records, recv_base, L.bytes);
    RETURN_IF_ERROR(comm_
                        .all_to_all_exact(dispatch_send_.data(), send.view(), dispatch_recv_.data(),
                                          recv.view())
                        .with_context("EP dispatch"));
  }
  return unpack(moe_layer, L, dispatch_recv_.data(), recv_base, recv_records, n_tokens,
                std::move(route));
}

Result<ExpertBatch> EpDispatcher::unpack(int64_t moe_layer, const DispatchRecordLayout& L,
                                         const uint8_t* recv, const std::vector<size_t>& base,
                                         const std::vector<size_t>& records, int64_t n_tokens,
                                         EpRoute route) {
  const int R = comm_.size(), me = comm_.rank();
  const int64_t H = L.hidden;
  const std::vector<int32_t>& mine = placement_.experts_on(moe_layer, me);
  const bool masked = options_.mode == EpMode::kLowLatency;

  // Validate every record once and count rows per local expert and per source rank.
  std::vector<int64_t> per_expert(mine.size(), 0);
  route.send_rows.assign(size_t(R), 0);
  for (int p = 0; p < R; ++p) {
    for (size_t i = 0; i < records[size_t(p)]; ++i) {
      const uint8_t* rec = recv + (base[size_t(p)] + i) * L.bytes;
      int32_t count = get<int32_t>(rec, kRecordCountOffset);
      if (count < 1 || count > L.top_k) {
        return Corrupt(fmt::format("dispatch: record from rank {} has {} entries (top-k {})", p,
                                   count, L.top_k));
      }
      for (int32_t c = 0; c < count; ++c) {
        int32_t e = get<int32_t>(rec, L.ids_offset + 4 * size_t(c));
        if (e < 0 || e >= placement_.n_experts() || !placement_.holds(moe_layer, me, e)) {
          return Corrupt(fmt::format(
              "dispatch: rank {} sent expert {}, which rank {} does not hold in MoE layer {}", p, e,
              me, moe_layer));
        }
        ++per_expert[size_t(placement_.local_index(moe_layer, me, e))];
      }
      route.send_rows[size_t(p)] += size_t(count);
    }
  }

  ExpertBatch b;
  b.hidden = H;
  b.n_tokens = n_tokens;
  b.layout = masked ? ExpertLayout::kMasked : ExpertLayout::kContiguous;
  // First batch row of each local expert's segment (experts without rows keep 0, unused).
  std::vector<int64_t> seg_start(mine.size(), 0);
  b.offsets.push_back(0);
  if (masked) {
    // Every local expert has a slab; capacity = the fullest expert this call.
    int64_t capacity = 0;
    for (int64_t c : per_expert) capacity = std::max(capacity, c);
    for (size_t le = 0; le < mine.size(); ++le) {
      seg_start[le] = int64_t(le) * capacity;
      b.experts.push_back(mine[le]);
      b.counts.push_back(per_expert[le]);
      b.offsets.push_back(int64_t(le + 1) * capacity);
    }
  } else {
    for (size_t le = 0; le < mine.size(); ++le) {
      if (per_expert[le] == 0) continue;
      seg_start[le] = b.offsets.back();
      b.experts.push_back(mine[le]);
      b.counts.push_back(per_expert[le]);
      b.offsets.push_back(b.offsets.back() + per_expert[le]);
    }
  }
  const int64_t n_rows = b.offsets.back();
  const bool bf16_rows = options_.bf16_rows && L.dtype != DispatchDType::kF32;
  b.row_weight.assign(size_t(n_rows), 0.0f);
  const size_t T = size_t(options_.max_tokens_per_rank);
  route.send_row_base =
      masked ? fixed_bases(size_t(R), T * size_t(L.top_k)) : prefix_bases(route.send_rows);
  size_t total_rows = 0, total_records = 0;
  for (size_t n : route.send_rows) total_rows += n;
  for (size_t n : records) total_records += n;
  route.return_row.reserve(total_rows);
  std::vector<int64_t> fill(mine.size(), 0);
  // Assigns the batch rows of record rec's entries (in entry order) and calls row_fn(row) for
  // each; rows fill each expert's segment in (source rank, record, entry) order, which is also
  // the combine send order.
  auto place_entries = [&](const uint8_t* rec, auto&& row_fn) {
    const int32_t count = get<int32_t>(rec, kRecordCountOffset);
    for (int32_t c = 0; c < count; ++c) {
      int32_t e = get<int32_t>(rec, L.ids_offset + 4 * size_t(c));
      size_t le = size_t(placement_.local_index(moe_layer, me, e));
      int64_t row = seg_start[le] + fill[le]++;
      b.row_weight[size_t(row)] = get<float>(rec, L.weights_offset + 4 * size_t(c));
      route.return_row.push_back(row);
      row_fn(row);
    }
  };

  if (bf16_rows) {
    // Each received token once, in BF16; rows refer to it (padding rows to token 0, unread).
    b.tokens_bf16 = RowVector<uint16_t>(RowAllocator<uint16_t>(rows_));
    b.tokens_bf16.resize(total_records * size_t(H));  // [records, H], every row written below
    b.row_source.assign(size_t(n_rows), 0);
    int32_t token = 0;
    for (int p = 0; p < R; ++p) {
      for (size_t i = 0; i < records[size_t(p)]; ++i, ++token) {
        const uint8_t* rec = recv + (base[size_t(p)] + i) * L.bytes;
        const uint8_t* payload = rec + L.payload_offset;
        uint16_t* dst = &b.tokens_bf16[size_t(token) * size_t(H)];
        if (L.dtype == DispatchDType::kFp8) {
          scales_tmp_.resize(size_t(L.n_scales));
          std::memcpy(scales_tmp_.data(), rec + L.scales_offset, size_t(L.n_scales) * 4);
          fp8_1x128_to_bf16_row(payload, scales_tmp_.data(), H, dst);
        } else {
          std::memcpy(dst, payload, size_t(H) * 2);  // a BF16 payload is taken as it is
        }
        place_entries(rec, [&](int64_t row) { b.row_source[size_t(row)] = token; });
      }
    }
    b.route = std::make_shared<const EpRoute>(std::move(route));
    return b;
  }

  // F32 rows, one per (token, expert): from the pool, not zeroed (every row in use is written
  // below, and the masked layout's padding rows are zeroed here; a fresh zeroed vector per call
  // page-faults it all in).
  b.x = RowVector<float>(RowAllocator<float>(rows_));
  b.x.resize(size_t(n_rows * H));  // [n_rows, H]
  if (masked) {
    for (size_t s = 0; s < b.counts.size(); ++s) {
      std::fill(b.x.begin() + ptrdiff_t((b.offsets[s] + b.counts[s]) * H),
                b.x.begin() + ptrdiff_t(b.offsets[s + 1] * H), 0.0f);
    }
  }
  // Each token is decoded once into a scratch row (it stays in L1), then written to each of its
  // expert rows; large batches with non-temporal stores (see stream_copy).
  const size_t row_bytes = size_t(H) * 4;
  const bool stream = size_t(n_rows) * row_bytes >= kStreamRowsBytes;
  row_f32_.resize(size_t(H));
  uint8_t* rows = reinterpret_cast<uint8_t*>(b.x.data());
  for (int p = 0; p < R; ++p) {
    for (size_t i = 0; i < records[size_t(p)]; ++i) {
      const uint8_t* rec = recv + (base[size_t(p)] + i) * L.bytes;
      const uint8_t* payload = rec + L.payload_offset;
      const void* src = payload;  // an F32 payload is taken as it is
      if (L.dtype == DispatchDType::kFp8) {
        scales_tmp_.resize(size_t(L.n_scales));
        std::memcpy(scales_tmp_.data(), rec + L.scales_offset, size_t(L.n_scales) * 4);
        fp8_1x128_to_f32_row(payload, scales_tmp_.data(), H, row_f32_.data());
        src = row_f32_.data();
      } else if (L.dtype == DispatchDType::kBf16) {
        row_tmp_.resize(size_t(H));
        std::memcpy(row_tmp_.data(), payload, size_t(H) * 2);
        bf16_to_f32_row(row_tmp_.data(), H, row_f32_.data());
        src = row_f32_.data();
      }
      place_entries(rec, [&](int64_t row) {
        uint8_t* dst = rows + size_t(row) * row_bytes;
        if (stream) {
          stream_copy(dst, src, row_bytes);
        } else {
          std::memcpy(dst, src, row_bytes);
        }
      });
    }
  }
  if (stream) stream_fence();  // the rows are read next, maybe by other threads
  b.route = std::make_shared<const EpRoute>(std::move(route));
  return b;
}

namespace {

// An expert output row as it goes on the wire (F32, or rounded to BF16), into dst.
void to_wire(const float* o, int64_t H, bool f32, uint16_t* dst) {
  if (f32) {
    std::memcpy(dst, o, size_t(H) * 4);
  } else {
    f32_to_bf16_row_isa(o, H, dst);
  }
}
void to_wire(const uint16_t* o, int64_t H, bool f32, uint16_t* dst) {
  if (f32) {
    for (int64_t c = 0; c < H; ++c) {
      const float v = bf16_to_f32(o[c]);
      std::memcpy(dst + 2 * c, &v, 4);
    }
  } else {
    std::memcpy(dst, o, size_t(H) * 2);
  }
}

// y[H] += w * (the wire value of expert output row o): the source side's sum of a row that
// stayed on its rank, with the bits it would have had after a trip over the wire.
void add_own(float w, const float* o, int64_t H, bool f32, float* y) {
  if (f32) {
    for (int64_t c = 0; c < H; ++c) y[c] += w * o[c];
  } else {
    bf16_round_axpy_row(w, o, H, y);
  }
}
void add_own(float w, const uint16_t* o, int64_t H, bool f32, float* y) {
  if (f32) {
    for (int64_t c = 0; c < H; ++c) y[c] += w * bf16_to_f32(o[c]);
  } else {
    bf16_axpy_row(w, o, H, y);
  }
}

}  // namespace

Status EpDispatcher::combine(const ExpertBatch& b, const float* expert_out, float* y) {
  return combine_rows(b, expert_out, y);
}

Status EpDispatcher::combine(const ExpertBatch& b, const uint16_t* expert_out, float* y) {
  return combine_rows(b, expert_out, y);
}

template <typename Row>
Status EpDispatcher::combine_rows(const ExpertBatch& b, const Row* expert_out, float* y) {
  if (!b.route) return Internal("combine: the batch was not made by an EpDispatcher");
  const EpRoute& route = *b.route;
  const int R = comm_.size(), me = comm_.rank();
  const int64_t H = b.hidden, k = route.top_k;
  const bool f32 = options_.dtype == DispatchDType::kF32;
  const size_t rb = combine_row_bytes(H, options_.dtype), ru = rb / 2;  // bytes, u16 per row
  const bool low_latency = options_.mode == EpMode::kLowLatency;

  // Rows of this rank's own tokens skip the wire: the source side reads them from expert_out,
  // rounded to BF16 as the wire would (the same bits). Only other ranks' rows are packed.
  size_t self_first = 0;  // index in return_row of the first row back to this rank
  for (int p = 0; p < me; ++p) self_first += route.send_rows[size_t(p)];
  std::vector<size_t> send_rows = route.send_rows, recv_rows = route.recv_rows;
  send_rows[size_t(me)] = recv_rows[size_t(me)] = 0;
  // Where rows sit in the buffers: low-latency keeps its fixed slabs (the self slab unused);
  // normal mode packs the other ranks' chunks without a gap for the self chunk, so a route row
  // index past the self chunk moves down by its size.
  std::vector<size_t> send_base = route.send_row_base, recv_base = route.recv_row_base;
  const size_t send_gap = low_latency ? 0 : route.send_rows[size_t(me)],
               recv_gap = low_latency ? 0 : route.recv_rows[size_t(me)];
  for (int p = me + 1; p < R; ++p) {
    send_base[size_t(p)] -= send_gap;
    recv_base[size_t(p)] -= recv_gap;
  }
  if (!low_latency) {
    size_t send_total = 0, recv_total = 0;
    for (int p = 0; p < R; ++p) {
      send_total += send_rows[size_t(p)];
      recv_total += recv_rows[size_t(p)];
    }
    combine_send_.resize(send_total * ru);
    combine_recv_.resize(recv_total * ru);
  }
  size_t i = 0;
  for (int p = 0; p < R; ++p) {
    if (p == me) {
      i += route.send_rows[size_t(p)];
      continue;
    }
    for (size_t n = 0; n < route.send_rows[size_t(p)]; ++n, ++i) {
      const Row* o = expert_out + route.return_row[i] * H;  // [H]
      to_wire(o, H, f32, &combine_send_[(send_base[size_t(p)] + n) * ru]);
    }
  }
  // Both sides know every size: no round trip in either mode.
  Chunks send(send_rows, send_base, rb), recv(recv_rows, recv_base, rb);
  RETURN_IF_ERROR(
      comm_.all_to_all_exact(combine_send_.data(), send.view(), combine_recv_.data(), recv.view())
          .with_context("EP combine"));

  // Source side: y[t] = sum over slots j, by ascending expert id, of w[t, j] * row(t, j).
  const size_t self_lo = route.recv_row_base[size_t(me)],
               self_hi = self_lo + route.recv_rows[size_t(me)];
  std::vector<float>& rowf = combine_row_f32_;
  rowf.resize(size_t(H));
  for (int64_t t = 0; t < b.n_tokens; ++t) {
    float* yt = y + t * H;  // [H]
    std::fill(yt, yt + H, 0.0f);
    for (int64_t jj = 0; jj < k; ++jj) {
      const int64_t j = route.sum_order[size_t(t * k + jj)];
      const float w = route.weights[size_t(t * k + j)];
      size_t r = size_t(route.slot_row[size_t(t * k + j)]);
      if (r >= self_lo && r < self_hi) {  // computed here: row n of the self chunk
        const Row* o = expert_out + route.return_row[self_first + (r - self_lo)] * H;  // [H]
        add_own(w, o, H, f32, yt);
        continue;
      }
      if (r >= self_hi) r -= recv_gap;
      if (f32) {
        std::memcpy(rowf.data(), &combine_recv_[r * ru], rb);
        for (int64_t c = 0; c < H; ++c) yt[c] += w * rowf[size_t(c)];
      } else {
        bf16_axpy_row(w, &combine_recv_[r * ru], H, yt);
      }
    }
  }
  return Status::Ok();
}

}  // namespace moeserve
