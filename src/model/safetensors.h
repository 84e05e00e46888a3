// Safetensors files: read (mmap, every header value bounds-checked) and write.
//
// Format: 8-byte little-endian header length N, then N bytes of JSON
//   {"__metadata__": {str: str}, "<name>": {"dtype": "F8_E4M3", "shape": [..],
//    "data_offsets": [begin, end]}, ...}
// then the data section; offsets are relative to the data section start.
//
// SafetensorsFile owns one read-only private mapping of one file; TensorInfo::data points into
// it and stays valid for the life of the SafetensorsFile (move it, never copy it). Pages are
// touched lazily: opening a 4 GB shard reads only its header. Thread-safe after open (read only).
//
// open() validates, and reports with the file name (and tensor name where there is one):
//   file too short for the length prefix; header length 0, > 100 MB or past the end of file;
//   header not a JSON object; entry without dtype/shape/data_offsets or with wrong JSON types;
//   unknown dtype; negative dimension; end < begin; end past the data section;
//   end - begin != dtype_size * product(shape) (also guarding the multiplication against
//   overflow); two tensors whose byte ranges overlap; data-section bytes no tensor owns (the
//   format forbids holes and trailing bytes, as the Python reference does); a NUL byte in the
//   header; '__metadata__' that is not an object of strings. Zero-byte tensors own no bytes and
//   may sit at any offset within the data section. Errors are kCorrupt, except a missing file
//   (kNotFound) and OS failures or a non-regular file (kIOError).
//
// Data pointers are aligned to their dtype only if the writer arranged it: the data section
// starts 8-byte aligned in the file (and the mapping is page aligned); Python's safetensors
// orders tensors by dtype size so every tensor is naturally aligned. Read through memcpy or
// check alignment before casting. The file must not be truncated while mapped (SIGBUS).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace moeserve {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // into the mapping; nullptr for a zero-byte tensor is allowed
  size_t nbytes = 0;

  int64_t numel() const;
};

class SafetensorsFile {
 public:
  static Result<SafetensorsFile> open(const std::string& path);

  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  // Sorted by name.
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  size_t file_size() const { return size_; }

 private:
  SafetensorsFile() = default;

  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Builds one safetensors file. Tensors are written contiguously by decreasing element size, in
// add order among equals (the format allows no gaps; this keeps every tensor aligned); the header
// is padded with spaces to a multiple of 8 bytes so the data section starts 8-byte aligned.
// Data is copied at add time (callers may free their buffers). add() accepts anything; write()
// checks it (size == dtype_size * numel, no negative dims, unique names, not "__metadata__",
// UTF-8 names) and returns kInvalidArgument naming the tensor, before creating any file.
class SafetensorsWriter {
 public:
  void add(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data,
           size_t nbytes);
  void set_metadata(const std::string& key, const std::string& value);
  size_t data_bytes() const;
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const Entry& e : entries_) out.push_back(e.name);
    return out;
  }
  // Writes to `path` via `path`.tmp (fsynced, then renamed into place; removed on failure).
  // Handles multi-GB files (chunked writes, each checked).
  Status write(const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace moeserve
