// index_scores_fp8 (kernels/index_score.h) at every ISA level this CPU runs against the scalar
// reference: every e4m3 value widened exactly; random queries and keys (subnormals, zeros, both
// signs) over blocks, partial blocks and offset ranges, several rows, 16 to 128 heads, within the
// F32 summation-order bound of the reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "../test_isa.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/index_score.h"

namespace moeserve {
namespace {

// A sequence's keys in blocks of 64 entries (128 e4m3 bytes, F32 scale), not contiguous.
struct KeyStore {
  std::vector<std::vector<uint8_t>> blocks;
  std::vector<const uint8_t*> ptrs;
  explicit KeyStore(int64_t n_keys) {
    const int64_t nb = (n_keys + kIndexKeyBlock - 1) / kIndexKeyBlock;
    for (int64_t b = 0; b < nb; ++b) {
      blocks.emplace_back(size_t(kIndexKeyBlock * kIndexKeyEntryBytes));
    }
    for (auto& b : blocks) ptrs.push_back(b.data());
  }
  uint8_t* key(int64_t s) {
    return blocks[size_t(s / kIndexKeyBlock)].data() + (s % kIndexKeyBlock) * kIndexKeyEntryBytes;
  }
  IndexKeys view() const { return IndexKeys{ptrs}; }
};

uint8_t random_e4m3(std::mt19937& rng) {
  for (;;) {
    const uint8_t b = uint8_t(rng());
    if ((b & 0x7f) != 0x7f) return b;  // not NaN
  }
}

TEST(IndexScore, EveryE4m3ValueIsWidenedExactly) {
  for (Isa isa : testing::isa_levels()) {
    const int64_t heads = 16;
    std::vector<float> w(heads, 0.0f);
    w[0] = 1.0f;
    for (int sign : {0, 1}) {
      // Head 0's query is +1 or -1 at dimension d; the key holds every value in turn there.
      for (int64_t d : {0, 1, 77, 127}) {
        std::vector<uint8_t> q(size_t(heads * kIndexKeyDim), 0);
        q[size_t(d)] = sign ? 0xB8 : 0x38;  // e4m3 -1.0 / 1.0
        KeyStore keys(256);
        for (int v = 0; v < 256; ++v) {
          keys.key(v)[d] = uint8_t(v);
          const float one = 1.0f;
          std::memcpy(keys.key(v) + kIndexKeyDim, &one, 4);
        }
        std::vector<float> scores(256);
        index_scores_fp8(q.data(), w.data(), 1, heads, keys.view(), 0, 256, scores.data(), 256,
                         isa);
        for (int v = 0; v < 256; ++v) {
          if ((v & 0x7f) == 0x7f) continue;  // NaN
          const float x = fp8e4m3_to_f32(uint8_t(v)) * (sign ? -1.0f : 1.0f);
          ASSERT_EQ(scores[size_t(v)], std::max(x, 0.0f))
              << isa_name(isa) << " byte " << v << " dim " << d << " sign " << sign;
        }
      }
    }
  }
}

TEST(IndexScore, RandomQueriesAndKeysMatchTheReference) {
  std::mt19937 rng(43);
  int64_t checked = 0;
  struct Case {
    int64_t heads, rows, n_keys, begin, end;
  };
  const Case cases[] = {{64, 1, 200, 0, 200},    {64, 3, 130, 5, 129}, {16, 2, 64, 0, 64},
                        {128, 1, 70, 63, 70},    {48, 2, 100, 0, 100}, {32, 5, 1, 0, 1},
                        {64, 1, 1000, 300, 1000}};
  for (const Case& c : cases) {
    std::vector<uint8_t> q(size_t(c.rows * c.heads * kIndexKeyDim));
    for (uint8_t& b : q) b = random_e4m3(rng);
    std::vector<float> w(size_t(c.rows * c.heads));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (float& x : w) x = u(rng) * 1e-3f;
    KeyStore keys(c.n_keys);
    for (int64_t s = 0; s < c.n_keys; ++s) {
      for (int64_t d = 0; d < kIndexKeyDim; ++d) keys.key(s)[d] = random_e4m3(rng);
      const float scale = std::ldexp(1.0f, int(rng() % 20) - 10);
      std::memcpy(keys.key(s) + kIndexKeyDim, &scale, 4);
    }
    const int64_t n = c.end - c.begin, ld = n + 3;
    std::vector<float> want(size_t(c.rows * ld), -7.0f);
    index_scores_fp8(q.data(), w.data(), c.rows, c.heads, keys.view(), c.begin, c.end, want.data(),
                     ld, Isa::kScalar);
    for (Isa isa : testing::isa_levels()) {
      std::vector<float> got(size_t(c.rows * ld), -7.0f);
      index_scores_fp8(q.data(), w.data(), c.rows, c.heads, keys.view(), c.begin, c.end, got.data(),
                       ld, isa);
      for (int64_t r = 0; r < c.rows; ++r) {
        for (int64_t i = 0; i < ld; ++i) {
          const float g = got[size_t(r * ld + i)], e = want[size_t(r * ld + i)];
          if (i >= n) {  // past the range: untouched
            ASSERT_EQ(g, -7.0f);
            continue;
          }
          // The bound of F32 sums in any order: the magnitude of the terms, scaled.
          const uint8_t* key = keys.key(c.begin + i);
          float ks;
          std::memcpy(&ks, key + kIndexKeyDim, 4);
          double mag = 0;
          for (int64_t h = 0; h < c.heads; ++h) {
            double dot = 0;
            for (int64_t d = 0; d < kIndexKeyDim; ++d) {
              dot += std::fabs(fp8e4m3_to_f32(q[size_t((r * c.heads + h) * kIndexKeyDim + d)]) *
                               fp8e4m3_to_f32(key[d]));
            }
            mag += std::fabs(w[size_t(r * c.heads + h)]) * dot;
          }
          ASSERT_LE(std::fabs(double(g) - double(e)), 2e-6 * ks * mag + 1e-30)
              << isa_name(isa) << " heads " << c.heads << " row " << r << " key " << c.begin + i;
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 2000);
}

// index_topk: every row's selection is top_k_positions of its own scores over [0, its position]
// (computed here key by key with index_score), whatever the grouping, chunking and pool; rows
// whose context fits the top-k select nothing.
TEST(IndexScore, TopKOfEveryRowOverItsOwnContext) {
  std::mt19937 rng(44);
  ThreadPool pool(2);
  const int64_t heads = 16, top_k = 50;
  struct Seq {
    int64_t first_pos, rows;
  };
  const Seq seqs[] = {{0, 70}, {1999, 1}, {30, 25}, {100, 3}, {1200, 9}};
  std::vector<KeyStore> stores;
  std::vector<std::vector<uint8_t>> q8s;
  std::vector<std::vector<float>> ws;
  for (const Seq& s : seqs) {
    const int64_t n = s.first_pos + s.rows;
    stores.emplace_back(n);
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t d = 0; d < kIndexKeyDim; ++d) stores.back().key(t)[d] = random_e4m3(rng);
      const float scale = std::ldexp(1.0f, int(rng() % 6) - 3);
      std::memcpy(stores.back().key(t) + kIndexKeyDim, &scale, 4);
    }
    q8s.emplace_back(size_t(s.rows * heads * kIndexKeyDim));
    for (uint8_t& b : q8s.back()) b = random_e4m3(rng);
    ws.emplace_back(size_t(s.rows * heads));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (float& x : ws.back()) x = u(rng);
  }
  std::vector<IndexRows> rows;
  for (size_t i = 0; i < std::size(seqs); ++i) {
    rows.push_back(
        IndexRows{q8s[i].data(), ws[i].data(), seqs[i].rows, seqs[i].first_pos, stores[i].view()});
  }
  for (Isa isa : testing::isa_levels()) {
    for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
      std::vector<std::vector<int32_t>> got = {{7}};  // appended after what is there
      index_topk(rows, heads, top_k, p, got, isa);
      size_t r = 1, sparse = 0;
      for (size_t i = 0; i < std::size(seqs); ++i) {
        for (int64_t j = 0; j < seqs[i].rows; ++j, ++r) {
          const int64_t n_ctx = seqs[i].first_pos + j + 1;
          if (n_ctx <= top_k) {
            EXPECT_TRUE(got[r].empty());
            continue;
          }
          std::vector<float> scores(static_cast<size_t>(n_ctx));
          for (int64_t t = 0; t < n_ctx; ++t) {
            float ks;
            std::memcpy(&ks, stores[i].key(t) + kIndexKeyDim, 4);
            index_scores_fp8(&q8s[i][size_t(j * heads * kIndexKeyDim)], &ws[i][size_t(j * heads)],
                             1, heads, stores[i].view(), t, t + 1, &scores[size_t(t)], 1, isa);
          }
          ASSERT_EQ(got[r], top_k_positions(scores, top_k))
              << isa_name(isa) << " sequence " << i << " row " << j;
          ++sparse;
        }
      }
      EXPECT_EQ(r, got.size());
      EXPECT_EQ(got[0], std::vector<int32_t>{7});
      EXPECT_EQ(sparse, 38u);  // 20 + 1 + 5 + 3 + 9 rows past the top-k
    }
  }
}

// top_k_positions on long rows: the k best by score, ties (-0 and +0 included) to the lower
// position, as a stable sort of everything picks them; scores spread over many magnitudes and
// clustered in one bucket of the selection's histogram.
TEST(IndexScore, TopKPositionsIsTheStableSortsPrefix) {
  std::mt19937 rng(45);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (int trial = 0; trial < 12; ++trial) {
    int64_t n = 3000 + int64_t(rng() % 200000), k = 1 + int64_t(rng() % 4096);
    if (trial % 3 == 2) {  // the k-th among the zeros (half of the scores are +-0)
      n = 2000 + int64_t(rng() % 2000);
      k = n / 2 + int64_t(rng() % uint32_t(n / 4));
    }
    std::vector<float> s(static_cast<size_t>(n));
    for (float& v : s) {
      switch (trial % 3) {
        case 0:
          v = d(rng) * std::ldexp(1.0f, int(rng() % 40) - 20);
          break;  // many exponents
        case 1:
          v = 1.0f + float(rng() % 50) * 1e-3f;
          break;    // one bucket, ties
        default: {  // -0, +0 and small integers: ties
          const int r = int(rng() % 4);
          v = r == 0 ? -0.0f : r == 1 ? 0.0f : float(r);
        }
      }
    }
    std::vector<int32_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return s[size_t(a)] > s[size_t(b)]; });
    order.resize(size_t(std::min(n, k)));
    std::sort(order.begin(), order.end());
    ASSERT_EQ(top_k_positions(s, k), order) << "trial " << trial << " n " << n << " k " << k;
  }
  EXPECT_TRUE(top_k_positions(std::vector<float>{1, 2}, 0).empty());
}

}  // namespace
}  // namespace moeserve
