// make_engine: the concrete Engine (engine.h) over a checkpoint of any model family: one step
// thread running Scheduler + the family's forward pass (model/loaded_model.h brings both up)
// over a paged KV cache with prefix caching.
//
// Expert parallelism with data-parallel attention (docs/ep-serving.md): with an EngineParallel,
// one engine runs on every rank of an EP group and the engines step together. Each rank keeps
// its own requests, scheduler and KV cache (attention is data-parallel); every MoE layer joins
// the group's dispatch/combine through the parallel Dispatcher, a rank without work included
// (with an empty batch). Rank 0 is the front: submit() there assigns each request to the rank
// with the fewest outstanding tokens (prompt + max_tokens - generated), and that rank's tokens
// come back to rank 0's callbacks through one control exchange per step (rank_messages.h).
// Other ranks are workers: nothing is submitted to them; they leave their step loop when rank 0
// stops (healthy() turns false, failure() stays OK) or when the group breaks (failure() says
// which rank went silent). While every rank is idle, rank 0 still runs a control exchange every
// idle_heartbeat so that the workers' waits (CommOptions::timeout) tell a quiet group from a
// dead one.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/dtype.h"
#include "engine/engine.h"
#include "engine/engine_core.h"
#include "model/family.h"
#include "model/loaded_model.h"

namespace moeserve {
class Communicator;
class Dispatcher;
class ExpertBalancer;
class Tracer;
}  // namespace moeserve

namespace moeserve {

// The model's options (model/loaded_model.h: directory, compute path, KV format and size, disk
// tier, threads, ...) and the engine's own.
struct EngineOptions : ModelOptions {
  int64_t max_num_seqs = 64;  // running sequences
  // Tokens per step. Running decodes wait for the whole step, so on CPUs (~100-1000 prefill
  // tokens/s) a small budget keeps inter-token latency bounded while prompts stream in.
  int64_t max_batch_tokens = 256;
  int64_t max_waiting = 1024;  // queued requests beyond which submit() refuses
  int64_t max_model_len = 0;   // 0: the model's max_position_embeddings
  Tracer* tracer = nullptr;    // records each step's stages when set (borrowed)
  // MTP speculative decoding (docs/mtp.md): loads the checkpoint's MTP module and gives its
  // layer a place in every KV block (make_engine sets ModelOptions::mtp from it).
  SpeculativeConfig speculative;
  // Prefill/decode disaggregation (docs/pd.md): how hand-offs leave and arrive (every rank).
  PdHooks pd;
  // Constrained decoding (docs/structured-outputs.md); null: requests with a grammar are
  // refused. Every rank of an EP unit needs its own (they compile the specs they serve).
  std::shared_ptr<GrammarBackend> grammar;
};

struct EngineParallel {
  Communicator* comm = nullptr;      // the EP group; borrowed, outlives the engine
  Dispatcher* dispatcher = nullptr;  // MoE dispatch/combine over comm; borrowed; its
                                     // holds_expert() decides which experts this rank loads
  std::chrono::milliseconds idle_heartbeat{200};  // must stay well below the comm timeout
  // EPLB on dispatcher (borrowed; may be null): the engine gives it the model as ExpertHost and
  // calls its end_step() after every step on every rank (online rebalancing, docs/eplb.md).
  ExpertBalancer* balancer = nullptr;
  // Run by the step thread of every rank once the group has stopped cleanly (all ranks leave
  // their loops at the same exchange, so it may make collective calls on comm), e.g. gathering
  // the expert-load statistics. An error becomes the engine's failure().
  std::function<Status()> on_clean_stop;
};

// parallel == nullptr: one process holding every expert.
Result<std::unique_ptr<Engine>> make_engine(const EngineOptions& options,
                                            const EngineParallel* parallel = nullptr);

}  // namespace moeserve
