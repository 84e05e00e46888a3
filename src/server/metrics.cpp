#include "server/metrics.h"

#include <fmt/format.h>

#include "cache/disk_tier.h"

namespace moeserve {

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  std::lock_guard<std::mutex> lock(mu_);
  ++counts_[i];
  sum_ += value;
  ++count_;
}

void Histogram::render(std::string& out, std::string_view name, std::string_view help) const {
  std::lock_guard<std::mutex> lock(mu_);
  out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cumulative);
  }
  cumulative += counts_.back();
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n", name, cumulative);
  out += fmt::format("{}_sum {}\n{}_count {}\n", name, sum_, name, count_);
}

namespace {
void add_metric(std::string& out, std::string_view name, std::string_view type,
                std::string_view help, int64_t value) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, value);
}
}  // namespace

ServerMetrics::ServerMetrics()
    : ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
             10.0, 20.0, 40.0, 80.0}),
      itl_({0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
            5.0, 10.0}),
      e2e_({0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
            120.0, 240.0, 480.0}) {}

void ServerMetrics::count_reply(int http_status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++replies_[http_status];
}

void ServerMetrics::count_finish(std::string_view reason) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = finishes_.find(reason);
  if (it == finishes_.end()) it = finishes_.emplace(std::string(reason), 0).first;
  ++it->second;
}

std::string ServerMetrics::render(const EngineStats& e) const {
  std::string out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    out +=
        "# HELP moeserve_http_requests_total HTTP replies by status code.\n"
        "# TYPE moeserve_http_requests_total counter\n";
    for (const auto& [status, n] : replies_) {
      out += fmt::format("moeserve_http_requests_total{{status=\"{}\"}} {}\n", status, n);
    }
    out +=
        "# HELP moeserve_request_finished_total Finished choices by finish reason.\n"
        "# TYPE moeserve_request_finished_total counter\n";
    for (const auto& [reason, n] : finishes_) {
      out += fmt::format("moeserve_request_finished_total{{finish_reason=\"{}\"}} {}\n", reason, n);
    }
  }
  add_metric(out, "moeserve_prompt_tokens_total", "counter", "Prompt tokens processed.",
             e.prompt_tokens);
  add_metric(out, "moeserve_generation_tokens_total", "counter", "Tokens generated.",
             e.generated_tokens);
  add_metric(out, "moeserve_prefix_cache_queries_total", "counter",
             "Prompt tokens looked up in the prefix cache.", e.prefix_queries);
  add_metric(out, "moeserve_prefix_cache_hits_total", "counter",
             "Prompt tokens found in the prefix cache (RAM and disk).", e.prefix_hits);
  add_metric(out, "moeserve_prefix_cache_disk_hits_total", "counter",
             "Of the prefix cache hits, prompt tokens loaded from the disk tier.",
             e.prefix_hits_disk);
  add_metric(out, "moeserve_kv_disk_hit_blocks_total", "counter",
             "KV blocks read from the disk tier.", e.kv_disk_hit_blocks);
  add_metric(out, "moeserve_kv_disk_miss_blocks_total", "counter",
             "KV blocks looked up on the disk tier and not there.", e.kv_disk_miss_blocks);
  out +=
      "# HELP moeserve_kv_disk_rejected_total Disk tier objects found but not used (and removed), "
      "by reason.\n# TYPE moeserve_kv_disk_rejected_total counter\n";
  for (int r = 0; r < kDiskRejectKinds; ++r) {
    out += fmt::format("moeserve_kv_disk_rejected_total{{reason=\"{}\"}} {}\n",
                       to_string(DiskReject(r)), e.kv_disk_rejected[size_t(r)]);
  }
  add_metric(out, "moeserve_kv_disk_written_total", "counter", "KV blocks written to disk.",
             e.kv_disk_written);
  add_metric(out, "moeserve_kv_disk_write_drops_total", "counter",
             "Disk writes dropped (the writer's queue was full).", e.kv_disk_write_drops);
  add_metric(out, "moeserve_kv_disk_write_errors_total", "counter",
             "Disk tier writes that failed (the first turns writing off).", e.kv_disk_write_errors);
  add_metric(out, "moeserve_kv_disk_writes_off", "gauge",
             "Ranks whose disk tier turned writing off after an error (reads go on).",
             e.kv_disk_writes_off);
  add_metric(out, "moeserve_kv_disk_evicted_total", "counter",
             "Disk tier objects removed to keep --kv-disk-gb.", e.kv_disk_evicted);
  add_metric(out, "moeserve_kv_disk_read_bytes_total", "counter", "Bytes read from the disk tier.",
             e.kv_disk_bytes_read);
  add_metric(out, "moeserve_kv_disk_written_bytes_total", "counter",
             "Bytes written to the disk tier.", e.kv_disk_bytes_written);
  add_metric(out, "moeserve_preemptions_total", "counter", "Sequences preempted (recomputed).",
             e.preemptions);
  add_metric(out, "moeserve_engine_steps_total", "counter", "Engine steps run.", e.steps);
  if (e.spec_verify_steps > 0 || e.spec_off_steps > 0) {  // MTP speculative decoding
    out +=
        "# HELP moeserve_spec_decode_draft_tokens_total MTP draft tokens verified, by position "
        "after the last verified token (0: the first draft).\n"
        "# TYPE moeserve_spec_decode_draft_tokens_total counter\n";
    for (size_t k = 0; k < e.spec_verified.size(); ++k) {
      out += fmt::format("moeserve_spec_decode_draft_tokens_total{{position=\"{}\"}} {}\n", k,
                         e.spec_verified[k]);
    }
    out +=
        "# HELP moeserve_spec_decode_accepted_tokens_total MTP draft tokens accepted, by "
        "position.\n# TYPE moeserve_spec_decode_accepted_tokens_total counter\n";
    for (size_t k = 0; k < e.spec_accepted.size(); ++k) {
      out += fmt::format("moeserve_spec_decode_accepted_tokens_total{{position=\"{}\"}} {}\n", k,
                         e.spec_accepted[k]);
    }
    add_metric(out, "moeserve_spec_decode_verify_steps_total", "counter",
               "Sequence steps that verified drafts.", e.spec_verify_steps);
    add_metric(out, "moeserve_spec_decode_verify_tokens_total", "counter",
               "Tokens those steps produced (accepted drafts and the bonus token).",
               e.spec_verify_tokens);
    out += fmt::format(
        "# HELP moeserve_spec_decode_mean_accepted_length Tokens per verifying sequence step "
        "(1 + mean accepted drafts).\n# TYPE moeserve_spec_decode_mean_accepted_length gauge\n"
        "moeserve_spec_decode_mean_accepted_length {:.4f}\n",
        e.spec_verify_steps > 0 ? double(e.spec_verify_tokens) / double(e.spec_verify_steps) : 0.0);
    add_metric(out, "moeserve_spec_decode_off_steps_total", "counter",
               "Decode steps the load policy ran with fewer drafts than asked.", e.spec_off_steps);
  }
  // Constrained decoding (docs/structured-outputs.md).
  add_metric(out, "moeserve_grammar_tokens_total", "counter",
             "Tokens sampled under a response_format grammar.", e.grammar_tokens);
  out += fmt::format(
      "# HELP moeserve_grammar_mask_seconds_total Time making and applying their masks and "
      "advancing the grammars, summed over the sampling threads.\n"
      "# TYPE moeserve_grammar_mask_seconds_total counter\n"
      "moeserve_grammar_mask_seconds_total {:.6f}\n",
      double(e.grammar_ns) * 1e-9);
  add_metric(out, "moeserve_num_requests_running", "gauge", "Requests in the running batch.",
             e.running);
  add_metric(out, "moeserve_num_requests_waiting", "gauge", "Requests waiting to run.", e.waiting);
  add_metric(out, "moeserve_num_requests_loading_kv", "gauge",
             "Requests whose prompt KV is loading from the disk tier.", e.loading);
  add_metric(out, "moeserve_kv_blocks_used", "gauge", "KV cache blocks in use.", e.kv_blocks_used);
  add_metric(out, "moeserve_kv_blocks_total", "gauge", "KV cache blocks in all.",
             e.kv_blocks_total);
  add_metric(out, "moeserve_kv_window_pages_used", "gauge",
             "Window pool pages held by sequences (sliding-window models; 0 without).",
             e.kv_window_pages_used);
  add_metric(out, "moeserve_kv_window_pages_total", "gauge", "Window pool pages in all.",
             e.kv_window_pages_total);
  ttft_.render(out, "moeserve_time_to_first_token_seconds", "Time to first token.");
  itl_.render(out, "moeserve_inter_token_latency_seconds", "Time between output tokens.");
  e2e_.render(out, "moeserve_e2e_request_latency_seconds", "Request latency, arrival to finish.");
  return out;
}

}  // namespace moeserve
