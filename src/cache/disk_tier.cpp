#include "cache/disk_tier.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include <fmt/format.h>
#include <xxh_x86dispatch.h>
#include <xxhash.h>

#include "core/check.h"

namespace moeserve {

namespace fs = std::filesystem;

namespace {

constexpr uint32_t kMagic = 0x564B534D;  // "MSKV" read as a little-endian u32
constexpr size_t kHeaderBytes = 4 + 4 + 8 + 8 + 8 + 4 + 4 + 8 + 8;

template <class T>
void put(std::vector<uint8_t>& out, T v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  out.insert(out.end(), p, p + sizeof v);
}

template <class T>
T get(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Reads exactly n bytes at offset off; false on an error or end of file.
bool read_at(int fd, uint8_t* p, size_t n, off_t off) {
  while (n > 0) {
    ssize_t r = ::pread(fd, p, n, off);
    if (r <= 0) return false;
    p += r;
    n -= size_t(r);
    off += r;
  }
  return true;
}

// Payload bytes read (and checksummed) at a time: a piece is hashed while it is still in L2.
constexpr size_t kReadPiece = size_t(256) << 10;
// Objects of a load asked of the device ahead of the one being read.
constexpr int32_t kReadAhead = 2;
// A temporary file older than this is a dead writer's (a live one renames it within a write).
constexpr std::chrono::minutes kStaleTemp{10};

}  // namespace

const char* to_string(DiskReject r) {
  switch (r) {
    case DiskReject::kShort:
      return "short";
    case DiskReject::kMagic:
      return "magic";
    case DiskReject::kVersion:
      return "version";
    case DiskReject::kFingerprint:
      return "fingerprint";
    case DiskReject::kIdentity:
      return "identity";
    case DiskReject::kSize:
      return "size";
    case DiskReject::kChecksum:
      return "checksum";
  }
  return "?";
}

Result<std::unique_ptr<DiskTier>> DiskTier::open(const DiskTierOptions& o, uint64_t fingerprint,
                                                 size_t block_bytes) {
  std::error_code ec;
  fs::create_directories(o.dir, ec);
  if (ec || !fs::is_directory(o.dir)) {
    return IOError(fmt::format("--kv-disk {}: not a usable directory ({})", o.dir,
                               ec ? ec.message() : "not a directory"));
  }
  if (o.capacity_gb < 0 || o.max_queued < 1) {
    return InvalidArgument("--kv-disk-gb must be >= 0 and the write queue >= 1 block");
  }
  return std::unique_ptr<DiskTier>(new DiskTier(o, fingerprint, block_bytes));
}

DiskTier::DiskTier(const DiskTierOptions& o, uint64_t fingerprint, size_t block_bytes)
    : options_(o),
      fingerprint_(fingerprint),
      block_bytes_(block_bytes),
      writer_([this] { writer_loop(); }),
      reader_([this] { reader_loop(); }) {}

DiskTier::~DiskTier() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  load_cv_.notify_all();
  writer_.join();
  reader_.join();
}

std::string DiskTier::object_path(uint64_t hash) const {
  const std::string name = fmt::format("{:016x}", hash);
  return fmt::format("{}/{}/{}.kv", options_.dir, name.substr(0, 2), name);
}

DiskTierStats DiskTier::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void DiskTier::reject(const std::string& path, DiskReject why) {
  ::unlink(path.c_str());  // another process may have removed it already
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.rejected[size_t(why)];
}

bool DiskTier::contains(uint64_t hash) {
  if (::access(object_path(hash).c_str(), F_OK) == 0) return true;
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.misses;
  return false;
}

void DiskTier::load(std::shared_ptr<KvLoadJob> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    loads_.push_back(std::move(job));
  }
  load_cv_.notify_one();
}

void DiskTier::reader_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    load_cv_.wait(lock, [&] { return stop_ || !loads_.empty(); });
    if (loads_.empty()) break;
    std::shared_ptr<KvLoadJob> job = std::move(loads_.front());
    loads_.pop_front();
    if (stop_) {  // (a cache still waiting is told nothing arrived)
      lock.unlock();
      job->finish(0);
      lock.lock();
      continue;
    }
    lock.unlock();
    // The device reads kReadAhead objects ahead of the one being verified (the kernel's
    // readahead stays within one file).
    for (int32_t i = 1; i <= kReadAhead && i < job->size(); ++i) prefetch(job->hashes[size_t(i)]);
    int32_t n = 0;
    while (n < job->size() &&
           read_block(job->hashes[size_t(n)], job->parent_of(n), job->tokens_of(n), *job, n)) {
      if (n + 1 + kReadAhead < job->size()) prefetch(job->hashes[size_t(n + 1 + kReadAhead)]);
      ++n;
    }
    job->finish(n);
    lock.lock();
  }
}

void DiskTier::prefetch(uint64_t hash) const {
  int fd = ::open(object_path(hash).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_WILLNEED);
  ::close(fd);
}

bool DiskTier::read_block(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens,
                          const KvLoadJob& job, int32_t i) {
  const std::string path = object_path(hash);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.misses;
    return false;
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return reject(path, DiskReject::kShort), false;
  const size_t file_size = size_t(st.st_size);
  const size_t head_bytes = kHeaderBytes + tokens.size() * 4;
  uint8_t head[kHeaderBytes + kKvBlockSize * 4];
  CHECK(head_bytes <= sizeof head, "a block of kKvBlockSize tokens");
  if (file_size < kHeaderBytes || !read_at(fd, head, kHeaderBytes, 0)) {
    return reject(path, DiskReject::kShort), false;
  }
  const uint8_t* p = head;
  if (get<uint32_t>(p) != kMagic) return reject(path, DiskReject::kMagic), false;
  if (get<uint32_t>(p + 4) != kDiskFormatVersion) return reject(path, DiskReject::kVersion), false;
  if (get<uint64_t>(p + 8) != fingerprint_) return reject(path, DiskReject::kFingerprint), false;
  const uint32_t n_tokens = get<uint32_t>(p + 32);
  const uint64_t payload = get<uint64_t>(p + 40), checksum = get<uint64_t>(p + 48);
  if (payload != block_bytes_) return reject(path, DiskReject::kSize), false;
  if (n_tokens != tokens.size()) return reject(path, DiskReject::kIdentity), false;
  const size_t want = head_bytes + size_t(payload);
  if (file_size < want) return reject(path, DiskReject::kShort), false;
  if (file_size > want) return reject(path, DiskReject::kSize), false;
  if (!read_at(fd, head + kHeaderBytes, head_bytes - kHeaderBytes, kHeaderBytes)) {
    return reject(path, DiskReject::kShort), false;
  }
  if (get<uint64_t>(p + 16) != hash || get<uint64_t>(p + 24) != parent ||
      std::memcmp(head + kHeaderBytes, tokens.data(), tokens.size() * 4) != 0) {
    return reject(path, DiskReject::kIdentity), false;
  }
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(),
                                                                 &XXH3_freeState);
  CHECK(state != nullptr, "out of memory");
  XXH3_64bits_reset(state.get());
  // (Bytes that go nowhere, a window region the loading sequence does not read, are read into
  // a piece of scratch for the checksum.)
  std::vector<uint8_t> scratch;
  for (size_t at = 0; at < payload;) {
    const size_t n = job.piece(at, std::min<size_t>(kReadPiece, payload - at));
    uint8_t* dest = job.dest_at(i, at);
    if (!dest) {
      scratch.resize(kReadPiece);
      dest = scratch.data();
    }
    if (!read_at(fd, dest, n, off_t(head_bytes + at))) {
      return reject(path, DiskReject::kShort), false;  // shrank under us
    }
    XXH3_64bits_update_dispatch(state.get(), dest, n);
    at += n;
  }
  if (XXH3_64bits_digest(state.get()) != checksum)
    return reject(path, DiskReject::kChecksum), false;
  ::futimens(fd, nullptr);  // recently used (the budget's LRU order)
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.hits;
  stats_.bytes_read += int64_t(want);
  return true;
}

void DiskTier::enqueue(KvBlock block) {
  if (!block.hash || block.bytes.size() != block_bytes_) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stats_.writes_disabled) return;
    if (int64_t(queue_.size()) >= options_.max_queued) {
      ++stats_.write_drops;
      return;
    }
    queue_.push_back(std::move(block));
  }
  cv_.notify_one();
}

void DiskTier::flush() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [&] { return queue_.empty() && !writing_; });
}

void DiskTier::writer_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) break;  // stopping, nothing left
    KvBlock b = std::move(queue_.front());
    queue_.pop_front();
    writing_ = true;
    lock.unlock();
    Status st = write_object(b);
    lock.lock();
    writing_ = false;
    if (!st.ok()) {
      ++stats_.write_errors;
      if (!stats_.writes_disabled) {
        stats_.writes_disabled = true;
        queue_.clear();
        fmt::print(stderr, "kv-disk: writes turned off, reads go on: {}\n", st.message());
      }
    }
    idle_cv_.notify_all();
  }
  idle_cv_.notify_all();
}

Status DiskTier::write_object(const KvBlock& b) {
  const std::string path = object_path(*b.hash);
  // Written before (by any process): only marked recently used, so that the budget keeps the
  // blocks that keep coming back (a block evicted from RAM again is one of those).
  if (::access(path.c_str(), F_OK) == 0) {
    ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);
    return Status::Ok();
  }
  std::vector<uint8_t> head;
  head.reserve(kHeaderBytes + b.tokens.size() * 4);
  put<uint32_t>(head, kMagic);
  put<uint32_t>(head, kDiskFormatVersion);
  put<uint64_t>(head, fingerprint_);
  put<uint64_t>(head, *b.hash);
  put<uint64_t>(head, b.parent);
  put<uint32_t>(head, uint32_t(b.tokens.size()));
  put<uint32_t>(head, 0);
  put<uint64_t>(head, uint64_t(b.bytes.size()));
  put<uint64_t>(head, XXH3_64bits_dispatch(b.bytes.data(), b.bytes.size()));
  for (int32_t t : b.tokens) put<int32_t>(head, t);
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  if (ec)
    return IOError(fmt::format("{}: {}", fs::path(path).parent_path().string(), ec.message()));
  thread_local std::mt19937_64 rng{std::random_device{}()};
  const std::string tmp = fmt::format("{}.tmp.{:016x}", path, rng());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return IOError(fmt::format("{}: {}", tmp, std::strerror(errno)));
  bool ok = true;
  using Piece = std::pair<const uint8_t*, size_t>;
  for (const auto& [data, size] :
       {Piece{head.data(), head.size()}, Piece{b.bytes.data(), b.bytes.size()}}) {
    size_t done = 0;
    while (ok && done < size) {
      ssize_t w = ::write(fd, data + done, size - done);
      if (w <= 0) ok = false;
      done += w > 0 ? size_t(w) : 0;
    }
  }
  const int err = errno;
  if (::close(fd) != 0) ok = false;
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return IOError(fmt::format("{}: {}", path, std::strerror(ok ? errno : err)));
  }
  const int64_t bytes = int64_t(head.size() + b.bytes.size());
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.written;
    stats_.bytes_written += bytes;
    bytes_since_scan_ += bytes;
  }
  enforce_budget();
  return Status::Ok();
}

// Removes the least recently used objects (oldest mtime) while the directory holds more than
// the budget, and temporary files of writers that died mid-write. The directory is scanned only
// once the bytes written since the last scan could have crossed it (budget / 16), so with P
// processes writing one directory it may sit over budget by up to P x (budget / 16 + one
// object) until the next scan.
void DiskTier::enforce_budget() {
  if (options_.capacity_gb <= 0) return;
  const int64_t budget = int64_t(options_.capacity_gb * 1e9);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (bytes_since_scan_ < budget / 16) return;
    bytes_since_scan_ = 0;
  }
  struct Object {
    fs::file_time_type used;
    int64_t size;
    fs::path path;
  };
  std::vector<Object> objects;
  int64_t total = 0, removed = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(options_.dir, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (!it->is_regular_file(ec)) continue;
    const bool object = it->path().extension() == ".kv";
    const bool partial = it->path().filename().string().find(".kv.tmp.") != std::string::npos;
    if (!object && !partial) continue;
    std::error_code e2;
    const int64_t size = int64_t(it->file_size(e2));
    const fs::file_time_type used = it->last_write_time(e2);
    if (e2) continue;
    if (partial) {
      // Old: what a writer killed mid-write left (it goes). Recent: a live write (it counts).
      if (fs::file_time_type::clock::now() - used > kStaleTemp) {
        if (fs::remove(it->path(), e2)) ++removed;
      } else {
        total += size;
      }
      continue;
    }
    objects.push_back({used, size, it->path()});
    total += size;
  }
  if (total <= budget) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.evicted += removed;
    return;
  }
  std::sort(objects.begin(), objects.end(),
            [](const Object& a, const Object& b) { return a.used < b.used; });
  for (const Object& o : objects) {
    if (total <= budget) break;
    if (fs::remove(o.path, ec)) ++removed;
    total -= o.size;
  }
  std::lock_guard<std::mutex> lock(mu_);
  stats_.evicted += removed;
}

}  // namespace moeserve
