// The model fingerprint seeds the KV cache's hash chain (RAM and disk tier): whatever changes a
// KV block's bits must change it, the cache's token format above all (an FP8 block must never
// be found by a BF16 cache, nor the other way round).
#include "model/fingerprint.h"

#include <gtest/gtest.h>

#include <set>

namespace moeserve {
namespace {

TEST(ModelFingerprint, DistinguishesKvFormatsAndComputePaths) {
  const std::string dir = "tests/data/hf/v3";
  std::set<uint64_t> seen;
  for (DType kv : {DType::kBF16, DType::kF8E4M3, DType::kF32}) {
    for (ComputePath path : {ComputePath::kFast, ComputePath::kReference}) {
      Result<uint64_t> f = model_fingerprint(dir, kv, path);
      ASSERT_TRUE(f.ok()) << f.status().to_string();
      EXPECT_TRUE(seen.insert(*f).second) << dtype_name(kv) << " " << int(path);
      EXPECT_EQ(*model_fingerprint(dir, kv, path), *f);  // stable
    }
  }
  EXPECT_NE(*model_fingerprint(dir, DType::kBF16, ComputePath::kFast),
            *model_fingerprint("tests/data/hf/yarn", DType::kBF16, ComputePath::kFast));
}

}  // namespace
}  // namespace moeserve
