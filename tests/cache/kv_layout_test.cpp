// KvLayout (cache/kv_layout.h): per-layer parts, their bytes and offsets, and a KvCache over a
// mixed layout (the shapes V3.2 and V4 need: docs/kv-cache.md "Layouts").
#include "cache/kv_layout.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "cache/kv_cache.h"

namespace moeserve {
namespace {

const KvTokenFormat kBf16{DType::kBF16, 128, 16};
const KvTokenFormat kFp8{DType::kF8E4M3, 128, 16};

// V2/V3's layout keeps the bytes of kKvLayoutVersion 2: layer after layer, one token's latent
// after another.
TEST(KvLayout, EveryLayerALatentIsTheBlockMajorTokenLayout) {
  const KvLayout l(3, kBf16);
  EXPECT_EQ(l.n_layers, 3);
  EXPECT_EQ(l.token, kBf16);
  EXPECT_EQ(l.token_bytes(), size_t(288));
  EXPECT_EQ(l.block_bytes(), size_t(3 * kKvBlockSize * 288));
  for (int64_t layer = 0; layer < 3; ++layer) {
    EXPECT_EQ(l.part_offset(layer, 0), size_t(layer * kKvBlockSize * 288));
    EXPECT_EQ(l.find_part(layer, KvPartKind::kLatent), 0);
    EXPECT_EQ(l.find_part(layer, KvPartKind::kIndexKey), -1);
  }
  EXPECT_TRUE(kv_layout_status(l).ok());
}

// V3.2: the latent (FlashMLA's 656-byte FP8 token for V3's dims) plus a 128-dim FP8 index key
// and its scale, per token. V4-like: a windowed latent, 4x compressed entries (in a format of
// their own) with index keys, the compressor's state; a 128x compressed layer has one entry
// per 128 tokens, in every block's one slot. Every latent part of a layout has one format.
TEST(KvLayout, PartsAddUpPerLayer) {
  const KvTokenFormat v3_fp8{DType::kF8E4M3, 512, 64};
  const KvLayerFormat dsa{{KvPart::latent(v3_fp8), KvPart::index_key(128)}, 0};
  EXPECT_EQ(dsa.bytes(), kKvBlockSize * 656 + kKvBlockSize * 132);
  const KvTokenFormat v4{DType::kBF16, 448, 64};
  const KvLayerFormat csa{{KvPart::latent(v3_fp8), KvPart::compressed(v4, 4),
                           KvPart::index_key(128, 4), KvPart::state(4096)},
                          128};
  EXPECT_EQ(csa.parts[1].entries(), 16);
  EXPECT_EQ(csa.parts[2].entries(), 16);
  EXPECT_EQ(csa.bytes(), 64 * 656 + 16 * 1024 + 16 * 132 + 4096);
  const KvLayerFormat hca{{KvPart::latent(v3_fp8), KvPart::compressed(v4, 128)}, 128};
  EXPECT_EQ(hca.parts[1].entries(), 1);
  // V4's FP4 index keys: 64 bytes of e2m1 pairs and 4 exponent bytes; F32 ones 512 bytes.
  EXPECT_EQ(KvPart::index_key(128, 4, DType::kF4E2M1).entry_bytes(), 68);
  EXPECT_EQ(KvPart::index_key(128, 4, DType::kF4E2M1).bytes(), 16 * 68);
  EXPECT_EQ(KvPart::index_key(128, 4, DType::kF32).entry_bytes(), 512);

  const KvLayout l({dsa, csa, hca});
  ASSERT_TRUE(kv_layout_status(l).ok()) << kv_layout_status(l).to_string();
  EXPECT_EQ(l.block_bytes(), size_t(dsa.bytes() + csa.bytes() + hca.bytes()));
  // The windowed layers' latents and the state records come last (the window region).
  const size_t window = size_t(2 * 64 * 656 + 4096);
  const size_t main = size_t(dsa.bytes() + csa.bytes() + hca.bytes()) - window;
  EXPECT_EQ(l.main_bytes(), main);
  EXPECT_EQ(l.window_bytes(), window);
  EXPECT_EQ(l.window(), 128);
  EXPECT_EQ(l.window_blocks(), 2);  // positions p - 127 .. p - 1 span two blocks before p
  EXPECT_EQ(l.part_offset(0, 1), size_t(64 * 656));
  EXPECT_EQ(l.part_offset(1, 1), size_t(dsa.bytes()));
  EXPECT_EQ(l.part_offset(1, 2), size_t(dsa.bytes() + 16 * 1024));
  EXPECT_EQ(l.part_offset(2, 1), size_t(dsa.bytes() + 16 * 1024 + 16 * 132));
  EXPECT_EQ(l.part_offset(1, 0), main);
  EXPECT_EQ(l.part_offset(1, 3), main + 64 * 656);
  EXPECT_EQ(l.part_offset(2, 0), main + 64 * 656 + 4096);
  EXPECT_FALSE(l.windowed(0, 0));
  EXPECT_TRUE(l.windowed(1, 0));
  EXPECT_TRUE(l.windowed(1, 3));
  EXPECT_FALSE(l.windowed(1, 1));
  EXPECT_EQ(l.token, v3_fp8);
  EXPECT_EQ(l.find_part(1, KvPartKind::kState), 3);
  EXPECT_FALSE(l == KvLayout(3, kBf16));
}

TEST(KvLayout, StatusNamesTheLayerAndPartItCannotStore) {
  struct Case {
    KvLayerFormat layer;
    const char* want;
  };
  const KvTokenFormat fp8_160{DType::kF8E4M3, 160, 16};
  std::vector<Case> cases = {
      {{{KvPart::latent(fp8_160)}, 0}, "multiple of 128"},
      {{{KvPart::latent(kBf16), KvPart::compressed(kBf16, 3)}, 0}, "neither divides"},
      {{{KvPart::latent(kBf16), KvPart::compressed(kBf16, 96)}, 0}, "neither divides"},
      {{{KvPart::latent(kBf16), KvPart::index_key(0)}, 0}, "index_dim"},
      {{{KvPart::latent(kBf16), KvPart::index_key(48, 4, DType::kF4E2M1)}, 0}, "32-value"},
      {{{KvPart::latent(kBf16), KvPart::index_key(64, 4, DType::kBF16)}, 0}, "FP8 (with"},
      {{{KvPart::latent(kBf16), KvPart::state(0)}, 0}, "state_bytes"},
      {{{KvPart::latent(kBf16)}, -1}, "window"},
  };
  for (const Case& c : cases) {
    const KvLayout l({{{KvPart::index_key(8)}, 0}, c.layer});
    const Status st = kv_layout_status(l);
    ASSERT_FALSE(st.ok()) << c.want;
    EXPECT_NE(st.message().find(c.want), std::string::npos) << st.message();
  }
  KvPart lat = KvPart::latent(kBf16);
  lat.ratio = 4;
  const Status st = kv_layout_status(KvLayout({{{lat}, 0}}));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("KV layer 0's latent part"), std::string::npos) << st.message();
}

// A cache over a mixed layout: each layer's latent reads back what was written, the other
// parts' bytes are where part_base says and untouched by latent writes, and a block exported
// and imported elsewhere carries every part.
TEST(KvLayout, CacheKeepsEveryPartOfEveryLayerInItsBlock) {
  const KvLayout l({{{KvPart::latent(kFp8), KvPart::index_key(32)}, 0},
                    {{KvPart::compressed(kBf16, 4), KvPart::latent(kFp8), KvPart::state(40)}, 0}});
  ASSERT_TRUE(kv_layout_status(l).ok());
  KvCache cache(l, 4);
  std::vector<int32_t> table;
  ASSERT_TRUE(cache.allocate(2, &table));
  // The non-latent parts of block table[1], filled with a pattern.
  const size_t key = size_t(l.layer(0).parts[1].bytes());
  uint8_t* keys = cache.part_base(0, 1) + size_t(table[1]) * size_t(cache.block_stride_bytes());
  for (size_t i = 0; i < key; ++i) keys[i] = uint8_t(i * 7 + 1);
  uint8_t* state = cache.part_base(1, 2) + size_t(table[1]) * size_t(cache.block_stride_bytes());
  std::memset(state, 0xab, 40);
  // Latents at every position of both blocks, both layers.
  std::vector<float> v(size_t(kFp8.dim())), back(v.size());
  for (int64_t layer = 0; layer < 2; ++layer) {
    for (int64_t pos = 0; pos < 2 * kKvBlockSize; ++pos) {
      for (size_t i = 0; i < v.size(); ++i) v[i] = float((pos + 1) * (layer + 2)) * 0.01f;
      cache.write(layer, table, pos, v.data());
    }
  }
  for (int64_t layer = 0; layer < 2; ++layer) {
    for (int64_t pos = 0; pos < 2 * kKvBlockSize; ++pos) {
      cache.read(layer, table, pos, back.data());
      const float want = float((pos + 1) * (layer + 2)) * 0.01f;
      EXPECT_NEAR(back[0], want, want / 8) << layer << " " << pos;
    }
  }
  for (size_t i = 0; i < key; ++i) ASSERT_EQ(keys[i], uint8_t(i * 7 + 1)) << i;
  for (size_t i = 0; i < 40; ++i) ASSERT_EQ(state[i], 0xab) << i;

  KvCache other(l, 2);
  std::vector<int32_t> t2;
  ASSERT_TRUE(other.import_block(cache.export_block(table[1]), &t2));
  EXPECT_EQ(other.export_block(t2[0]).bytes, cache.export_block(table[1]).bytes);
  const uint8_t* keys2 = other.part_base(0, 1) + size_t(t2[0]) * size_t(other.block_stride_bytes());
  EXPECT_EQ(std::memcmp(keys, keys2, key), 0);
}

}  // namespace
}  // namespace moeserve
