#include "core/trace.h"

#include <cstdio>

#include <fmt/format.h>

namespace moeserve {

namespace {
// JSON string escaping for event names (ASCII control characters, quote, backslash).
std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", int(c));
    } else {
      out += c;
    }
  }
  return out;
}
}  // namespace

double Tracer::now_us() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start_)
      .count();
}

void Tracer::add(std::string name, TraceLane lane, double begin_us, double end_us) {
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back({std::move(name), lane, begin_us, end_us});
}

size_t Tracer::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_.size();
}

Status Tracer::write(const std::string& path) const {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return IOError(path + ": cannot open for writing");
  std::string out = "{\"traceEvents\": [\n";
  out += fmt::format(
      "{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{0},\"args\":{{\"name\":\"rank {0}\"}}}},\n"
      "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{0},\"tid\":0,\"args\":{{\"name\":"
      "\"compute\"}}}},\n"
      "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{0},\"tid\":1,\"args\":{{\"name\":"
      "\"communication\"}}}}",
      rank_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Event& e : events_) {
      out += fmt::format(
          ",\n{{\"name\":\"{}\",\"ph\":\"X\",\"pid\":{},\"tid\":{},\"ts\":{:.3f},\"dur\":{:.3f}}}",
          escape(e.name), rank_, int(e.lane), e.begin_us, e.end_us - e.begin_us);
    }
  }
  out += "\n]}\n";
  bool ok = std::fwrite(out.data(), 1, out.size(), f) == out.size();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) return IOError(path + ": write failed");
  return Status::Ok();
}

}  // namespace moeserve
