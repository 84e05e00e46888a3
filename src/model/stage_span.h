// StageSpan: the trace event of one stage of one decoder layer, named as its driver runs it:
// "attention 3" from the sequential driver (mb < 0), "attention L3 mb0" from the micro-batch
// driver. Nothing is recorded when the tracer is null.
#pragma once

#include <cstdint>
#include <string>

#include <fmt/format.h>

#include "core/trace.h"

namespace moeserve {

class StageSpan {
 public:
  StageSpan(Tracer* tracer, const char* stage, int64_t layer, int mb,
            TraceLane lane = TraceLane::kCompute)
      : tracer_(tracer), lane_(lane), begin_(tracer ? tracer->now_us() : 0) {
    if (!tracer_) return;
    name_ =
        mb < 0 ? fmt::format("{} {}", stage, layer) : fmt::format("{} L{} mb{}", stage, layer, mb);
  }
  ~StageSpan() {
    if (tracer_) tracer_->add(std::move(name_), lane_, begin_, tracer_->now_us());
  }
  StageSpan(const StageSpan&) = delete;
  StageSpan& operator=(const StageSpan&) = delete;

 private:
  Tracer* tracer_;
  TraceLane lane_;
  double begin_;
  std::string name_;
};

}  // namespace moeserve
