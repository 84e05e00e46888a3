// DiskTier: the KV cache's tier on disk (3FS's role; docs/kv-cache.md "The disk tier"). A
// directory of content-addressed objects, one per full 64-token block, named by the block's
// chain hash (which the model fingerprint seeds). Any POSIX directory: local SSD, NFS, or a
// parallel file system mounted by many processes and machines at once.
//
// Object format (little-endian), file DIR/<first two hex digits>/<16 hex digits of hash>.kv:
//   u32 magic "MSKV", u32 format version (kDiskFormatVersion), u64 fingerprint, u64 chain hash,
//   u64 parent hash, u32 token count (64), u32 0, u64 payload bytes, u64 XXH3-64 of the payload,
//   then the block's tokens (i32 each), then the payload (KvBlock::bytes).
// A read is used only when every field matches what was asked and the checksum verifies;
// anything else is a miss, the file is removed and a counter says why.
//
// Reads run on the tier's reader thread (load): a job's blocks in chain order, each read
// straight into its RAM block in pieces that are checksummed while in cache, stopping at the
// first miss. The step thread only probes for the first block (contains: one stat).
//
// Writes never block a step: registered and evicted blocks go to a background writer through a
// bounded queue (full: dropped and counted). A writer publishes by write-to-temp + rename, so a
// reader never sees half an object; a file already present is not written again. The size
// budget is kept by removing the least recently used objects (reads refresh a file's mtime).
// A write error (ENOSPC, a read-only directory) turns writing off, said once on stderr; reads
// go on.
//
// contains/load/on_register/on_evict are called by the KvCache's owner thread; read_block and
// stats() from any thread.
#pragma once

#include <array>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>

#include "cache/kv_cache.h"
#include "core/status.h"

namespace moeserve {

inline constexpr uint32_t kDiskFormatVersion = 1;

// Why an object on disk was not used.
enum class DiskReject {
  kShort,        // shorter than its header says (truncated, zero-length)
  kMagic,        // not a moeserve KV object
  kVersion,      // another format version
  kFingerprint,  // another model (or KV dtype, compute path, layout)
  kIdentity,     // another block: hash, parent or tokens differ from the name asked for
  kSize,         // payload size differs from this cache's block size
  kChecksum,     // payload bytes changed
};
inline constexpr int kDiskRejectKinds = 7;
const char* to_string(DiskReject r);

struct DiskTierStats {
  int64_t hits = 0, misses = 0;
  std::array<int64_t, kDiskRejectKinds> rejected{};  // by DiskReject
  int64_t written = 0, write_drops = 0, write_errors = 0, evicted = 0;
  int64_t bytes_read = 0, bytes_written = 0;
  bool writes_disabled = false;
};

struct DiskTierOptions {
  std::string dir;
  double capacity_gb = 0;   // 0: no budget
  int64_t max_queued = 64;  // blocks waiting for the writer
};

class DiskTier final : public KvTier {
 public:
  // Creates dir if needed. Errors name the directory.
  static Result<std::unique_ptr<DiskTier>> open(const DiskTierOptions& options,
                                                uint64_t fingerprint, size_t block_bytes);
  ~DiskTier() override;  // finishes queued writes

  bool contains(uint64_t hash) override;
  void load(std::shared_ptr<KvLoadJob> job) override;
  void on_register(KvBlock block) override { enqueue(std::move(block)); }
  void on_evict(KvBlock block) override { enqueue(std::move(block)); }

  // Reads the object of block `hash` (parent, tokens as given) into dest (block_bytes): true
  // when it is there and verifies; else a counted miss or rejection (and dest holds anything).
  // Reads the object under `hash` into the job's block i (KvLoadJob::dest_at).
  bool read_block(uint64_t hash, uint64_t parent, std::span<const int32_t> tokens,
                  const KvLoadJob& job, int32_t i);

  DiskTierStats stats() const;
  // Waits until every queued write is done (tests, clean shutdown).
  void flush();
  std::string object_path(uint64_t hash) const;

 private:
  DiskTier(const DiskTierOptions& options, uint64_t fingerprint, size_t block_bytes);
  void enqueue(KvBlock block);
  void writer_loop();
  void reader_loop();
  void prefetch(uint64_t hash) const;
  Status write_object(const KvBlock& block);
  void enforce_budget();
  void reject(const std::string& path, DiskReject why);

  const DiskTierOptions options_;
  const uint64_t fingerprint_;
  const size_t block_bytes_;

  mutable std::mutex mu_;
  std::condition_variable cv_, idle_cv_, load_cv_;
  // Guarded by mu_:
  std::deque<KvBlock> queue_;
  std::deque<std::shared_ptr<KvLoadJob>> loads_;
  bool writing_ = false;  // the writer holds a block taken from the queue
  bool stop_ = false;
  DiskTierStats stats_;
  int64_t bytes_since_scan_ = 0;

  std::thread writer_;  // last two
  std::thread reader_;
};

}  // namespace moeserve
