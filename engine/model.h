// A Llama-family decoder (llama, mistral, qwen2, qwen3, gemma3_text, and the
// mixtures of experts qwen3_moe and mixtral) and its batched forward pass
// over a paged KV cache.
//
//   ASSIGN_OR_RETURN(auto model, Model::Load(dir, backend.get()));
//   ASSIGN_OR_RETURN(Logits out, model->Forward(batch, pool));
//
// One Forward call runs one step of any mix of work: prefill chunks (a run of
// prompt tokens after whatever the sequence already has in the cache) and
// decode tokens (one token each) of different sequences. It writes each new
// token's K and V into the sequence's blocks and returns logits only for the
// rows the caller asks for. The caller owns the block tables and must have
// reserved blocks for every position it feeds. Weights are read from
// safetensors (F32/F16/BF16); the linear layers', the embedding's and
// lm_head's stay in the checkpoint's dtype or are converted at load to the
// one LoadOptions names (kernels/dtype.h: bf16, f16, q8, q4, q4z), the
// norms are float32. Activations are float32.
//
// Tensor and pipeline parallelism (LoadOptions::tp, ::pp): the model is then
// tp x pp ranks, each a Model of its slice run by a thread of its own with a
// backend of its own, exchanging activations over a Communicator
// (kernels/communicator.h, through the backend's collective ops; over
// threads on the CPU). A pipeline stage holds
// a contiguous range of layers and hands its hidden rows to the next; a
// tensor-parallel rank holds 1/tp of the attention heads (column-parallel
// q/k/v, row-parallel o_proj) and of the MLP (column-parallel gate/up,
// row-parallel down), its partial outputs summed by an all-reduce. The
// embedding is replicated on the first stage; the last stage's ranks each
// hold 1/tp of the LM head's vocabulary rows (vocab-parallel; a tied head
// is a slice of the embedding), and rank 0 gathers the logits, so the head
// is read with every rank's threads. A mixture-of-experts layer's experts
// are each split as the MLP is (1/tp of every expert's width on each rank,
// the router whole on all), so every rank runs the same experts. Every rank writes its layers' and
// heads' K and V into the caller's one pool, in the layout of an unsharded
// model, so a sharded instance's KV handles and transfers are those of an
// unsharded one. PP gives the same bits as PP=1 (the same ops on the same
// rows); TP sums o_proj and down in two halves, so its logits differ in the
// last bits.
// Activations and the step's indices live in a buffer of the backend's
// (kernels/backend.h), as the KV pool does: the model reaches them only
// through ops, one upload of the indices and one download of the logits.
// Forward is not thread-safe (it reuses that buffer): one step at a time.
#ifndef DUET_ENGINE_MODEL_H_
#define DUET_ENGINE_MODEL_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/block_pool.h"
#include "spec/model_config.h"
#include "engine/precision_map.h"
#include "engine/safetensors.h"
#include "kernels/backend.h"
#include "kernels/communicator.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/dtype.h"
#include "kernels/factory.h"

namespace duet::engine {

struct BatchSeq {
  absl::Span<const int32_t> tokens;  // New tokens, at positions start_pos...
  int64_t start_pos = 0;             // Tokens already in this sequence's cache.
  absl::Span<const int32_t> block_table;
  // Offsets into `tokens` whose logits are wanted (usually the last).
  std::vector<int32_t> logit_rows;
};

struct LoadOptions {
  // The dtype of every weight matrix (nullopt: each tensor's own, F32, F16
  // or BF16, as the checkpoint stores it). A GPTQ checkpoint's linear
  // layers load as q4z whatever this says (engine/gptq.h); it applies to
  // the embedding and lm_head there.
  std::optional<kernels::DType> weight_dtype;
  // Each layer's linear weights' dtype (and its experts', where the map
  // names them apart), and the embedding's and lm_head's where it names
  // them (weight_dtype where it does not). Not with GPTQ.
  std::optional<PrecisionMap> precision_map;
  // The KV cache's dtype (f32, bf16, f16; nullopt: the backend's default).
  std::optional<kernels::DType> kv_dtype;
  // Tensor-parallel ranks (dividing the attention heads, the KV heads and
  // the MLP's width) and pipeline stages (at most the layers). Each of the
  // tp x pp ranks gets the backend `rank_backend` makes for `rank_threads`
  // threads (0: this machine's cores / tp, at least 1), a CPU backend where
  // it is unset; the backend passed to Load then serves only its checks and
  // the pool's buffer type. Not with GPTQ checkpoints.
  int tp = 1;
  int pp = 1;
  int rank_threads = 0;
  std::function<absl::StatusOr<kernels::KernelBackendPtr>(int threads)> rank_backend;
  // The CPU backend's kernels, for the ranks' backends and the one a
  // command makes beside the model (kernels/cpu/cpu_backend.h:
  // kInt8Activations is the opt-in integer dots on quantized weights).
  kernels::CpuKernels cpu_kernels = kernels::CpuKernels::kBatchInvariant;
  // The backend kind (kernels/factory.h) of the ranks' backends and of the
  // one a command makes beside the model: cpu, cuda or cuda-emulated.
  std::string device = "cpu";
  // Decode steps of up to this many sequences replayed as step graphs
  // (CUDA graphs) where the backend has them and the model is one rank:
  // each step padded to the next bucket (1, 2, 4, 8, then multiples of 8),
  // captured on its first use after an eager run. 0: every step eager.
  int graph_max_batch = 0;
  // kernels::BackendOptions::deterministic (--deterministic).
  bool deterministic = false;
  // kernels::BackendOptions::activation_dtype (--activation-dtype).
  std::optional<kernels::DType> activation_dtype;
  // NewBackend's options for the backend above with `threads` threads.
  kernels::BackendOptions Backend(int threads) const {
    return {.kind = device,
            .threads = threads,
            .cpu_kernels = cpu_kernels,
            .deterministic = deterministic,
            .activation_dtype = activation_dtype};
  }
};

// --weight-dtype and --kv-dtype: "auto" (nullopt) or a dtype name
// (kernels/dtype.h; the KV cache takes f32, bf16 and f16); InvalidArgument
// listing the choices otherwise. The flags' help:
inline constexpr char kWeightDTypeHelp[] =
    "the weights' dtype: auto (as the checkpoint stores them: f32, f16 or bf16) | f32 | bf16 | f16 | q8 | q4 | q4z "
    "(q8, q4 and q4z quantize at load, in blocks of 32 with an f16 scale, q4z with a zero point; activations "
    "stay f32)";
inline constexpr char kKvDTypeHelp[] =
    "the KV cache's dtype: auto (the backend's: f32 on the CPU) | f32 | bf16 | f16 (half the memory and half the "
    "bytes a KV pull moves; prefill and decode workers must agree)";
absl::StatusOr<std::optional<kernels::DType>> ParseWeightDType(std::string_view name);
absl::StatusOr<std::optional<kernels::DType>> ParseKvDType(std::string_view name);

struct Logits {
  int64_t vocab_size = 0;
  // One row per requested position, in batch order (sequence, then offset).
  std::vector<float> data;
  int64_t rows() const { return vocab_size == 0 ? 0 : static_cast<int64_t>(data.size()) / vocab_size; }
  const float* row(int64_t i) const { return data.data() + i * vocab_size; }
};

class Model {
 public:
  // Reads config.json and the safetensors weights of a Hugging Face model
  // directory. The backend must outlive the model; a device backend keeps
  // the weights resident in its memory (KernelBackend::MakeResident) until
  // the model goes.
  static absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& dir, kernels::KernelBackend* backend,
                                                     const LoadOptions& options = {});
  ~Model();

  const spec::ModelConfig& config() const { return config_; }
  // The bytes of every weight the model holds, as loaded.
  int64_t weight_bytes() const;
  const std::string& dir() const { return dir_; }
  // The layout of a KV pool for this model, of the KV dtype it was loaded with.
  kernels::KvLayout KvLayoutFor(int64_t block_size) const;
  kernels::DType kv_dtype() const { return kv_dtype_; }
  // Decode steps run by replaying a step graph so far (graph_max_batch).
  int64_t graph_replays() const { return graph_steps_; }
  // The dtype each layer's linear weights were loaded in, and their bytes.
  std::vector<kernels::DType> layer_dtypes() const;
  int64_t layer_weight_bytes(int64_t layer) const;
  // Reads one layer's linear weights from the checkpoint again, in `dtype`
  // (nullopt: as stored): what `duet precision-plan` measures a layer at.
  // Not for GPTQ checkpoints, nor with tp or pp above 1.
  absl::Status ReloadLayer(int64_t layer, std::optional<kernels::DType> dtype);

  absl::StatusOr<Logits> Forward(absl::Span<const BatchSeq> batch, BlockPool& pool);

 private:
  struct Layer {
    std::vector<float> input_norm, post_norm;
    std::vector<float> q_norm, k_norm;  // [head_dim] each, with ModelConfig::qk_norm
    // Gemma-3's norms of the attention's and the MLP's outputs (empty elsewhere).
    std::vector<float> attn_out_norm, mlp_out_norm;
    kernels::HostWeights wqkv;  // [q|k|v rows][hidden]
    std::vector<float> bqkv;    // [q|k|v]
    kernels::HostWeights wo;    // [hidden][q_dim]
    std::vector<float> bo;
    kernels::HostWeights wgu;    // [gate rows | up rows][hidden]
    kernels::HostWeights wdown;  // [hidden][inter]
    // A mixture-of-experts layer's (ModelConfig::IsMoeLayer) in place of
    // wgu and wdown: the router, kept in f32 whatever the dtypes (so that
    // tokens choose the experts the checkpoint's router chooses), and each
    // expert's gate|up and down (expert_weights: 2e and 2e + 1), viewed by
    // `experts` for the op.
    kernels::HostWeights router;  // [experts][hidden]
    std::vector<kernels::HostWeights> expert_weights;
    std::vector<kernels::ExpertWeights> experts;
    int64_t linear_bytes() const;
    // Every host array of the layer's that an op takes, with its bytes.
    void ForEachArray(const std::function<void(const void*, int64_t)>& fn) const;
  };

  // One rank's place in a sharded model; the defaults are an unsharded one.
  struct Shard {
    int tp_rank = 0, tp = 1, stage = 0, pp = 1;
    int64_t layer_begin = 0, layer_end = 0;  // This stage's layers.
    kernels::Communicator* tp_group = nullptr;  // This stage's tp ranks.
    kernels::Communicator* world = nullptr;     // All ranks, stage-major: stage x tp + tp_rank.
  };
  // A sharded model's ranks and the threads that run them (model.cc).
  struct Ranks;

  Model() = default;
  absl::Status CheckBatch(absl::Span<const BatchSeq> batch, const BlockPool& pool) const;
  // This rank's part of a step: logits on the last stage's tp rank 0, none
  // (an empty Logits) on the others.
  absl::StatusOr<Logits> ForwardShard(absl::Span<const BatchSeq> batch, BlockPool& pool);
  // Runs `ops` (a padded decode step's) by the bucket's step graph: replays
  // it, or runs the ops eagerly and then captures them as the bucket's graph.
  absl::Status RunGraphed(int64_t bucket, absl::FunctionRef<absl::Status()> ops);
  absl::Status LoadWeights(const LoadOptions& options);
  // The model's host arrays (every layer's, or only `layer`'s) made
  // resident on its backend, or released there (kernels/backend.h).
  absl::Status Reside(std::optional<int64_t> layer = std::nullopt);
  void Unreside(std::optional<int64_t> layer = std::nullopt);
  void ForEachArray(std::optional<int64_t> layer, const std::function<void(const void*, int64_t)>& fn) const;
  // Tensor-parallel rank r's share of the vocabulary in the LM head: its
  // first row and row count (all of it at tp 1).
  std::pair<int64_t, int64_t> VocabRange(int r) const;
  // A layer's linear weights in `dtype`, a mixture of experts' experts in
  // `experts_dtype` (each loaded once).
  absl::Status LoadLayerLinears(const SafetensorsModel& st, int64_t layer, std::optional<kernels::DType> dtype,
                                std::optional<kernels::DType> experts_dtype);
  // A mixture-of-experts layer's router and experts (its experts in `dtype`).
  absl::Status LoadExperts(const SafetensorsModel& st, int64_t layer, std::optional<kernels::DType> dtype);
  // A norm's weights of `size`, with Gemma's 1 folded in (x * (1 + w)).
  absl::Status LoadNorm(const SafetensorsModel& st, const std::string& name, int64_t size, std::vector<float>& dst) const;

  std::string dir_;
  spec::ModelConfig config_;
  kernels::KernelBackend* backend_ = nullptr;
  kernels::DType kv_dtype_ = kernels::DType::kF32;
  kernels::HostWeights embed_;    // [vocab][hidden]
  kernels::HostWeights lm_head_;  // n = 0 when tied to embed_.
  std::vector<float> final_norm_;
  std::vector<Layer> layers_;  // shard_.layer_begin.. shard_.layer_end
  std::vector<float> inv_freq_;
  std::vector<float> inv_freq_local_;  // ModelConfig::local_rope's, where set
  Shard shard_;
  std::unique_ptr<Ranks> ranks_;  // Set on a sharded model, whose own weights are then empty.
  bool resident_ = false;         // Its arrays are resident on backend_ (which then must outlive it).

  // One step's activations and indices in the backend's memory, carved by
  // ForwardShard, grown to the largest step seen; and the indices on the
  // host, uploaded to it by one Write.
  kernels::BufferPtr step_;
  std::vector<uint8_t> staging_;

  // Step graphs (LoadOptions::graph_max_batch): by bucket, over their own
  // step buffer and the pool they were captured on; dropped together when
  // that buffer grows or the pool changes. Off once a capture fails (or the
  // backend has none).
  int graph_max_batch_ = 0;
  std::map<int64_t, std::unique_ptr<kernels::StepGraph>> graphs_;
  kernels::BufferPtr graph_step_;
  std::tuple<const void*, int64_t, int64_t> graph_pool_;  // the pool's memory, bytes and block bytes
  int64_t graph_steps_ = 0;  // decode steps replayed, for tests and logs
};

}  // namespace duet::engine

#endif  // DUET_ENGINE_MODEL_H_
