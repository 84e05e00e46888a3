#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "core/file_pages.h"

namespace moeserve {

static_assert(std::endian::native == std::endian::little,
              "safetensors is little-endian; this code maps it without byte swapping");

namespace {

using nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the limit the reference reader uses
constexpr size_t kWriteChunk = 64ull << 20;         // write(2) may transfer less than ~2 GB

std::string errno_text(int err) {
  return std::strerror(err);
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// One header entry, before its byte range is tied to the mapping.
struct RawEntry {
  TensorInfo info;
  uint64_t begin = 0;
  uint64_t end = 0;
};

// Validates one "<name>": {...} entry against the data section size. `where` is
// "<path>: tensor '<name>'" for messages.
Status parse_entry(const std::string& where, const json& j, uint64_t data_size, RawEntry* out) {
  if (!j.is_object()) return Corrupt(where + ": entry is not a JSON object");
  auto dtype_it = j.find("dtype");
  auto shape_it = j.find("shape");
  auto offsets_it = j.find("data_offsets");
  if (dtype_it == j.end()) return Corrupt(where + ": no 'dtype'");
  if (shape_it == j.end()) return Corrupt(where + ": no 'shape'");
  if (offsets_it == j.end()) return Corrupt(where + ": no 'data_offsets'");

  if (!dtype_it->is_string()) return Corrupt(where + ": 'dtype' is not a string");
  const std::string& dtype_str = dtype_it->get_ref<const std::string&>();
  std::optional<DType> dtype = dtype_from_name(dtype_str);
  if (!dtype) return Corrupt(where + ": unknown dtype '" + dtype_str + "'");
  out->info.dtype = *dtype;

  if (!shape_it->is_array()) return Corrupt(where + ": 'shape' is not an array");
  uint64_t numel = 1;
  bool numel_overflow = false;
  for (const json& d : *shape_it) {
    if (!d.is_number_integer()) return Corrupt(where + ": 'shape' holds a non-integer");
    if (d.is_number_unsigned()) {
      uint64_t u = d.get<uint64_t>();
      if (u > uint64_t(std::numeric_limits<int64_t>::max())) {
        return Corrupt(where + ": dimension " + std::to_string(u) + " is too large");
      }
      out->info.shape.push_back(int64_t(u));
    } else {
      int64_t v = d.get<int64_t>();
      if (v < 0) return Corrupt(where + ": negative dimension " + std::to_string(v));
      out->info.shape.push_back(v);
    }
    numel_overflow |= __builtin_mul_overflow(numel, uint64_t(out->info.shape.back()), &numel);
  }

  const json& off = *offsets_it;
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
      !off[1].is_number_unsigned()) {
    return Corrupt(where + ": 'data_offsets' is not two non-negative integers");
  }
  out->begin = off[0].get<uint64_t>();
  out->end = off[1].get<uint64_t>();
  std::string range =
      "data_offsets [" + std::to_string(out->begin) + ", " + std::to_string(out->end) + "]";
  if (out->end < out->begin) return Corrupt(where + ": " + range + " end before begin");
  if (out->end > data_size) {
    return Corrupt(where + ": " + range + " past the end of the data section (" +
                   std::to_string(data_size) + " bytes)");
  }
  uint64_t have = out->end - out->begin;
  uint64_t need = 0;
  bool need_overflow =
      numel_overflow || __builtin_mul_overflow(numel, uint64_t(dtype_size(*dtype)), &need);
  if (need_overflow || have != need) {
    return Corrupt(where + ": " + range + " hold " + std::to_string(have) + " bytes but " +
                   dtype_str + " " + shape_text(out->info.shape) + " needs " +
                   (need_overflow ? std::string("more than 2^64") : std::to_string(need)));
  }
  out->info.nbytes = size_t(have);
  return Status::Ok();
}

// The data section must be covered exactly once: no overlap (two tensors sharing bytes) and no
// hole (bytes no tensor owns, which the format forbids to rule out polyglot files).
Status check_coverage(const std::string& path, std::vector<RawEntry*> entries, uint64_t data_size) {
  std::sort(entries.begin(), entries.end(), [](const RawEntry* a, const RawEntry* b) {
    return std::tie(a->begin, a->end) < std::tie(b->begin, b->end);
  });
  uint64_t cursor = 0;
  const RawEntry* prev = nullptr;
  for (const RawEntry* e : entries) {
    if (e->begin == e->end) continue;  // owns no bytes
    if (e->begin < cursor) {
      return Corrupt(path + ": tensor '" + e->info.name + "': data_offsets [" +
                     std::to_string(e->begin) + ", " + std::to_string(e->end) +
                     "] overlap tensor '" + prev->info.name + "' [" + std::to_string(prev->begin) +
                     ", " + std::to_string(prev->end) + "]");
    }
    if (e->begin > cursor) {
      return Corrupt(path + ": tensor '" + e->info.name + "': data section bytes [" +
                     std::to_string(cursor) + ", " + std::to_string(e->begin) +
                     ") before it belong to no tensor");
    }
    cursor = e->end;
    prev = e;
  }
  if (cursor != data_size) {
    return Corrupt(path + ": data section bytes [" + std::to_string(cursor) + ", " +
                   std::to_string(data_size) + ") belong to no tensor");
  }
  return Status::Ok();
}

// Writes all of [p, p + n), in chunks, retrying on EINTR and short writes.
Status write_all(int fd, const uint8_t* p, size_t n, const std::string& path) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, std::min(n, kWriteChunk));
    if (w < 0) {
      if (errno == EINTR) continue;
      return IOError(path + ": write failed: " + errno_text(errno));
    }
    if (w == 0) return IOError(path + ": write wrote nothing");
    p += w;
    n -= size_t(w);
  }
  return Status::Ok();
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ------------------------------------------------------------------------------------ reading

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) return NotFound(path + ": no such file");
    return IOError(path + ": cannot open: " + errno_text(err));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return IOError(path + ": cannot stat: " + errno_text(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return IOError(path + ": not a regular file");
  }
  uint64_t size = uint64_t(st.st_size);
  if (size < 8) {
    ::close(fd);
    return Corrupt(path + ": file is " + std::to_string(size) +
                   " bytes, too short for the 8-byte header length");
  }
  void* map = ::mmap(nullptr, size_t(size), PROT_READ, MAP_PRIVATE, fd, 0);
  int map_err = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (map == MAP_FAILED) return IOError(path + ": mmap failed: " + errno_text(map_err));

  // From here on `file` owns the mapping and unmaps it on every early return.
  SafetensorsFile file;
  file.path_ = path;
  file.map_ = map;
  file.size_ = size_t(size);
  register_file_mapping(map, file.size_, path);  // read-only: pages copied elsewhere may be released
  const uint8_t* base = static_cast<const uint8_t*>(map);

  uint64_t header_len;
  std::memcpy(&header_len, base, 8);
  if (header_len == 0) return Corrupt(path + ": header length is 0");
  if (header_len > kMaxHeaderBytes) {
    return Corrupt(path + ": header length " + std::to_string(header_len) + " exceeds the " +
                   std::to_string(kMaxHeaderBytes) + "-byte limit");
  }
  if (header_len > size - 8) {
    return Corrupt(path + ": header length " + std::to_string(header_len) +
                   " runs past the end of the file (" + std::to_string(size) + " bytes)");
  }
  const char* header = reinterpret_cast<const char*>(base + 8);
  // nlohmann's lexer takes a NUL byte for the end of input and would ignore what follows it;
  // valid JSON text never holds one.
  if (std::memchr(header, 0, header_len) != nullptr) {
    return Corrupt(path + ": header is not valid JSON (contains a NUL byte)");
  }
  json root = json::parse(header, header + header_len, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return Corrupt(path + ": header is not valid JSON");
  if (!root.is_object()) return Corrupt(path + ": header is not a JSON object");

  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = size - data_start;
  std::vector<RawEntry> raw;
  raw.reserve(root.size());
  for (auto it = root.begin(); it != root.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) return Corrupt(path + ": '__metadata__' is not a JSON object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) {
          return Corrupt(path + ": '__metadata__' value for '" + m.key() + "' is not a string");
        }
        file.metadata_.emplace(m.key(), m->get<std::string>());
      }
      continue;
    }
    RawEntry e;
    e.info.name = it.key();
    RETURN_IF_ERROR(
        parse_entry(path + ": tensor '" + e.info.name + "'", it.value(), data_size, &e));
    raw.push_back(std::move(e));
  }
  std::vector<RawEntry*> ptrs;
  for (RawEntry& e : raw) ptrs.push_back(&e);
  RETURN_IF_ERROR(check_coverage(path, std::move(ptrs), data_size));

  for (RawEntry& e : raw) {
    e.info.data = e.info.nbytes ? base + data_start + e.begin : nullptr;
    std::string name = e.info.name;
    file.tensors_.emplace(std::move(name), std::move(e.info));
  }
  return file;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept
    : path_(std::move(o.path_)),
      map_(std::exchange(o.map_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      tensors_(std::move(o.tensors_)),
      metadata_(std::move(o.metadata_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    if (map_) {
      unregister_file_mapping(map_);
      ::munmap(map_, size_);
    }
    path_ = std::move(o.path_);
    map_ = std::exchange(o.map_, nullptr);
    size_ = std::exchange(o.size_, 0);
    tensors_ = std::move(o.tensors_);
    metadata_ = std::move(o.metadata_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) {
    unregister_file_mapping(map_);
    ::munmap(map_, size_);
  }
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

// ------------------------------------------------------------------------------------ writing

void SafetensorsWriter::add(const std::string& name, DType dtype, std::vector<int64_t> shape,
                            const void* data, size_t nbytes) {
  Entry e{name, dtype, std::move(shape), {}};
  if (nbytes) {
    const uint8_t* p = static_cast<const uint8_t*>(data);
    e.bytes.assign(p, p + nbytes);
  }
  entries_.push_back(std::move(e));
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) {
  metadata_[key] = value;
}

size_t SafetensorsWriter::data_bytes() const {
  size_t n = 0;
  for (const Entry& e : entries_) n += e.bytes.size();
  return n;
}

Status SafetensorsWriter::write(const std::string& path) const {
  // Validate what add() accepted, so a bad call surfaces as a Status naming the tensor.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata_) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  std::set<std::string> names;
  uint64_t offset = 0;
  // Data in order of decreasing element size (stable, as Python's safetensors does): with the
  // data section 8-byte aligned and no holes allowed, this keeps every tensor aligned for its
  // dtype (an F32 scale after an odd-sized FP8 weight would not be).
  std::vector<const Entry*> order;
  for (const Entry& e : entries_) order.push_back(&e);
  std::stable_sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    return dtype_size(a->dtype) > dtype_size(b->dtype);
  });
  for (const Entry* ep : order) {
    const Entry& e = *ep;
    std::string where = path + ": tensor '" + e.name + "'";
    if (e.name == "__metadata__") return InvalidArgument(where + ": reserved name");
    if (!names.insert(e.name).second) return InvalidArgument(where + ": added twice");
    uint64_t need = dtype_size(e.dtype);
    for (int64_t d : e.shape) {
      if (d < 0) return InvalidArgument(where + ": negative dimension " + std::to_string(d));
      if (__builtin_mul_overflow(need, uint64_t(d), &need)) {
        return InvalidArgument(where + ": shape " + shape_text(e.shape) + " overflows");
      }
    }
    if (need != e.bytes.size()) {
      return InvalidArgument(where + ": " + std::to_string(e.bytes.size()) + " bytes given but " +
                             dtype_name(e.dtype) + " " + shape_text(e.shape) + " needs " +
                             std::to_string(need));
    }
    header[e.name] = {{"dtype", dtype_name(e.dtype)},
                      {"shape", e.shape},
                      {"data_offsets", {offset, offset + e.bytes.size()}}};
    offset += e.bytes.size();
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& ex) {  // names or metadata that are not UTF-8
    return InvalidArgument(path + ": cannot encode header: " + ex.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned
  uint64_t header_len = text.size();

  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return IOError(tmp + ": cannot create: " + errno_text(errno));
  Status st = write_all(fd, reinterpret_cast<const uint8_t*>(&header_len), 8, tmp);
  if (st.ok()) st = write_all(fd, reinterpret_cast<const uint8_t*>(text.data()), text.size(), tmp);
  for (const Entry* e : order) {
    if (!st.ok()) break;
    st = write_all(fd, e->bytes.data(), e->bytes.size(), tmp);
  }
  if (st.ok() && ::fsync(fd) != 0) st = IOError(tmp + ": fsync failed: " + errno_text(errno));
  if (::close(fd) != 0 && st.ok()) st = IOError(tmp + ": close failed: " + errno_text(errno));
  if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    st = IOError(tmp + ": cannot rename to " + path + ": " + errno_text(errno));
  }
  if (!st.ok()) ::unlink(tmp.c_str());
  return st;
}

}  // namespace moeserve
