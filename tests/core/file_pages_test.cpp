// release_file_pages: pages of a registered read-only file mapping leave the resident set (read
// from /proc/self/smaps) and read back the same bytes; memory that is not a registered mapping
// is never touched.
#include "core/file_pages.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace moeserve {
namespace {

// Resident kB of the mapping that starts at `base`, from /proc/self/smaps.
int64_t resident_kb(const void* base) {
  std::ifstream in("/proc/self/smaps");
  char want[32];
  std::snprintf(want, sizeof want, "%lx-", static_cast<unsigned long>(uintptr_t(base)));
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(want, 0) == 0) {
      inside = true;
    } else if (inside && line.rfind("Rss:", 0) == 0) {
      return std::stoll(line.substr(4));
    }
  }
  return -1;
}

struct MappedFile {
  explicit MappedFile(size_t n) : bytes(n) {
    char path[] = "/tmp/file_pages_testXXXXXX";
    const int fd = mkstemp(path);
    EXPECT_GE(fd, 0);
    unlink(path);
    std::vector<uint8_t> data(n);
    for (size_t i = 0; i < n; ++i) data[i] = uint8_t(i * 7 + i / 4096);
    EXPECT_EQ(write(fd, data.data(), n), ssize_t(n));
    base = static_cast<const uint8_t*>(mmap(nullptr, n, PROT_READ, MAP_PRIVATE, fd, 0));
    close(fd);
    EXPECT_NE(base, MAP_FAILED);
  }
  ~MappedFile() { munmap(const_cast<uint8_t*>(base), bytes); }
  uint64_t sum(size_t begin, size_t end) const {
    uint64_t s = 0;
    for (size_t i = begin; i < end; ++i) s += base[i] * (i + 1);
    return s;
  }
  size_t bytes;
  const uint8_t* base;
};

TEST(FilePages, ARegisteredMappingGivesItsPagesBackAndReadsTheSameBytes) {
  const size_t page = size_t(sysconf(_SC_PAGESIZE)), n = 256 * page;
  MappedFile f(n);
  const uint64_t before = f.sum(0, n);  // touches every page
  EXPECT_GE(resident_kb(f.base), int64_t(n / 1024) * 9 / 10);
  register_file_mapping(f.base, n, "/some/file");
  auto at = mapped_location(f.base + 5 * page + 3);
  ASSERT_TRUE(at.has_value());
  EXPECT_EQ(at->path, "/some/file");
  EXPECT_EQ(at->offset, 5 * page + 3);
  EXPECT_FALSE(mapped_location(f.base + n).has_value());
  // A range that starts and ends mid-page: only the whole pages inside it go.
  EXPECT_EQ(release_file_pages(f.base + page / 2, n - page), n - 2 * page);
  EXPECT_LE(resident_kb(f.base), int64_t(2 * page / 1024));
  EXPECT_EQ(f.sum(0, n), before);  // faulted back in from the file, unchanged
  EXPECT_GE(resident_kb(f.base), int64_t(n / 1024) * 9 / 10);
  // Ranges not inside it release nothing.
  EXPECT_EQ(release_file_pages(f.base + n - page, 2 * page), 0u);
  EXPECT_EQ(release_file_pages(f.base + page, page / 2), 0u);  // no whole page
  unregister_file_mapping(f.base);
  EXPECT_EQ(release_file_pages(f.base, n), 0u);
  EXPECT_GE(resident_kb(f.base), int64_t(n / 1024) * 9 / 10);
}

TEST(FilePages, AnonymousMemoryIsNeverTouched) {
  const size_t page = size_t(sysconf(_SC_PAGESIZE)), n = 64 * page;
  std::vector<uint8_t> heap(n, 0xab);
  EXPECT_EQ(release_file_pages(heap.data(), n), 0u);
  for (uint8_t b : heap) ASSERT_EQ(b, 0xab);  // MADV_DONTNEED would have zeroed it
}

}  // namespace
}  // namespace moeserve
