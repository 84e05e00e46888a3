// ep-bench: dispatch and combine bandwidth per rank (issue 7, item 8).
//
//   mpirun -np R ep-bench [--tokens 256] [--hidden 7168] [--top-k 8] [--experts 256]
//                         [--dtype fp8|bf16] [--rows bf16|f32] [--iters 20]
//
// Every rank routes its tokens uniformly at random (top-k distinct experts, contiguous
// placement) and times, in both EP modes, the whole dispatch (layout, quantize, pack, exchange,
// unpack into expert rows: BF16 as the fast path takes them, or F32 with --rows f32) and the
// whole combine of expert outputs in the same form (pack BF16, exchange, weighted reduction),
// and, on the exact byte matrix the dispatch (or combine) put on the wire:
//   comm    Communicator::all_to_all_v alone (the EP transport, with its timeout polling)
//   raw     MPI_Alltoallv (the baseline: what the bytes cost with MPI's own collective)
// GB/s = bytes this rank sends to other ranks / median time. Rank 0 prints min and mean over the
// ranks and the ratio to raw (goal >= 0.8), and the fastest iteration of rank 0 ("best") with its
// ratio to raw's fastest: on a shared machine the median also counts time the ranks spent
// descheduled, the best much less so.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include <fmt/format.h>

#include "ep/communicator.h"
#include "ep/ep_dispatcher.h"

namespace moeserve {
namespace {

struct Args {
  int64_t tokens = 256, hidden = 7168, top_k = 8, experts = 256, iters = 20;
  std::string dtype = "fp8";
  bool f32_rows = false;  // receivers write F32 rows (the reference path's form) instead of BF16
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Timing {
  double median = 0, best = 0;  // seconds
};

// Times fn over iters runs (after one warm-up), each after a barrier.
template <typename F>
Timing time_it(Communicator& c, int64_t iters, F&& fn) {
  std::vector<double> t;
  for (int64_t i = 0; i <= iters; ++i) {
    if (!c.barrier().ok()) std::exit(1);
    double t0 = now_s();
    fn();
    if (i > 0) t.push_back(now_s() - t0);
  }
  return {median(t), *std::min_element(t.begin(), t.end())};
}

struct Matrix {  // one rank's send counts and the matching receive counts, in bytes
  std::vector<size_t> sc, so, rc, ro;
  size_t to_others = 0;
};

Matrix make_matrix(Communicator& c, const std::vector<size_t>& send_counts) {
  const int R = c.size();
  Matrix m;
  m.sc = send_counts;
  std::vector<int64_t> mine(send_counts.begin(), send_counts.end()), all(size_t(R * R));
  if (!c.all_gather(mine, all).ok()) std::exit(1);
  size_t s = 0, r = 0;
  for (int p = 0; p < R; ++p) {
    m.so.push_back(s);
    s += m.sc[size_t(p)];
    m.rc.push_back(size_t(all[size_t(p * R + c.rank())]));
    m.ro.push_back(r);
    r += m.rc.back();
    if (p != c.rank()) m.to_others += m.sc[size_t(p)];
  }
  return m;
}

// Timings of (comm, raw) for one byte matrix.
std::pair<Timing, Timing> exchange_times(Communicator& c, const Matrix& m, int64_t iters) {
  std::vector<uint8_t> send(m.so.back() + m.sc.back(), 1), recv(m.ro.back() + m.rc.back());
  std::vector<size_t> got(m.sc.size());
  Timing comm = time_it(c, iters, [&] {
    if (!c.all_to_all_v(send.data(), {m.sc, m.so}, recv.data(), {m.rc, m.ro}, got).ok())
      std::exit(1);
  });
  std::vector<int> sc(m.sc.begin(), m.sc.end()), so(m.so.begin(), m.so.end()),
      rc(m.rc.begin(), m.rc.end()), ro(m.ro.begin(), m.ro.end());
  Timing raw = time_it(c, iters, [&] {
    MPI_Alltoallv(send.data(), sc.data(), so.data(), MPI_BYTE, recv.data(), rc.data(), ro.data(),
                  MPI_BYTE, MPI_COMM_WORLD);
  });
  return {comm, raw};
}

void report(Communicator& c, const std::string& what, double bytes, Timing t, Timing raw) {
  const double seconds = t.median;
  // Gather GB/s (in units of 1e-6 GB/s) and the ratio to raw from every rank.
  int64_t v[2] = {int64_t(bytes / seconds / 1e3), int64_t(raw.median / seconds * 1e6)};
  std::vector<int64_t> all(size_t(2 * c.size()));
  if (!c.all_gather(v, all).ok()) std::exit(1);
  if (c.rank() != 0) return;
  double gmin = 1e30, gsum = 0, rmin = 1e30, rsum = 0;
  for (int r = 0; r < c.size(); ++r) {
    double g = double(all[size_t(2 * r)]) / 1e6, q = double(all[size_t(2 * r + 1)]) / 1e6;
    gmin = std::min(gmin, g);
    gsum += g;
    rmin = std::min(rmin, q);
    rsum += q;
  }
  fmt::print(
      "  {:<28} {:>8.2f} MB/rank {:>8.3f} ms  {:>7.2f} GB/s min {:>7.2f} mean   x raw: {:.2f} min "
      "{:.2f} mean   best {:.3f} ms, x raw {:.2f}\n",
      what, bytes / 1e6, seconds * 1e3, gmin, gsum / c.size(), rmin, rsum / c.size(), t.best * 1e3,
      raw.best / t.best);
}

int run(const Args& a) {
  auto comm = make_mpi_communicator();
  if (!comm.ok()) {
    fmt::print(stderr, "ep-bench: {}\n", comm.status().message());
    return 1;
  }
  Communicator& c = **comm;
  const int R = c.size();
  auto placement = ExpertPlacement::contiguous(a.experts, R);
  auto dtype = dispatch_dtype_from_name(a.dtype);
  if (!placement.ok() || !dtype) {
    fmt::print(stderr, "ep-bench: bad --experts for {} ranks or bad --dtype\n", R);
    return 2;
  }
  std::mt19937 rng(uint32_t(1234 + c.rank()));
  std::normal_distribution<float> normal;
  std::vector<float> x(size_t(a.tokens * a.hidden)), w(size_t(a.tokens * a.top_k), 0.125f);
  for (float& v : x) v = normal(rng);
  std::vector<int32_t> ids, pool(size_t(a.experts));
  for (int64_t e = 0; e < a.experts; ++e) pool[size_t(e)] = int32_t(e);
  for (int64_t t = 0; t < a.tokens; ++t) {
    std::shuffle(pool.begin(), pool.end(), rng);
    ids.insert(ids.end(), pool.begin(), pool.begin() + a.top_k);
  }
  if (c.rank() == 0) {
    fmt::print(
        "ep-bench: R={} ({}), {} tokens/rank, hidden {}, top-{} of {} experts, {} payload, "
        "median of {}\n",
        R, c.transport(), a.tokens, a.hidden, a.top_k, a.experts, a.dtype, a.iters);
  }
  for (EpMode mode : {EpMode::kNormal, EpMode::kLowLatency}) {
    auto d = EpDispatcher::create(c, *placement,
                                  {*dtype, mode, a.hidden, a.top_k, a.tokens, !a.f32_rows});
    if (!d.ok()) return 1;
    ExpertBatch b;
    Timing t_dispatch = time_it(c, a.iters, [&] {
      auto r = (*d)->dispatch(x.data(), a.tokens, a.hidden, ids.data(), w.data(), a.top_k);
      if (!r.ok()) std::exit(1);
      b = std::move(*r);
    });
    // The expert outputs: the rows themselves, F32 or BF16 (the fast path's expert GEMMs write
    // BF16 rows, and combine takes them as they are).
    std::vector<float> y(size_t(a.tokens * a.hidden));
    std::vector<float> out(b.x.begin(), b.x.end());
    std::vector<uint16_t> out16;
    if (b.has_bf16_rows()) {
      for (int64_t r = 0; r < b.n_rows(); ++r) {
        out16.insert(out16.end(), b.bf16_row(r), b.bf16_row(r) + a.hidden);
      }
    }
    Timing t_combine = time_it(c, a.iters, [&] {
      Status s = out16.empty() ? (*d)->combine(b, out.data(), y.data())
                               : (*d)->combine(b, out16.data(), y.data());
      if (!s.ok()) std::exit(1);
    });
    // The byte matrices this rank put on the wire.
    const auto L = DispatchRecordLayout::make(a.hidden, a.top_k, *dtype);
    const size_t rb = combine_row_bytes(a.hidden, *dtype);
    std::vector<size_t> dispatch_bytes(size_t(R), 0), combine_bytes(size_t(R), 0);
    for (int64_t t = 0; t < a.tokens; ++t) {
      std::vector<bool> hit(size_t(R), false);
      for (int64_t j = 0; j < a.top_k; ++j)
        hit[size_t(placement->rank_of(ids[size_t(t * a.top_k + j)]))] = true;
      for (int p = 0; p < R; ++p) dispatch_bytes[size_t(p)] += hit[size_t(p)] ? L.bytes : 0;
    }
    for (int p = 0; p < R; ++p) combine_bytes[size_t(p)] = b.route->send_rows[size_t(p)] * rb;
    Matrix md = make_matrix(c, dispatch_bytes), mc = make_matrix(c, combine_bytes);
    auto [comm_d, raw_d] = exchange_times(c, md, a.iters);
    auto [comm_c, raw_c] = exchange_times(c, mc, a.iters);
    if (c.rank() == 0) fmt::print("{} mode:\n", ep_mode_name(mode));
    report(c, "dispatch (whole)", double(md.to_others), t_dispatch, raw_d);
    report(c, "dispatch bytes, comm only", double(md.to_others), comm_d, raw_d);
    report(c, "dispatch bytes, raw MPI", double(md.to_others), raw_d, raw_d);
    report(c, "combine (whole)", double(mc.to_others), t_combine, raw_c);
    report(c, "combine bytes, comm only", double(mc.to_others), comm_c, raw_c);
    report(c, "combine bytes, raw MPI", double(mc.to_others), raw_c, raw_c);
  }
  return 0;
}

}  // namespace
}  // namespace moeserve

int main(int argc, char** argv) {
  moeserve::Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--tokens")
      a.tokens = std::atoll(v.c_str());
    else if (k == "--hidden")
      a.hidden = std::atoll(v.c_str());
    else if (k == "--top-k")
      a.top_k = std::atoll(v.c_str());
    else if (k == "--experts")
      a.experts = std::atoll(v.c_str());
    else if (k == "--iters")
      a.iters = std::max<int64_t>(1, std::atoll(v.c_str()));
    else if (k == "--dtype")
      a.dtype = v;
    else if (k == "--rows")
      a.f32_rows = v == "f32";
    else {
      std::fprintf(stderr, "ep-bench: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  return moeserve::run(a);
}
