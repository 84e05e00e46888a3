#include "model/safetensors.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <vector>

namespace moeserve {
namespace {

namespace fs = std::filesystem;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "safetensors_test_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr) << std::strerror(errno);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes an 8-byte length (the header's own unless `header_len` overrides it), the header
  // text and `data_bytes` bytes of data 0, 1, 2, ...
  std::string write_raw(const std::string& name, const std::string& header, size_t data_bytes,
                        std::optional<uint64_t> header_len = std::nullopt) {
    std::string p = path(name);
    std::ofstream f(p, std::ios::binary);
    uint64_t n = header_len.value_or(header.size());
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << header;
    for (size_t i = 0; i < data_bytes; ++i) f.put(char(i));
    return p;
  }

  std::string write_bytes(const std::string& name, const std::string& bytes) {
    std::string p = path(name);
    std::ofstream f(p, std::ios::binary);
    f << bytes;
    return p;
  }

  fs::path dir_;
};

// Opening must fail as kCorrupt with a message containing each of `parts`.
void expect_corrupt(const std::string& p, std::initializer_list<std::string> parts) {
  Result<SafetensorsFile> r = SafetensorsFile::open(p);
  ASSERT_FALSE(r.ok()) << p << " opened but should not have";
  EXPECT_EQ(r.status().code(), StatusCode::kCorrupt) << r.status().to_string();
  const std::string& msg = r.status().message();
  EXPECT_NE(msg.find(p), std::string::npos) << "message does not name the file: " << msg;
  for (const std::string& part : parts) {
    EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' not in: " << msg;
  }
}

template <typename T>
std::vector<T> values_of(const TensorInfo& t) {
  std::vector<T> v(t.nbytes / sizeof(T));
  if (t.nbytes) std::memcpy(v.data(), t.data, t.nbytes);
  return v;
}

// ---------------------------------------------------------------------------------- round trip

TEST_F(SafetensorsTest, RoundTripsEveryDtypeScalarAndEmptyTensor) {
  std::vector<float> f32 = {1.0f, -2.5f, 3.0e20f, 0.0f, -0.0f, 7.0f};
  std::vector<uint16_t> bf16 = {f32_to_bf16(1.0f), f32_to_bf16(-3.5f), 0x7f80};
  std::vector<uint16_t> f16 = {0x3c00, 0xc000, 0x7bff, 0x0001};
  std::vector<uint8_t> fp8 = {f32_to_fp8e4m3(1.0f), f32_to_fp8e4m3(-448.0f), 0x01, 0x7f, 0x80};
  std::vector<int64_t> i64 = {INT64_MIN, -1, 0, INT64_MAX};
  std::vector<int32_t> i32 = {INT32_MIN, 42};
  std::vector<uint8_t> u8 = {0, 1, 255};
  float scalar = 0.125f;

  SafetensorsWriter w;
  // Added out of name order, with an odd-sized tensor first: the layout is by decreasing element
  // size, add order among equals, so every tensor is naturally aligned.
  w.add("z.u8", DType::kU8, {3}, u8.data(), u8.size());
  w.add("a.f32", DType::kF32, {2, 3}, f32.data(), f32.size() * 4);
  w.add("bf16", DType::kBF16, {3}, bf16.data(), bf16.size() * 2);
  w.add("f16", DType::kF16, {2, 2}, f16.data(), f16.size() * 2);
  w.add("fp8", DType::kF8E4M3, {5}, fp8.data(), fp8.size());
  w.add("i64", DType::kI64, {4}, i64.data(), i64.size() * 8);
  w.add("i32", DType::kI32, {1, 2}, i32.data(), i32.size() * 4);
  w.add("scalar", DType::kF32, {}, &scalar, 4);
  w.add("empty", DType::kBF16, {0, 4}, nullptr, 0);
  w.set_metadata("format", "pt");
  w.set_metadata("note", "caf\xc3\xa9 \"quoted\"");
  EXPECT_EQ(w.data_bytes(), 3u + 24 + 6 + 8 + 5 + 32 + 8 + 4 + 0);

  std::string p = path("round_trip.safetensors");
  ASSERT_TRUE(w.write(p).ok());
  EXPECT_FALSE(fs::exists(p + ".tmp"));

  Result<SafetensorsFile> r = SafetensorsFile::open(p);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const SafetensorsFile& f = *r;
  EXPECT_EQ(f.path(), p);
  EXPECT_EQ(f.file_size(), fs::file_size(p));
  EXPECT_EQ(f.tensors().size(), 9u);
  EXPECT_EQ(f.metadata(), (std::map<std::string, std::string>{{"format", "pt"},
                                                              {"note", "caf\xc3\xa9 \"quoted\""}}));

  auto expect = [&](const char* name, DType dt, std::vector<int64_t> shape, const void* data,
                    size_t nbytes) {
    SCOPED_TRACE(name);
    const TensorInfo* t = f.find(name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->name, name);
    EXPECT_EQ(t->dtype, dt);
    EXPECT_EQ(t->shape, shape);
    EXPECT_EQ(t->nbytes, nbytes);
    EXPECT_EQ(size_t(t->numel()) * dtype_size(dt), nbytes);
    if (nbytes) {
      ASSERT_NE(t->data, nullptr);
      EXPECT_EQ(std::memcmp(t->data, data, nbytes), 0);
    }
  };
  expect("z.u8", DType::kU8, {3}, u8.data(), 3);
  expect("a.f32", DType::kF32, {2, 3}, f32.data(), 24);
  expect("bf16", DType::kBF16, {3}, bf16.data(), 6);
  expect("f16", DType::kF16, {2, 2}, f16.data(), 8);
  expect("fp8", DType::kF8E4M3, {5}, fp8.data(), 5);
  expect("i64", DType::kI64, {4}, i64.data(), 32);
  expect("i32", DType::kI32, {1, 2}, i32.data(), 8);
  expect("scalar", DType::kF32, {}, &scalar, 4);
  expect("empty", DType::kBF16, {0, 4}, nullptr, 0);
  EXPECT_EQ(f.find("scalar")->numel(), 1);
  EXPECT_EQ(f.find("empty")->numel(), 0);
  EXPECT_EQ(f.find("missing"), nullptr);

  // Data laid out contiguously by decreasing element size; the data section starts 8-byte aligned.
  const char* order[] = {"i64", "a.f32", "i32", "scalar", "bf16", "f16", "z.u8", "fp8"};
  for (size_t i = 1; i < std::size(order); ++i) {
    const TensorInfo* a = f.find(order[i - 1]);
    const TensorInfo* b = f.find(order[i]);
    EXPECT_EQ(a->data + a->nbytes, b->data) << order[i - 1] << " then " << order[i];
  }
  uint64_t header_len = 0;
  std::ifstream(p, std::ios::binary).read(reinterpret_cast<char*>(&header_len), 8);
  EXPECT_EQ(header_len % 8, 0u);
  EXPECT_EQ(f.file_size(), 8 + header_len + w.data_bytes());
  for (const auto& [name, info] : f.tensors()) {
    if (info.data) {
      EXPECT_EQ(uintptr_t(info.data) % dtype_size(info.dtype), 0u) << name;
    }
  }
}

TEST_F(SafetensorsTest, WriterCopiesDataAtAddTime) {
  std::vector<int32_t> v = {1, 2, 3};
  SafetensorsWriter w;
  w.add("v", DType::kI32, {3}, v.data(), 12);
  v = {9, 9, 9};
  std::string p = path("copy.safetensors");
  ASSERT_TRUE(w.write(p).ok());
  Result<SafetensorsFile> r = SafetensorsFile::open(p);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(values_of<int32_t>(*r->find("v")), (std::vector<int32_t>{1, 2, 3}));
}

TEST_F(SafetensorsTest, WriteReplacesExistingFile) {
  std::string p = path("replace.safetensors");
  uint8_t a = 1, b[2] = {2, 3};
  SafetensorsWriter w1, w2;
  w1.add("a", DType::kU8, {1}, &a, 1);
  w2.add("b", DType::kU8, {2}, b, 2);
  ASSERT_TRUE(w1.write(p).ok());
  ASSERT_TRUE(w2.write(p).ok());
  Result<SafetensorsFile> r = SafetensorsFile::open(p);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->find("a"), nullptr);
  ASSERT_NE(r->find("b"), nullptr);
  EXPECT_EQ(values_of<uint8_t>(*r->find("b")), (std::vector<uint8_t>{2, 3}));
}

TEST_F(SafetensorsTest, EmptyWriterWritesAValidFile) {
  std::string p = path("nothing.safetensors");
  ASSERT_TRUE(SafetensorsWriter().write(p).ok());
  Result<SafetensorsFile> r = SafetensorsFile::open(p);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(r->tensors().empty());
  EXPECT_TRUE(r->metadata().empty());
}

TEST_F(SafetensorsTest, WriterRejectsBadTensorsWithoutCreatingTheFile) {
  uint8_t bytes[4] = {};
  auto check = [&](SafetensorsWriter& w, const std::string& name, const std::string& part) {
    std::string p = path(name);
    Status st = w.write(p);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find(p), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(part), std::string::npos) << st.message();
    EXPECT_FALSE(fs::exists(p));
    EXPECT_FALSE(fs::exists(p + ".tmp"));
  };
  SafetensorsWriter size_mismatch;
  size_mismatch.add("w", DType::kBF16, {3}, bytes, 4);
  check(size_mismatch, "size.safetensors", "tensor 'w': 4 bytes given but BF16 [3] needs 6");
  SafetensorsWriter dup;
  dup.add("w", DType::kU8, {1}, bytes, 1);
  dup.add("w", DType::kU8, {1}, bytes, 1);
  check(dup, "dup.safetensors", "tensor 'w': added twice");
  SafetensorsWriter reserved;
  reserved.add("__metadata__", DType::kU8, {1}, bytes, 1);
  check(reserved, "reserved.safetensors", "reserved");
  SafetensorsWriter negative;
  negative.add("n", DType::kU8, {-1}, bytes, 0);
  check(negative, "neg.safetensors", "tensor 'n': negative dimension -1");
  SafetensorsWriter not_utf8;
  not_utf8.add("bad\xff", DType::kU8, {1}, bytes, 1);
  check(not_utf8, "utf8.safetensors", "cannot encode header");
}

TEST_F(SafetensorsTest, WriteIntoMissingDirectoryIsIOError) {
  SafetensorsWriter w;
  std::string p = path("no/such/dir/x.safetensors");
  Status st = w.write(p);
  EXPECT_EQ(st.code(), StatusCode::kIOError) << st.to_string();
  EXPECT_NE(st.message().find(p), std::string::npos) << st.message();
}

TEST_F(SafetensorsTest, MovedFileKeepsDataValid) {
  std::vector<float> v = {1, 2, 3, 4};
  SafetensorsWriter w;
  w.add("v", DType::kF32, {4}, v.data(), 16);
  ASSERT_TRUE(w.write(path("a.safetensors")).ok());
  ASSERT_TRUE(w.write(path("b.safetensors")).ok());
  Result<SafetensorsFile> ra = SafetensorsFile::open(path("a.safetensors"));
  Result<SafetensorsFile> rb = SafetensorsFile::open(path("b.safetensors"));
  ASSERT_TRUE(ra.ok() && rb.ok());

  SafetensorsFile moved(std::move(ra).value());
  EXPECT_EQ(values_of<float>(*moved.find("v")), v);
  SafetensorsFile other = std::move(rb).value();
  other = std::move(moved);  // unmaps b, takes a
  EXPECT_EQ(other.path(), path("a.safetensors"));
  EXPECT_EQ(values_of<float>(*other.find("v")), v);
}

// ---------------------------------------------------------------------- written by Python

// tests/data/safetensors/py_written.safetensors comes from tools/gen_safetensors_fixture.py
// (the reference `safetensors` package via torch); these are the values that script writes.
TEST(SafetensorsPython, ReadsFileWrittenByPythonSafetensors) {
  const std::string p = "tests/data/safetensors/py_written.safetensors";
  Result<SafetensorsFile> r = SafetensorsFile::open(p);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const SafetensorsFile& f = *r;
  EXPECT_EQ(f.tensors().size(), 6u);
  EXPECT_EQ(f.metadata(), (std::map<std::string, std::string>{
                              {"format", "pt"}, {"producer", "gen_safetensors_fixture"}}));

  const TensorInfo* t = f.find("f32");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, DType::kF32);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(values_of<float>(*t), (std::vector<float>{1.5f, -2.0f, 3.25f, 0.0f, 1e-3f, -65504.0f}));

  t = f.find("bf16");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, DType::kBF16);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{4}));
  std::vector<float> bf;
  for (uint16_t b : values_of<uint16_t>(*t)) bf.push_back(bf16_to_f32(b));
  EXPECT_EQ(bf, (std::vector<float>{1.0f, -0.5f, 3.0f, 256.0f}));

  t = f.find("fp8");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, DType::kF8E4M3);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{2, 2}));
  std::vector<float> f8;
  for (uint8_t b : values_of<uint8_t>(*t)) f8.push_back(fp8e4m3_to_f32(b));
  EXPECT_EQ(f8, (std::vector<float>{1.0f, -2.0f, 448.0f, 0.015625f}));

  t = f.find("i64");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, DType::kI64);
  EXPECT_EQ(values_of<int64_t>(*t), (std::vector<int64_t>{-1, 0, int64_t(1) << 40}));

  t = f.find("scalar_i32");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, DType::kI32);
  EXPECT_TRUE(t->shape.empty());
  EXPECT_EQ(values_of<int32_t>(*t), (std::vector<int32_t>{7}));

  t = f.find("u8_empty");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, DType::kU8);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(t->nbytes, 0u);
}

// ---------------------------------------------------------------------------------- bad input

TEST_F(SafetensorsTest, MissingFileIsNotFound) {
  std::string p = path("absent.safetensors");
  Result<SafetensorsFile> r = SafetensorsFile::open(p);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find(p), std::string::npos) << r.status().message();
}

TEST_F(SafetensorsTest, DirectoryIsIOError) {
  Result<SafetensorsFile> r = SafetensorsFile::open(dir_.string());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kIOError);
  EXPECT_NE(r.status().message().find(dir_.string()), std::string::npos);
}

TEST_F(SafetensorsTest, FileTooShortForLengthPrefix) {
  expect_corrupt(write_bytes("empty.safetensors", ""), {"0 bytes", "too short"});
  expect_corrupt(write_bytes("five.safetensors", std::string("\x10\0\0\0\0", 5)),
                 {"5 bytes", "too short"});
}

TEST_F(SafetensorsTest, BadHeaderLength) {
  expect_corrupt(write_raw("zero.safetensors", "{}", 0, 0), {"header length is 0"});
  expect_corrupt(write_raw("huge.safetensors", "{}", 0, uint64_t(1) << 40),
                 {"header length 1099511627776 exceeds"});
  expect_corrupt(write_raw("max.safetensors", "{}", 0, UINT64_MAX), {"exceeds"});
  expect_corrupt(write_raw("past_eof.safetensors", "{}      ", 4, 1000),
                 {"header length 1000 runs past the end of the file (20 bytes)"});
}

TEST_F(SafetensorsTest, HeaderNotAJsonObject) {
  expect_corrupt(write_raw("bad_json.safetensors", "{\"a\": {\"dtype\": ", 0), {"not valid JSON"});
  expect_corrupt(write_raw("trailing.safetensors", "{} x", 0), {"not valid JSON"});
  expect_corrupt(write_raw("array.safetensors", "[1, 2]", 0), {"not a JSON object"});
  expect_corrupt(write_raw("string.safetensors", "\"hi\"", 0), {"not a JSON object"});
  // nlohmann stops at a NUL byte; what follows it must not be silently ignored.
  expect_corrupt(write_raw("nul.safetensors", std::string("{}\0 x", 5), 0), {"NUL byte"});
}

// A hostile header nests arrays 200k deep (a recursive parser would need tens of MB of stack);
// parsing and freeing it must not recurse.
TEST_F(SafetensorsTest, DeeplyNestedHeaderDoesNotOverflowTheStack) {
  const size_t depth = 200000;
  std::string open_only = "{\"w\": " + std::string(depth, '[') + "}";
  expect_corrupt(write_raw("deep_open.st", open_only, 0), {"not valid JSON"});
  std::string closed = "{\"w\": " + std::string(depth, '[') + std::string(depth, ']') + "}";
  expect_corrupt(write_raw("deep_closed.st", closed, 0), {"tensor 'w'", "not a JSON object"});
}

TEST_F(SafetensorsTest, EntryMissingOrMistypedFields) {
  const std::string dt = R"("dtype": "U8")", sh = R"("shape": [4])",
                    off = R"("data_offsets": [0, 4])";
  auto file = [&](const std::string& name, const std::string& body) {
    return write_raw(name, "{\"model.w\": {" + body + "}}", 4);
  };
  expect_corrupt(file("no_dtype.st", sh + "," + off), {"tensor 'model.w'", "no 'dtype'"});
  expect_corrupt(file("no_shape.st", dt + "," + off), {"tensor 'model.w'", "no 'shape'"});
  expect_corrupt(file("no_off.st", dt + "," + sh), {"tensor 'model.w'", "no 'data_offsets'"});
  expect_corrupt(file("dtype_int.st", R"("dtype": 5,)" + sh + "," + off),
                 {"tensor 'model.w'", "'dtype' is not a string"});
  expect_corrupt(file("shape_str.st", dt + R"(, "shape": "4",)" + off),
                 {"tensor 'model.w'", "'shape' is not an array"});
  expect_corrupt(file("shape_float.st", dt + R"(, "shape": [4.0],)" + off),
                 {"tensor 'model.w'", "non-integer"});
  expect_corrupt(file("off_one.st", dt + "," + sh + R"(, "data_offsets": [4])"),
                 {"tensor 'model.w'", "'data_offsets' is not two non-negative integers"});
  expect_corrupt(file("off_neg.st", dt + "," + sh + R"(, "data_offsets": [-1, 3])"),
                 {"tensor 'model.w'", "'data_offsets' is not two"});
  expect_corrupt(file("off_str.st", dt + "," + sh + R"(, "data_offsets": ["0", "4"])"),
                 {"tensor 'model.w'", "'data_offsets' is not two"});
  expect_corrupt(write_raw("not_obj.st", R"({"model.w": [1, 2]})", 0),
                 {"tensor 'model.w'", "not a JSON object"});
}

TEST_F(SafetensorsTest, UnknownDtype) {
  expect_corrupt(write_raw("dtype.st", R"({"w": {"dtype": "F128", "shape": [1],
                 "data_offsets": [0, 16]}})",
                           16),
                 {"tensor 'w'", "unknown dtype 'F128'"});
}

TEST_F(SafetensorsTest, BadDimensions) {
  expect_corrupt(write_raw("neg.st", R"({"w": {"dtype": "U8", "shape": [2, -3],
                 "data_offsets": [0, 6]}})",
                           6),
                 {"tensor 'w'", "negative dimension -3"});
  expect_corrupt(write_raw("big.st", R"({"w": {"dtype": "U8", "shape": [9223372036854775808],
                 "data_offsets": [0, 6]}})",
                           6),
                 {"tensor 'w'", "dimension 9223372036854775808 is too large"});
}

TEST_F(SafetensorsTest, BadOffsets) {
  expect_corrupt(write_raw("backwards.st", R"({"w": {"dtype": "U8", "shape": [0],
                 "data_offsets": [4, 2]}})",
                           4),
                 {"tensor 'w'", "data_offsets [4, 2] end before begin"});
  expect_corrupt(write_raw("past.st", R"({"w": {"dtype": "U8", "shape": [12],
                 "data_offsets": [0, 12]}})",
                           8),
                 {"tensor 'w'", "data_offsets [0, 12] past the end of the data section (8 bytes)"});
}

TEST_F(SafetensorsTest, TruncatedDataSection) {
  std::vector<float> v(16, 1.0f);
  SafetensorsWriter w;
  w.add("a", DType::kF32, {16}, v.data(), 64);
  w.add("model.layers.0.w", DType::kF32, {16}, v.data(), 64);
  std::string p = path("truncated.safetensors");
  ASSERT_TRUE(w.write(p).ok());
  fs::resize_file(p, fs::file_size(p) - 1);
  expect_corrupt(p, {"tensor 'model.layers.0.w'", "data_offsets [64, 128] past the end"});
}

TEST_F(SafetensorsTest, SizeDoesNotMatchDtypeAndShape) {
  std::string p = write_raw("model-00001-of-00002.safetensors",
                            R"({"model.norm.weight": {"dtype": "BF16", "shape": [7168],
                                "data_offsets": [0, 10]}})",
                            10);
  expect_corrupt(p, {": tensor 'model.norm.weight': data_offsets [0, 10] hold 10 bytes but "
                     "BF16 [7168] needs 14336"});
  // 2^62 * 2^62 elements overflow 64 bits; must not wrap around to a small "match".
  expect_corrupt(write_raw("overflow.st", R"({"w": {"dtype": "I64",
                 "shape": [4611686018427387904, 4611686018427387904], "data_offsets": [0, 0]}})",
                           0),
                 {"tensor 'w'", "needs more than 2^64"});
  // 2^61 elements * 8 bytes wraps to exactly 0 in 64 bits.
  expect_corrupt(write_raw("overflow2.st", R"({"w": {"dtype": "I64",
                 "shape": [2305843009213693952], "data_offsets": [0, 0]}})",
                           0),
                 {"tensor 'w'", "needs more than 2^64"});
}

TEST_F(SafetensorsTest, OverlappingTensors) {
  expect_corrupt(write_raw("overlap.st", R"({"a": {"dtype": "U8", "shape": [8],
                 "data_offsets": [0, 8]}, "b": {"dtype": "U8", "shape": [8],
                 "data_offsets": [4, 12]}})",
                           12),
                 {"tensor 'b': data_offsets [4, 12] overlap tensor 'a' [0, 8]"});
  expect_corrupt(write_raw("same.st", R"({"a": {"dtype": "U8", "shape": [8],
                 "data_offsets": [0, 8]}, "b": {"dtype": "I32", "shape": [2],
                 "data_offsets": [0, 8]}})",
                           8),
                 {"overlap tensor"});
}

TEST_F(SafetensorsTest, UnindexedBytesInDataSection) {
  expect_corrupt(write_raw("hole.st", R"({"a": {"dtype": "U8", "shape": [4],
                 "data_offsets": [0, 4]}, "b": {"dtype": "U8", "shape": [4],
                 "data_offsets": [8, 12]}})",
                           12),
                 {"tensor 'b'", "bytes [4, 8) before it belong to no tensor"});
  expect_corrupt(write_raw("tail.st", R"({"a": {"dtype": "U8", "shape": [4],
                 "data_offsets": [0, 4]}})",
                           6),
                 {"bytes [4, 6) belong to no tensor"});
}

TEST_F(SafetensorsTest, ZeroByteTensorsMayShareAnOffset) {
  std::string p = write_raw("zero.st", R"({"a": {"dtype": "U8", "shape": [4],
                 "data_offsets": [0, 4]}, "e1": {"dtype": "F32", "shape": [0, 5],
                 "data_offsets": [2, 2]}, "e2": {"dtype": "F32", "shape": [0],
                 "data_offsets": [4, 4]}})",
                            4);
  Result<SafetensorsFile> r = SafetensorsFile::open(p);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->find("e1")->nbytes, 0u);
  EXPECT_EQ(r->find("e2")->nbytes, 0u);
  EXPECT_EQ(values_of<uint8_t>(*r->find("a")), (std::vector<uint8_t>{0, 1, 2, 3}));
}

TEST_F(SafetensorsTest, Metadata) {
  std::string ok = write_raw("meta.st", R"({"__metadata__": {"format": "pt", "x": ""}})", 0);
  Result<SafetensorsFile> r = SafetensorsFile::open(ok);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"x", ""}}));
  EXPECT_TRUE(r->tensors().empty());

  expect_corrupt(write_raw("meta_int.st", R"({"__metadata__": {"format": 1}})", 0),
                 {"'__metadata__' value for 'format' is not a string"});
  expect_corrupt(write_raw("meta_arr.st", R"({"__metadata__": ["a"]})", 0),
                 {"'__metadata__' is not a JSON object"});
}

}  // namespace
}  // namespace moeserve
