#include "model/weight_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>

#include <fmt/format.h>
#include <xxhash.h>

#include "core/file_pages.h"

namespace moeserve {
namespace {

constexpr char kMagic[8] = {'M', 'S', 'W', 'C', 'A', 'C', 'H', '1'};
constexpr uint64_t kAlign = 4096;

enum class Kind : uint32_t { kFp8 = 1, kInt8 = 2, kBf16 = 3, kRows = 4, kInt4 = 5, kFp4 = 6 };

struct FileHeader {
  char magic[8];
  uint64_t key;
  uint64_t n_items;
  uint64_t file_bytes;
  uint64_t table_hash;  // XXH3 of the entry table
};

struct Entry {
  uint32_t kind;
  uint32_t reserved;
  int64_t n, k;
  uint64_t offset;       // of the data; the scales follow it
  uint64_t data_bytes;   // tiles (or the int32 rows)
  uint64_t scale_bytes;  // float scales after the data
  uint64_t hash;         // XXH3 of data and scales
};

uint64_t align_up(uint64_t v) {
  return (v + kAlign - 1) / kAlign * kAlign;
}

std::string errno_text(int e) {
  return std::strerror(e);
}

// An item's kind and its bytes as they are held in memory.
struct View {
  Kind kind;
  int64_t n = 0, k = 0;
  const void* data = nullptr;
  uint64_t data_bytes = 0;
  const float* scales = nullptr;
  uint64_t scale_bytes = 0;
};

View view_of(const CachedWeight& c) {
  if (c.fp8) {
    return {Kind::kFp8,
            c.fp8->n,
            c.fp8->k,
            c.fp8->data.get(),
            c.fp8->bytes(),
            c.fp8->scale_inv.data(),
            c.fp8->scale_inv.size() * sizeof(float)};
  }
  if (c.int8) {
    const uint64_t tiles =
        uint64_t(c.int8->n_panels() * c.int8->k_blocks()) * uint64_t(PackedInt8Weight::kTileBytes);
    return {Kind::kInt8,
            c.int8->n,
            c.int8->k,
            c.int8->data.get(),
            tiles,
            c.int8->scales.data(),
            c.int8->scales.size() * sizeof(float)};
  }
  if (c.int4) {
    return {Kind::kInt4,
            c.int4->n,
            c.int4->k,
            c.int4->data.get(),
            c.int4->tile_bytes(),
            c.int4->scales.data(),
            c.int4->scales.size() * sizeof(float)};
  }
  if (c.fp4) return {Kind::kFp4, c.fp4->n, c.fp4->k, c.fp4->data.get(), c.fp4->bytes()};
  if (c.bf16) return {Kind::kBf16, c.bf16->n, c.bf16->k, c.bf16->data.get(), c.bf16->bytes()};
  return {Kind::kRows, int64_t(c.rows->size()), 1, c.rows->data(), c.rows->size() * 4};
}

Kind kind_of(const CachedWeight& c) {
  return c.fp8    ? Kind::kFp8
         : c.int8 ? Kind::kInt8
         : c.int4 ? Kind::kInt4
         : c.fp4  ? Kind::kFp4
         : c.bf16 ? Kind::kBf16
                  : Kind::kRows;
}

// The bytes an entry of this kind and shape must have: {data, scales}.
std::pair<uint64_t, uint64_t> expected_bytes(Kind kind, int64_t n, int64_t k) {
  const uint64_t panels = uint64_t((n + 63) / 64), kb = uint64_t((k + 127) / 128);
  switch (kind) {
    case Kind::kFp8:
      return {panels * kb * uint64_t(PackedFp8Weight::kTileBytes),
              uint64_t((n + 127) / 128) * kb * sizeof(float)};
    case Kind::kInt8:
      return {panels * kb * uint64_t(PackedInt8Weight::kTileBytes), panels * kb * 64 * 4};
    case Kind::kInt4:
      return {panels * kb * uint64_t(PackedInt4Weight::kTileBytes), panels * kb * 2 * 64 * 4};
    case Kind::kFp4:
      return {panels * kb * uint64_t(PackedFp4Weight::kTileBytes), 0};
    case Kind::kBf16:
      return {panels * kb * uint64_t(PackedBf16Weight::kTileElems) * 2, 0};
    case Kind::kRows:
      return {uint64_t(n) * 4, 0};
  }
  return {0, 0};
}

Status write_all(int fd, const void* p, uint64_t n, uint64_t at, const std::string& path) {
  const auto* b = static_cast<const uint8_t*>(p);
  while (n > 0) {
    const size_t chunk = size_t(std::min<uint64_t>(n, 1 << 30));
    const ssize_t w = ::pwrite(fd, b, chunk, off_t(at));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return IOError(path + ": write failed: " + errno_text(errno));
    b += w;
    at += uint64_t(w);
    n -= uint64_t(w);
  }
  return Status::Ok();
}

uint64_t entry_hash(const void* data, uint64_t data_bytes, const void* scales,
                    uint64_t scale_bytes) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  XXH3_64bits_update(st, data, size_t(data_bytes));
  if (scale_bytes) XXH3_64bits_update(st, scales, size_t(scale_bytes));
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

// The mapping a loaded file's weights point into; unmapped with the last of them.
struct Mapping {
  void* base = nullptr;
  size_t bytes = 0;
  ~Mapping() {
    if (base) ::munmap(base, bytes);
  }
};

}  // namespace

std::string weight_cache_path(const std::string& dir, uint64_t key) {
  return fmt::format("{}/{:016x}.weights", dir, key);
}

bool add_weight_place(XXH3_state_t* st, const WeightView& w) {
  const std::optional<MappedLocation> at = mapped_location(w.data);
  if (!at) return false;
  const std::string name = std::filesystem::path(at->path).filename().string();
  XXH3_64bits_update(st, name.data(), name.size());
  XXH3_64bits_update(st, &at->offset, sizeof at->offset);
  XXH3_64bits_update(st, &w.rows, sizeof w.rows);
  XXH3_64bits_update(st, &w.cols, sizeof w.cols);
  return true;
}

Status save_weight_cache(const std::string& path, uint64_t key,
                         std::span<const CachedWeight> items) {
  std::vector<Entry> table(items.size());
  std::vector<View> views(items.size());
  uint64_t at = align_up(sizeof(FileHeader) + items.size() * sizeof(Entry));
  for (size_t i = 0; i < items.size(); ++i) {
    const View v = view_of(items[i]);
    views[i] = v;
    table[i] = {uint32_t(v.kind),
                0,
                v.n,
                v.k,
                at,
                v.data_bytes,
                v.scale_bytes,
                entry_hash(v.data, v.data_bytes, v.scales, v.scale_bytes)};
    at += v.data_bytes + v.scale_bytes;
    if (i + 1 < items.size()) at = align_up(at);  // (no padding after the last)
  }
  FileHeader h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.key = key;
  h.n_items = items.size();
  h.file_bytes = at;
  h.table_hash = XXH3_64bits(table.data(), table.size() * sizeof(Entry));

  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  if (ec) return IOError(dir.string() + ": cannot create the directory: " + ec.message());
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return IOError(tmp + ": cannot create: " + errno_text(errno));
  auto fail = [&](Status s) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return s;
  };
  if (::ftruncate(fd, off_t(at)) != 0) {
    return fail(
        IOError(tmp + ": cannot size to " + std::to_string(at) + " bytes: " + errno_text(errno)));
  }
  if (Status s = write_all(fd, &h, sizeof h, 0, tmp); !s.ok()) return fail(s);
  if (Status s = write_all(fd, table.data(), table.size() * sizeof(Entry), sizeof h, tmp);
      !s.ok()) {
    return fail(s);
  }
  for (size_t i = 0; i < items.size(); ++i) {
    const View& v = views[i];
    if (Status s = write_all(fd, v.data, v.data_bytes, table[i].offset, tmp); !s.ok()) {
      return fail(s);
    }
    if (Status s = write_all(fd, v.scales, v.scale_bytes, table[i].offset + v.data_bytes, tmp);
        !s.ok()) {
      return fail(s);
    }
  }
  if (::fsync(fd) != 0) return fail(IOError(tmp + ": fsync failed: " + errno_text(errno)));
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    return IOError(path + ": cannot rename into place: " + errno_text(e));
  }
  return Status::Ok();
}

Status load_weight_cache(const std::string& path, uint64_t key, std::span<CachedWeight> items,
                         ThreadPool* pool) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT) return NotFound(path + ": no weight cache");
    return IOError(path + ": cannot open: " + errno_text(e));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || st.st_size < off_t(sizeof(FileHeader))) {
    ::close(fd);
    return Corrupt(path + ": too short for a weight cache header");
  }
  auto map = std::make_shared<Mapping>();
  map->bytes = size_t(st.st_size);
  map->base = ::mmap(nullptr, map->bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_err = errno;
  ::close(fd);
  if (map->base == MAP_FAILED) {
    map->base = nullptr;
    return IOError(path + ": mmap failed: " + errno_text(map_err));
  }
  const auto* base = static_cast<const uint8_t*>(map->base);
  FileHeader h;
  std::memcpy(&h, base, sizeof h);
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) {
    return Corrupt(path + ": not a moeserve weight cache (bad magic)");
  }
  if (h.key != key) {
    return Corrupt(fmt::format("{}: holds key {:016x}, not {:016x}", path, h.key, key));
  }
  if (h.n_items != items.size() || h.file_bytes != map->bytes ||
      sizeof h + h.n_items * sizeof(Entry) > map->bytes) {
    return Corrupt(fmt::format("{}: {} entries in {} bytes, expected {} entries in {} bytes", path,
                               h.n_items, map->bytes, items.size(), h.file_bytes));
  }
  std::vector<Entry> table(items.size());
  std::memcpy(table.data(), base + sizeof h, table.size() * sizeof(Entry));
  if (XXH3_64bits(table.data(), table.size() * sizeof(Entry)) != h.table_hash) {
    return Corrupt(path + ": entry table checksum mismatch");
  }
  for (size_t i = 0; i < items.size(); ++i) {
    const Entry& e = table[i];
    const auto [data_bytes, scale_bytes] = expected_bytes(Kind(e.kind), e.n, e.k);
    if (e.kind != uint32_t(kind_of(items[i])) || e.n < 0 || e.k < 1 || e.offset % kAlign != 0 ||
        e.data_bytes != data_bytes || e.scale_bytes != scale_bytes ||
        e.offset + e.data_bytes + e.scale_bytes > map->bytes) {
      return Corrupt(fmt::format("{}: entry {} (kind {}, {}x{}) does not fit the model", path, i,
                                 e.kind, e.n, e.k));
    }
  }
  // Every entry's bytes against its checksum (in parallel: this reads the whole file).
  std::atomic<int64_t> bad{-1};
  auto check = [&](int64_t b, int64_t end) {
    for (int64_t i = b; i < end; ++i) {
      const Entry& e = table[size_t(i)];
      const uint8_t* p = base + e.offset;
      if (entry_hash(p, e.data_bytes, p + e.data_bytes, e.scale_bytes) != e.hash) bad = i;
    }
  };
  if (pool) {
    pool->parallel_for(int64_t(table.size()), check);
  } else {
    check(0, int64_t(table.size()));
  }
  if (bad >= 0) {
    return Corrupt(
        fmt::format("{}: entry {} checksum mismatch (the file is damaged)", path, int64_t(bad)));
  }
  for (size_t i = 0; i < items.size(); ++i) {
    const Entry& e = table[i];
    const uint8_t* p = base + e.offset;
    const auto* scales = reinterpret_cast<const float*>(p + e.data_bytes);
    const size_t n_scales = size_t(e.scale_bytes / sizeof(float));
    CachedWeight& c = items[i];
    if (c.fp8) {
      c.fp8->n = e.n;
      c.fp8->k = e.k;
      c.fp8->data = std::shared_ptr<uint8_t[]>(map, const_cast<uint8_t*>(p));
      c.fp8->scale_inv.assign(scales, scales + n_scales);
    } else if (c.int8) {
      c.int8->n = e.n;
      c.int8->k = e.k;
      c.int8->data =
          std::shared_ptr<int8_t[]>(map, reinterpret_cast<int8_t*>(const_cast<uint8_t*>(p)));
      c.int8->scales.assign(scales, scales + n_scales);
    } else if (c.int4) {
      c.int4->n = e.n;
      c.int4->k = e.k;
      c.int4->data = std::shared_ptr<uint8_t[]>(map, const_cast<uint8_t*>(p));
      c.int4->scales.assign(scales, scales + n_scales);
    } else if (c.fp4) {
      c.fp4->n = e.n;
      c.fp4->k = e.k;
      c.fp4->data = std::shared_ptr<uint8_t[]>(map, const_cast<uint8_t*>(p));
    } else if (c.bf16) {
      c.bf16->n = e.n;
      c.bf16->k = e.k;
      c.bf16->data =
          std::shared_ptr<uint16_t[]>(map, reinterpret_cast<uint16_t*>(const_cast<uint8_t*>(p)));
    } else {
      const auto* r = reinterpret_cast<const int32_t*>(p);
      c.rows->assign(r, r + e.n);
    }
  }
  return Status::Ok();
}

}  // namespace moeserve
