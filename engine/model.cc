#include "engine/model.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "base/thread_pool.h"
#include "engine/gptq.h"
#include "engine/safetensors.h"
#include "kernels/factory.h"

namespace duet::engine {
namespace {

std::string ShapeStr(const std::vector<int64_t>& s) { return "[" + absl::StrJoin(s, ", ") + "]"; }

// Copies tensor `name` into dst as float32 after checking its shape.
absl::Status LoadTensor(const SafetensorsModel& st, const std::string& name,
                        const std::vector<int64_t>& want_shape, float* dst) {
  ASSIGN_OR_RETURN(const TensorView* t, st.Get(name));
  if (t->shape != want_shape) {
    return absl::InvalidArgumentError(absl::StrCat(t->file, ": tensor ", name, " has shape ",
                                                   ShapeStr(t->shape), " but config.json implies ",
                                                   ShapeStr(want_shape)));
  }
  return ToFloat32(*t, dst);
}

// The dtype kernels/dtype.h names a checkpoint's tensor dtype by.
kernels::DType KernelDType(DType d) {
  switch (d) {
    case DType::kF32: return kernels::DType::kF32;
    case DType::kF16: return kernels::DType::kF16;
    case DType::kBF16: return kernels::DType::kBF16;
    case DType::kI32: break;  // Not a float: LoadTensor refuses it first.
  }
  return kernels::DType::kF32;
}

// A weight matrix made of the tensors `parts` stacked by rows, each a
// [rows][k] tensor of which rows [first, first + count) are taken (count
// -1: all), and of those the columns `cols` (a tensor-parallel rank's
// slice), in `dtype` (nullopt: the first part's own).
struct Part {
  std::string name;
  int64_t rows;
  int64_t first = 0;
  int64_t count = -1;
  int64_t taken() const { return count < 0 ? rows : count; }
};
struct Cols {
  int64_t first = 0;
  int64_t count = -1;  // -1: all k
};
absl::StatusOr<kernels::HostWeights> LoadMatrix(const SafetensorsModel& st, const std::vector<Part>& parts,
                                                int64_t k, std::optional<kernels::DType> dtype,
                                                const kernels::KernelBackend& backend, Cols cols = {}) {
  const int64_t kc = cols.count < 0 ? k : cols.count;
  int64_t n = 0;
  for (const Part& p : parts) n += p.taken();
  std::vector<float> dense(n * kc), whole;
  int64_t row = 0;
  for (const Part& p : parts) {
    if (p.taken() == p.rows && kc == k) {
      RETURN_IF_ERROR(LoadTensor(st, p.name, {p.rows, k}, dense.data() + row * k));
    } else {
      whole.resize(p.rows * k);
      RETURN_IF_ERROR(LoadTensor(st, p.name, {p.rows, k}, whole.data()));
      for (int64_t r = 0; r < p.taken(); ++r) {
        std::memcpy(dense.data() + (row + r) * kc, whole.data() + (p.first + r) * k + cols.first, kc * sizeof(float));
      }
    }
    row += p.taken();
  }
  if (!dtype) {
    ASSIGN_OR_RETURN(const TensorView* first, st.Get(parts[0].name));
    dtype = KernelDType(first->dtype);
  }
  if (!backend.Supports(kernels::WeightOp::kGemm, *dtype)) {
    return absl::UnimplementedError(absl::StrCat("the ", backend.Name(), " backend does not run ",
                                                 kernels::DTypeName(*dtype), " weights (", parts[0].name, ")"));
  }
  return kernels::QuantizeWeights(dense.data(), n, kc, *dtype);
}

// A linear layer made of `parts` stacked by rows: a GPTQ checkpoint's as
// kQ4Z (each part's base name is its name without ".weight"; whole
// tensors only, as Load refuses tp with GPTQ), else as LoadMatrix loads it.
absl::StatusOr<kernels::HostWeights> LoadLinear(const SafetensorsModel& st, const spec::ModelConfig& c,
                                                const std::vector<Part>& parts, int64_t k,
                                                std::optional<kernels::DType> dtype,
                                                const kernels::KernelBackend& backend, Cols cols = {}) {
  if (!c.gptq) return LoadMatrix(st, parts, k, dtype, backend, cols);
  std::vector<kernels::HostWeights> stacked;
  for (const Part& p : parts) {
    const std::string base = p.name.substr(0, p.name.size() - std::string_view(".weight").size());
    ASSIGN_OR_RETURN(kernels::HostWeights w, LoadGptqLinear(st, base, p.rows, k, *c.gptq));
    stacked.push_back(std::move(w));
  }
  if (!backend.Supports(kernels::WeightOp::kGemm, kernels::DType::kQ4Z)) {
    return absl::UnimplementedError(absl::StrCat("the ", backend.Name(), " backend does not run q4z weights (GPTQ)"));
  }
  return kernels::StackRows(stacked);
}

// Elements [first, first + count) of the vector tensor `name` of `size`
// floats, appended to `dst`.
absl::Status LoadSlice(const SafetensorsModel& st, const std::string& name, int64_t size, int64_t first,
                       int64_t count, std::vector<float>& dst) {
  std::vector<float> whole(size);
  RETURN_IF_ERROR(LoadTensor(st, name, {size}, whole.data()));
  dst.insert(dst.end(), whole.begin() + first, whole.begin() + first + count);
  return absl::OkStatus();
}

// DUET_STEP_LOG=FILE appends one CSV row per forward pass of this process:
// start (steady clock, s), decode rows and the sum of their contexts,
// prompt rows, their tokens and the sum of their squared lengths, and the
// pass's milliseconds. The serve bench sets it to compare the real steps with
// duet sim's latency model. Open once; a file that cannot be opened logs
// nothing.
void LogStep(absl::Span<const BatchSeq> batch, std::chrono::steady_clock::time_point start) {
  static std::FILE* const out = [] {
    const char* path = std::getenv("DUET_STEP_LOG");
    return path != nullptr && *path != '\0' ? std::fopen(path, "a") : nullptr;
  }();
  if (out == nullptr) return;
  const auto end = std::chrono::steady_clock::now();
  long long decode = 0, context = 0, prompts = 0, tokens = 0, squares = 0;
  for (const BatchSeq& b : batch) {
    const long long len = static_cast<long long>(b.tokens.size());
    if (len == 1 && b.start_pos > 0) {
      ++decode;
      context += b.start_pos;
    } else {
      ++prompts;
      tokens += len;
      squares += len * len;
    }
  }
  std::fprintf(out, "%.6f,%lld,%lld,%lld,%lld,%lld,%.3f\n",
               std::chrono::duration<double>(start.time_since_epoch()).count(), decode, context, prompts, tokens,
               squares, std::chrono::duration<double, std::milli>(end - start).count());
  std::fflush(out);
}

}  // namespace

namespace {

// "auto" (nullopt) or one of the dtypes `allowed` says yes to.
absl::StatusOr<std::optional<kernels::DType>> ParseDTypeChoice(std::string_view name, const char* what,
                                                               bool (*allowed)(kernels::DType)) {
  if (name == "auto") return std::optional<kernels::DType>();
  std::optional<kernels::DType> d = kernels::ParseDType(name);
  if (d && allowed(*d)) return d;
  std::vector<std::string> names = {"auto"};
  for (kernels::DType k : kernels::kAllDTypes) {
    if (allowed(k)) names.emplace_back(kernels::DTypeName(k));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what, " \"", std::string(name), "\" is not one of ", absl::StrJoin(names, ", ")));
}

}  // namespace

absl::StatusOr<std::optional<kernels::DType>> ParseWeightDType(std::string_view name) {
  return ParseDTypeChoice(name, "weight dtype", [](kernels::DType) { return true; });
}

absl::StatusOr<std::optional<kernels::DType>> ParseKvDType(std::string_view name) {
  return ParseDTypeChoice(name, "KV dtype", kernels::IsKvDType);
}

// A sharded model's ranks (stage-major: stage x tp + tp_rank), their
// backends and communicators, and the threads that run them: rank 0 on the
// caller's thread, each other rank on one of its own, one step at a time.
struct Model::Ranks {
  int tp = 1, pp = 1;
  std::vector<kernels::KernelBackendPtr> backends;
  std::vector<kernels::CommunicatorPtr> world;
  std::vector<std::vector<kernels::CommunicatorPtr>> tp_groups;  // one group per stage
  std::vector<std::unique_ptr<Model>> models;

  absl::Mutex mu;
  int64_t step ABSL_GUARDED_BY(mu) = 0;   // steps started
  int running ABSL_GUARDED_BY(mu) = 0;    // threads still in this step
  bool stop ABSL_GUARDED_BY(mu) = false;
  // The step's arguments and each rank's result: written by Forward before
  // it starts a step, read by the threads until `running` falls to 0.
  absl::Span<const BatchSeq> batch;
  BlockPool* pool = nullptr;
  std::vector<absl::StatusOr<Logits>> results;
  std::vector<std::thread> threads;

  ~Ranks() {
    {
      absl::MutexLock lock(&mu);
      stop = true;
    }
    for (std::thread& t : threads) t.join();
  }

  void Start() {
    results.resize(models.size());
    for (size_t r = 1; r < models.size(); ++r) threads.emplace_back([this, r] { Loop(r); });
  }

  // A rank's step cannot fail once Load has checked its dtypes; if one did,
  // its peers would wait in a collective for ever, so it is a bug (CHECK).
  void RunRank(size_t r) {
    results[r] = models[r]->ForwardShard(batch, *pool);
    CHECK(results[r].ok()) << "rank " << r << " of a sharded model failed a step: " << results[r].status();
  }

  void Loop(size_t r) {
    int64_t seen = 0;
    while (true) {
      {
        absl::MutexLock lock(&mu);
        struct Wake {
          Ranks* self;
          int64_t seen;
        } wake{this, seen};
        mu.Await(absl::Condition(
            +[](Wake* w) ABSL_NO_THREAD_SAFETY_ANALYSIS { return w->self->stop || w->self->step != w->seen; },
            &wake));
        if (stop) return;
        seen = step;
      }
      RunRank(r);
      absl::MutexLock lock(&mu);
      --running;
    }
  }

  absl::StatusOr<Logits> Forward(absl::Span<const BatchSeq> b, BlockPool& p) {
    {
      absl::MutexLock lock(&mu);
      batch = b;
      pool = &p;
      running = static_cast<int>(models.size()) - 1;
      ++step;
    }
    RunRank(0);
    {
      absl::MutexLock lock(&mu);
      mu.Await(absl::Condition(
          +[](int* n) ABSL_NO_THREAD_SAFETY_ANALYSIS { return *n == 0; }, &running));
    }
    return std::move(results[static_cast<size_t>((pp - 1) * tp)]);  // the last stage's tp rank 0
  }
};

Model::~Model() { Unreside(); }

namespace {

using ArrayFn = std::function<void(const void*, int64_t)>;

// A float array's memory, and a weight matrix's arrays (values, scales,
// zeros), for Model::ForEachArray.
void ArraysOf(const std::vector<float>& v, const ArrayFn& fn) {
  fn(v.data(), static_cast<int64_t>(v.size() * sizeof(float)));
}
void ArraysOf(const kernels::HostWeights& w, const ArrayFn& fn) {
  fn(w.values.data(), static_cast<int64_t>(w.values.size()));
  ArraysOf(w.scales, fn);
  fn(w.zeros.data(), static_cast<int64_t>(w.zeros.size()));
}

}  // namespace

void Model::Layer::ForEachArray(const std::function<void(const void*, int64_t)>& fn) const {
  for (const std::vector<float>* v : {&input_norm, &post_norm, &q_norm, &k_norm, &attn_out_norm, &mlp_out_norm,
                                      &bqkv, &bo}) {
    ArraysOf(*v, fn);
  }
  for (const kernels::HostWeights* w : {&wqkv, &wo, &wgu, &wdown, &router}) ArraysOf(*w, fn);
  for (const kernels::HostWeights& w : expert_weights) ArraysOf(w, fn);
}

void Model::ForEachArray(std::optional<int64_t> layer,
                         const std::function<void(const void*, int64_t)>& fn) const {
  const auto live = [&](const void* p, int64_t bytes) {
    if (p != nullptr && bytes > 0) fn(p, bytes);
  };
  if (layer.has_value()) {
    layers_[*layer - shard_.layer_begin].ForEachArray(live);
    return;
  }
  for (const Layer& L : layers_) L.ForEachArray(live);
  for (const kernels::HostWeights* w : {&embed_, &lm_head_}) ArraysOf(*w, live);
  for (const std::vector<float>* v : {&final_norm_, &inv_freq_, &inv_freq_local_}) ArraysOf(*v, live);
}

absl::Status Model::Reside(std::optional<int64_t> layer) {
  // Only a backend whose memory the host cannot address keeps copies (the
  // CPU's reads the arrays themselves).
  if (backend_->DefaultBufferType().IsHost()) return absl::OkStatus();
  resident_ = true;
  absl::Status status;
  ForEachArray(layer, [&](const void* p, int64_t bytes) {
    if (status.ok()) status = backend_->MakeResident(p, bytes);
  });
  return status;
}

void Model::Unreside(std::optional<int64_t> layer) {
  if (!resident_) return;
  ForEachArray(layer, [&](const void* p, int64_t) { backend_->ReleaseResident(p); });
}

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& dir, kernels::KernelBackend* backend,
                                                   const LoadOptions& options) {
  std::unique_ptr<Model> m(new Model());
  m->dir_ = dir;
  m->backend_ = backend;
  ASSIGN_OR_RETURN(m->config_, spec::ModelConfig::FromFile(
                                   (std::filesystem::path(dir) / "config.json").string()));
  const spec::ModelConfig& c = m->config_;
  if (c.mlp_bias) {
    return absl::UnimplementedError(absl::StrCat(dir, "/config.json: mlp_bias=true is not supported"));
  }
  m->kv_dtype_ = options.kv_dtype.value_or(backend->DefaultKvDType());
  if (!backend->SupportsKv(m->kv_dtype_)) {
    return absl::UnimplementedError(absl::StrCat("the ", backend->Name(), " backend does not hold a ",
                                                 kernels::DTypeName(m->kv_dtype_), " KV cache"));
  }
  m->inv_freq_ = kernels::RopeInvFreq(c.rope);
  if (c.local_rope) m->inv_freq_local_ = kernels::RopeInvFreq(*c.local_rope);
  m->shard_.layer_end = c.num_layers;
  const int tp = options.tp, pp = options.pp;
  if (options.graph_max_batch < 0) return absl::InvalidArgumentError("graph_max_batch must be >= 0");
  if (tp == 1 && pp == 1) {
    m->graph_max_batch_ = options.graph_max_batch;
    RETURN_IF_ERROR(m->LoadWeights(options));
    RETURN_IF_ERROR(m->Reside());
    return m;
  }
  if (tp < 1 || pp < 1) return absl::InvalidArgumentError("tensor and pipeline parallelism must be >= 1");
  if (c.num_heads % tp != 0 || c.num_kv_heads % tp != 0 || c.intermediate_size % tp != 0 ||
      c.moe_intermediate_size % tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor parallelism ", tp, " must divide the model's attention heads (", c.num_heads, "), KV heads (",
        c.num_kv_heads, ") and intermediate size (", c.intermediate_size,
        c.num_experts > 0 ? absl::StrCat("; the experts': ", c.moe_intermediate_size) : "", ") in ", dir,
        "/config.json"));
  }
  if (pp > c.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline parallelism ", pp, " is more stages than the model's ", c.num_layers, " layers"));
  }
  if (c.gptq && tp > 1) {
    return absl::UnimplementedError(absl::StrCat("the GPTQ checkpoint in ", dir,
                                                 " cannot be split for tensor parallelism (its packed columns are "
                                                 "not sliced); run it with tp 1"));
  }
  const int threads = options.rank_threads > 0 ? options.rank_threads : std::max(1, AvailableCores() / tp);
  auto ranks = std::make_unique<Ranks>();
  ranks->tp = tp;
  ranks->pp = pp;
  ranks->world = kernels::NewThreadCommunicators(tp * pp);
  for (int stage = 0; stage < pp; ++stage) {
    ranks->tp_groups.push_back(kernels::NewThreadCommunicators(tp));
    for (int r = 0; r < tp; ++r) {
      ASSIGN_OR_RETURN(kernels::KernelBackendPtr be, options.rank_backend
                                                          ? options.rank_backend(threads)
                                                          : kernels::NewBackend(options.Backend(threads)));
      std::unique_ptr<Model> shard(new Model());
      shard->dir_ = dir;
      shard->config_ = c;
      shard->backend_ = be.get();
      shard->kv_dtype_ = m->kv_dtype_;
      shard->inv_freq_ = m->inv_freq_;
      shard->inv_freq_local_ = m->inv_freq_local_;
      shard->shard_ = Shard{.tp_rank = r,
                            .tp = tp,
                            .stage = stage,
                            .pp = pp,
                            .layer_begin = c.num_layers * stage / pp,
                            .layer_end = c.num_layers * (stage + 1) / pp,
                            .tp_group = ranks->tp_groups.back()[static_cast<size_t>(r)].get(),
                            .world = ranks->world[static_cast<size_t>(stage * tp + r)].get()};
      RETURN_IF_ERROR(shard->LoadWeights(options));
      RETURN_IF_ERROR(shard->Reside());
      ranks->backends.push_back(std::move(be));
      ranks->models.push_back(std::move(shard));
    }
  }
  ranks->Start();
  m->ranks_ = std::move(ranks);
  return m;
}

std::pair<int64_t, int64_t> Model::VocabRange(int r) const {
  const int64_t V = config_.vocab_size, tp = shard_.tp;
  const int64_t first = V * r / tp;
  return {first, V * (r + 1) / tp - first};
}

absl::Status Model::LoadWeights(const LoadOptions& options) {
  const spec::ModelConfig& c = config_;
  const Shard& sh = shard_;
  ASSIGN_OR_RETURN(auto st, SafetensorsModel::Open(dir_, config_.tensor_prefix));
  const int64_t H = c.hidden_size, V = c.vocab_size;
  const int64_t qd = c.q_dim(), kvd = c.kv_dim(), qd_r = qd / sh.tp, kvd_r = kvd / sh.tp;
  const std::optional<kernels::DType> all = options.weight_dtype;
  const std::optional<PrecisionMap>& map = options.precision_map;
  if (map) {
    if (static_cast<int64_t>(map->layers.size()) != c.num_layers) {
      return absl::InvalidArgumentError(absl::StrCat("precision map ", map->source, " has ", map->layers.size(),
                                                     " layers; the model in ", dir_, " has ", c.num_layers));
    }
    if (!map->experts.empty() && c.num_experts == 0) {
      return absl::InvalidArgumentError(absl::StrCat("precision map ", map->source, " names experts' dtypes; the model in ",
                                                     dir_, " has no experts"));
    }
    if (c.gptq) {
      return absl::InvalidArgumentError(absl::StrCat("precision map ", map->source, ": the GPTQ checkpoint in ", dir_,
                                                     " holds its linear layers as q4z; a map applies to float "
                                                     "checkpoints"));
    }
  }
  // The first stage looks tokens up; the last stage computes the logits
  // (from the embedding when lm_head is tied to it), each tp rank those of
  // its share of the vocabulary (VocabRange), gathered by rank 0.
  const bool embeds = sh.stage == 0, heads = sh.stage == sh.pp - 1;
  const std::optional<kernels::DType> embed_dt = map && map->embedding ? map->embedding : all;
  const auto [vocab_first, vocab_count] = VocabRange(sh.tp_rank);
  // Tied and unsharded, the head is the whole embedding table (no copy).
  const bool head_is_embed = c.tie_word_embeddings && sh.tp == 1;
  if (embeds || (heads && head_is_embed)) {
    ASSIGN_OR_RETURN(embed_, LoadMatrix(*st, {{"model.embed_tokens.weight", V}}, H, embed_dt, *backend_));
  }
  if (heads) {
    RETURN_IF_ERROR(LoadNorm(*st, "model.norm.weight", H, final_norm_));
    if (!head_is_embed) {
      const std::string name = c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
      const std::optional<kernels::DType> dt = c.tie_word_embeddings ? embed_dt : map && map->lm_head ? map->lm_head : all;
      ASSIGN_OR_RETURN(lm_head_, LoadMatrix(*st, {{name, V, vocab_first, vocab_count}}, H, dt, *backend_));
    }
  }
  if (c.tie_word_embeddings && map && map->lm_head && map->lm_head != embed_dt) {
    return absl::InvalidArgumentError(absl::StrCat("precision map ", map->source, ": lm_head is tied to the "
                                                   "embedding in ", dir_, ", so it cannot have its own dtype"));
  }
  layers_.resize(sh.layer_end - sh.layer_begin);
  for (int64_t i = sh.layer_begin; i < sh.layer_end; ++i) {
    Layer& L = layers_[i - sh.layer_begin];
    const std::optional<kernels::DType> dt = map ? std::optional<kernels::DType>(map->layers[i]) : all;
    const std::string p = absl::StrCat("model.layers.", i, ".");
    RETURN_IF_ERROR(LoadNorm(*st, p + "input_layernorm.weight", H, L.input_norm));
    if (c.gemma_norms) {
      // Gemma-3: the pre-MLP norm is pre_feedforward_layernorm; the other two
      // normalise the attention's and the MLP's outputs.
      RETURN_IF_ERROR(LoadNorm(*st, p + "pre_feedforward_layernorm.weight", H, L.post_norm));
      RETURN_IF_ERROR(LoadNorm(*st, p + "post_attention_layernorm.weight", H, L.attn_out_norm));
      RETURN_IF_ERROR(LoadNorm(*st, p + "post_feedforward_layernorm.weight", H, L.mlp_out_norm));
    } else {
      RETURN_IF_ERROR(LoadNorm(*st, p + "post_attention_layernorm.weight", H, L.post_norm));
    }
    if (c.qk_norm) {
      RETURN_IF_ERROR(LoadNorm(*st, p + "self_attn.q_norm.weight", c.head_dim, L.q_norm));
      RETURN_IF_ERROR(LoadNorm(*st, p + "self_attn.k_norm.weight", c.head_dim, L.k_norm));
    }
    // A precision map's experts list gives the experts their own dtype.
    const std::optional<kernels::DType> experts_dt =
        map && !map->experts.empty() ? std::optional<kernels::DType>(map->experts[static_cast<size_t>(i)]) : dt;
    RETURN_IF_ERROR(LoadLayerLinears(*st, i, dt, experts_dt));
    if (c.attention_bias) {
      L.bqkv.clear();
      RETURN_IF_ERROR(LoadSlice(*st, p + "self_attn.q_proj.bias", qd, sh.tp_rank * qd_r, qd_r, L.bqkv));
      RETURN_IF_ERROR(LoadSlice(*st, p + "self_attn.k_proj.bias", kvd, sh.tp_rank * kvd_r, kvd_r, L.bqkv));
      RETURN_IF_ERROR(LoadSlice(*st, p + "self_attn.v_proj.bias", kvd, sh.tp_rank * kvd_r, kvd_r, L.bqkv));
    }
    // o_proj is row-parallel: its bias is added once, by tp rank 0.
    if (c.o_bias && sh.tp_rank == 0) {
      L.bo.resize(H);
      RETURN_IF_ERROR(LoadTensor(*st, p + "self_attn.o_proj.bias", {H}, L.bo.data()));
    }
  }
  return absl::OkStatus();
}

absl::Status Model::LoadNorm(const SafetensorsModel& st, const std::string& name, int64_t size,
                             std::vector<float>& dst) const {
  dst.resize(static_cast<size_t>(size));
  RETURN_IF_ERROR(LoadTensor(st, name, {size}, dst.data()));
  if (config_.gemma_norms) {
    for (float& w : dst) w += 1.0f;
  }
  return absl::OkStatus();
}

absl::Status Model::LoadLayerLinears(const SafetensorsModel& st, int64_t i, std::optional<kernels::DType> dt,
                                     std::optional<kernels::DType> experts_dt) {
  const spec::ModelConfig& c = config_;
  const Shard& sh = shard_;
  const int64_t H = c.hidden_size, I = c.intermediate_size, qd = c.q_dim(), kvd = c.kv_dim();
  // This rank's slices: its heads' rows of q, k and v and columns of o_proj;
  // its share of the MLP's rows of gate and up and columns of down.
  // At tp 1 each slice is the whole tensor, which LoadMatrix reads directly.
  const int64_t r = sh.tp_rank, qd_r = qd / sh.tp, kvd_r = kvd / sh.tp, I_r = I / sh.tp;
  const std::string p = absl::StrCat("model.layers.", i, ".");
  Layer& L = layers_[i - sh.layer_begin];
  ASSIGN_OR_RETURN(L.wqkv, LoadLinear(st, c,
                                      {{p + "self_attn.q_proj.weight", qd, r * qd_r, qd_r},
                                       {p + "self_attn.k_proj.weight", kvd, r * kvd_r, kvd_r},
                                       {p + "self_attn.v_proj.weight", kvd, r * kvd_r, kvd_r}},
                                      H, dt, *backend_));
  ASSIGN_OR_RETURN(L.wo, LoadLinear(st, c, {{p + "self_attn.o_proj.weight", H}}, qd, dt, *backend_,
                                    Cols{r * qd_r, qd_r}));
  if (c.IsMoeLayer(i)) return LoadExperts(st, i, experts_dt);
  ASSIGN_OR_RETURN(L.wgu, LoadLinear(st, c,
                                     {{p + "mlp.gate_proj.weight", I, r * I_r, I_r},
                                      {p + "mlp.up_proj.weight", I, r * I_r, I_r}},
                                     H, dt, *backend_));
  ASSIGN_OR_RETURN(L.wdown, LoadLinear(st, c, {{p + "mlp.down_proj.weight", H}}, I, dt, *backend_,
                                       Cols{r * I_r, I_r}));
  return absl::OkStatus();
}

absl::Status Model::LoadExperts(const SafetensorsModel& st, int64_t i, std::optional<kernels::DType> dt) {
  const spec::ModelConfig& c = config_;
  const Shard& sh = shard_;
  const int64_t H = c.hidden_size, I = c.moe_intermediate_size, r = sh.tp_rank, I_r = I / sh.tp;
  Layer& L = layers_[i - sh.layer_begin];
  ASSIGN_OR_RETURN(L.router, LoadMatrix(st, {{c.RouterName(i), c.num_experts}}, H, kernels::DType::kF32, *backend_));
  L.expert_weights.clear();
  for (int64_t e = 0; e < c.num_experts; ++e) {
    // Each expert split as the dense MLP is: its gate and up rows, its down columns.
    const spec::ModelConfig::ExpertNames n = c.ExpertTensorNames(i, e);
    ASSIGN_OR_RETURN(kernels::HostWeights gu,
                     LoadLinear(st, c, {{n.gate, I, r * I_r, I_r}, {n.up, I, r * I_r, I_r}}, H, dt, *backend_));
    ASSIGN_OR_RETURN(kernels::HostWeights down, LoadLinear(st, c, {{n.down, H}}, I, dt, *backend_, Cols{r * I_r, I_r}));
    L.expert_weights.push_back(std::move(gu));
    L.expert_weights.push_back(std::move(down));
  }
  L.experts.clear();
  for (int64_t e = 0; e < c.num_experts; ++e) {
    L.experts.push_back({L.expert_weights[2 * e].view(), L.expert_weights[2 * e + 1].view()});
  }
  return absl::OkStatus();
}

int64_t Model::Layer::linear_bytes() const {
  int64_t b = wqkv.bytes() + wo.bytes() + wgu.bytes() + wdown.bytes() + router.bytes();
  for (const kernels::HostWeights& w : expert_weights) b += w.bytes();
  return b;
}

absl::Status Model::ReloadLayer(int64_t layer, std::optional<kernels::DType> dtype) {
  if (layer < 0 || layer >= config_.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", layer, " is not in 0..", config_.num_layers - 1));
  }
  if (config_.gptq) {
    return absl::InvalidArgumentError(absl::StrCat("the GPTQ checkpoint in ", dir_, " holds its linear layers as q4z"));
  }
  if (ranks_ != nullptr) {
    return absl::InvalidArgumentError("a layer of a sharded model (tp or pp above 1) is not reloaded");
  }
  ASSIGN_OR_RETURN(auto st, SafetensorsModel::Open(dir_, config_.tensor_prefix));
  Unreside(layer);  // Before its arrays are replaced.
  RETURN_IF_ERROR(LoadLayerLinears(*st, layer, dtype, dtype));
  return Reside(layer);
}

int64_t Model::layer_weight_bytes(int64_t layer) const {
  if (ranks_ != nullptr) {
    int64_t b = 0;  // over the tp ranks of the stage that holds it
    for (const auto& r : ranks_->models) {
      if (layer >= r->shard_.layer_begin && layer < r->shard_.layer_end) b += r->layer_weight_bytes(layer);
    }
    return b;
  }
  return layers_[layer - shard_.layer_begin].linear_bytes();
}

int64_t Model::weight_bytes() const {
  int64_t b = embed_.bytes() + lm_head_.bytes() + static_cast<int64_t>(final_norm_.size()) * 4;
  for (const Layer& L : layers_) {
    b += L.linear_bytes();
    b += static_cast<int64_t>(L.input_norm.size() + L.post_norm.size() + L.q_norm.size() + L.k_norm.size() +
                              L.attn_out_norm.size() + L.mlp_out_norm.size() + L.bqkv.size() + L.bo.size()) *
         4;
  }
  if (ranks_ != nullptr) {
    for (const auto& r : ranks_->models) b += r->weight_bytes();
  }
  return b;
}

kernels::KvLayout Model::KvLayoutFor(int64_t block_size) const {
  return kernels::KvLayout{.num_layers = config_.num_layers,
                           .num_kv_heads = config_.num_kv_heads,
                           .block_size = block_size,
                           .head_dim = config_.head_dim,
                           .dtype = kv_dtype_};
}

std::vector<kernels::DType> Model::layer_dtypes() const {
  std::vector<kernels::DType> out;
  for (const Layer& L : layers_) out.push_back(L.wqkv.dtype);
  if (ranks_ != nullptr) {
    for (const auto& r : ranks_->models) {  // stage by stage, from each stage's tp rank 0
      if (r->shard_.tp_rank != 0) continue;
      const std::vector<kernels::DType> d = r->layer_dtypes();
      out.insert(out.end(), d.begin(), d.end());
    }
  }
  return out;
}

absl::Status Model::CheckBatch(absl::Span<const BatchSeq> batch, const BlockPool& pool) const {
  const spec::ModelConfig& c = config_;
  const kernels::KvLayout& kl = pool.layout();
  if (kl.num_layers != c.num_layers || kl.num_kv_heads != c.num_kv_heads ||
      kl.head_dim != c.head_dim) {
    return absl::InvalidArgumentError("KV pool layout does not match the model");
  }
  if (!backend_->SupportsKv(kl.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("the ", backend_->Name(), " backend does not read a ",
                                                   kernels::DTypeName(kl.dtype), " KV pool"));
  }
  if (batch.empty()) return absl::InvalidArgumentError("empty batch");
  const int64_t bs = kl.block_size;
  for (size_t s = 0; s < batch.size(); ++s) {
    const BatchSeq& b = batch[s];
    const int64_t len = static_cast<int64_t>(b.tokens.size());
    if (len == 0) return absl::InvalidArgumentError(absl::StrCat("sequence ", s, " has no tokens"));
    if (b.start_pos < 0) return absl::InvalidArgumentError("negative start position");
    if (b.start_pos + len > c.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", s, " needs ", b.start_pos + len, " positions, more than the model's context of ",
          c.max_position_embeddings, " (max_position_embeddings in ", dir_, "/config.json)"));
    }
    for (int32_t id : b.tokens) {
      if (id < 0 || id >= c.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("token id ", id, " is outside the vocabulary of ",
                                                       c.vocab_size));
      }
    }
    if (static_cast<int64_t>(b.block_table.size()) * bs < b.start_pos + len) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": block table covers ",
                                                     b.block_table.size() * bs, " positions, ",
                                                     b.start_pos + len, " needed"));
    }
    for (int32_t blk : b.block_table) {
      if (blk < 0 || blk >= pool.num_blocks()) {
        return absl::InvalidArgumentError(absl::StrCat("block id ", blk, " is outside the pool"));
      }
    }
    for (int32_t r : b.logit_rows) {
      if (r < 0 || r >= len) return absl::InvalidArgumentError("logit row outside the sequence's tokens");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Logits> Model::Forward(absl::Span<const BatchSeq> batch, BlockPool& pool) {
  const auto start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(CheckBatch(batch, pool));
  absl::StatusOr<Logits> logits = ranks_ != nullptr ? ranks_->Forward(batch, pool) : ForwardShard(batch, pool);
  if (logits.ok()) LogStep(batch, start);
  return logits;
}

namespace {

// One step's regions of the step buffer, as byte offsets, each 64-byte aligned.
struct Carver {
  int64_t size = 0;
  int64_t Take(int64_t bytes) {
    const int64_t at = size;
    size += (bytes + 63) / 64 * 64;
    return at;
  }
};

}  // namespace

absl::Status Model::RunGraphed(int64_t bucket, absl::FunctionRef<absl::Status()> ops) {
  if (auto it = graphs_.find(bucket); it != graphs_.end()) {
    absl::Status replayed = backend_->Replay(*it->second);
    if (replayed.ok()) {
      ++graph_steps_;
      return replayed;
    }
    if (!absl::IsFailedPrecondition(replayed)) return replayed;
    graphs_.erase(it);  // Stale: run eagerly and capture it again.
  }
  // Eagerly first (which also grows the backend's scratch to the step),
  // then the same ops recorded.
  RETURN_IF_ERROR(ops());
  absl::Status why = backend_->BeginCapture();
  if (why.ok()) {
    const absl::Status recorded = ops();
    absl::StatusOr<std::unique_ptr<kernels::StepGraph>> graph = backend_->EndCapture();
    if (recorded.ok() && graph.ok()) {
      graphs_[bucket] = *std::move(graph);
      return absl::OkStatus();
    }
    why = recorded.ok() ? graph.status() : recorded;
  }
  LOG(WARNING) << "step graphs off: capturing a decode step of " << bucket << " sequences failed: " << why;
  graph_max_batch_ = 0;
  graphs_.clear();
  return absl::OkStatus();  // The eager run's results stand.
}

absl::StatusOr<Logits> Model::ForwardShard(absl::Span<const BatchSeq> batch, BlockPool& pool) {
  const spec::ModelConfig& c = config_;
  const Shard& sh = shard_;
  const kernels::KvLayout& kl = pool.layout();
  const int64_t bs = kl.block_size;
  int64_t S = static_cast<int64_t>(batch.size());
  int64_t T = 0, R = 0, table_len = 0;
  for (const BatchSeq& b : batch) {
    T += static_cast<int64_t>(b.tokens.size());
    R += static_cast<int64_t>(b.logit_rows.size());
    table_len += static_cast<int64_t>(b.block_table.size());
  }
  // A decode step (one token and its logits per sequence) that a step graph
  // may run: padded to its bucket, every sequence's block table given the
  // room the longest possible sequence needs, so that one graph serves
  // every step of the bucket.
  const int64_t S_real = S, R_real = R;
  const int64_t table_room = std::min<int64_t>(pool.num_blocks(), (c.max_position_embeddings + bs - 1) / bs);
  int64_t bucket = 0;
  if (graph_max_batch_ > 0 && S <= graph_max_batch_ && T == S && R == S) {
    bucket = S <= 8 ? static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(S))) : (S + 7) / 8 * 8;
    for (const BatchSeq& b : batch) {
      if (b.logit_rows.size() != 1 || static_cast<int64_t>(b.block_table.size()) > table_room) bucket = 0;
    }
  }
  const bool graphed = bucket > 0;
  if (graphed) {
    S = T = R = bucket;
    table_len = bucket * table_room;
  }

  // This rank's share: all of it unless tensor-parallel.
  const int64_t H = c.hidden_size, I = c.intermediate_size / sh.tp, V = c.vocab_size;
  const int64_t hd = c.head_dim, nq = c.num_heads / sh.tp, nkv = c.num_kv_heads / sh.tp;
  const int64_t qd = nq * hd, kvd = nkv * hd, kv_head_begin = sh.tp_rank * nkv;
  const int64_t qkvd = qd + 2 * kvd;
  const bool heads = sh.stage == sh.pp - 1;
  // The LM head's output on this rank: all the logits at tp 1, else its
  // share of the vocabulary (or, on rank 0, any rank's, as it receives them).
  const int64_t part_cols = sh.tp == 1 ? V : V / sh.tp + 1;
  // This stage's MLPs: dense, experts (each 1/tp of its width here), or both.
  bool dense = false, moe = false;
  for (int64_t li = sh.layer_begin; li < sh.layer_end; ++li) (c.IsMoeLayer(li) ? moe : dense) = true;
  const int64_t E = c.num_experts, K = c.experts_per_token, Ie = c.moe_intermediate_size / sh.tp;

  // The step's memory, one buffer of the backend's that the host reaches
  // only by one upload of the indices and one download of the logits:
  // activations, then the indices (token ids, positions, KV slots, logit
  // rows, block tables, the attention's sequences).
  Carver carve;
  const auto floats = [&](int64_t n) { return carve.Take(n * static_cast<int64_t>(sizeof(float))); };
  const int64_t x_at = floats(T * H), h_at = floats(T * H), qkv_at = floats(T * qkvd), q_at = floats(T * qd),
                k_at = floats(T * kvd), v_at = floats(T * kvd), attn_at = floats(T * qd),
                gu_at = floats(dense ? T * 2 * I : 0), act_at = floats(dense ? T * I : 0),
                partial_at = floats(sh.tp > 1 || c.gemma_norms || moe ? T * H : 0),
                scores_at = floats(moe ? T * E : 0),
                moe_at = carve.Take(moe ? kernels::MoeScratchBytes(T, K, E, H, Ie) : 0),
                sel_at = floats(heads ? R * H : 0), part_at = floats(heads ? R * part_cols : 0),
                logits_at = floats(heads && sh.tp > 1 && sh.tp_rank == 0 ? R * V : 0);
  Carver index;  // Inside the index region.
  const int64_t ids_at = index.Take(T * 4), pos_at = index.Take(T * 4), slots_at = index.Take(T * 4),
                rows_at = index.Take(R * 4), tables_at = index.Take(table_len * 4),
                seqs_at = index.Take(S * static_cast<int64_t>(sizeof(kernels::AttentionSeq)));
  const int64_t index_at = carve.Take(index.size);
  // Graphs record their buffer's addresses: theirs is their own, and when it
  // grows or the pool changes, every graph goes.
  kernels::BufferPtr& buffer = graphed ? graph_step_ : step_;
  const std::tuple<const void*, int64_t, int64_t> pool_key{pool.region_base(), pool.bytes(), pool.block_bytes()};
  if (graphed && graph_pool_ != pool_key) {
    graphs_.clear();
    graph_pool_ = pool_key;
  }
  if (buffer == nullptr || buffer->bytes() < carve.size) {
    const int64_t grown = std::max(carve.size, buffer == nullptr ? 0 : 2 * buffer->bytes());
    if (graphed) graphs_.clear();
    buffer.reset();
    ASSIGN_OR_RETURN(buffer, backend_->DefaultBufferType().Allocate(grown, "a forward step's activations"));
  }
  kernels::Buffer& step = *buffer;
  uint8_t* const base = static_cast<uint8_t*>(step.base());  // Addresses for the ops, never dereferenced here.
  const auto at = [&](int64_t offset) { return reinterpret_cast<float*>(base + offset); };
  float *x = at(x_at), *h = at(h_at), *qkv = at(qkv_at), *q = at(q_at), *k = at(k_at), *v = at(v_at),
        *attn = at(attn_at), *gu = at(gu_at), *act = at(act_at), *partial = at(partial_at), *sel = at(sel_at),
        *part = at(part_at), *scores = at(scores_at);
  const int32_t* ids = reinterpret_cast<const int32_t*>(base + index_at + ids_at);
  const int32_t* positions = reinterpret_cast<const int32_t*>(base + index_at + pos_at);
  const int32_t* slots = reinterpret_cast<const int32_t*>(base + index_at + slots_at);
  const int32_t* logit_rows = reinterpret_cast<const int32_t*>(base + index_at + rows_at);
  const kernels::AttentionSeq* aseqs = reinterpret_cast<const kernels::AttentionSeq*>(base + index_at + seqs_at);

  // The indices, laid out on the host as they will lie in the buffer.
  staging_.assign(static_cast<size_t>(index.size), 0);
  {
    uint8_t* st = staging_.data();
    const auto put = [&](int64_t offset, int64_t i, int32_t value) {
      std::memcpy(st + offset + i * 4, &value, sizeof(value));
    };
    int64_t row = 0, logit = 0, table = 0;
    for (int64_t s = 0; s < S; ++s) {
      if (s >= S_real) {
        // A padding row: token 0 at position 0, its K and V stored nowhere
        // (slot -1), attending to nothing, its logits computed and dropped.
        const kernels::AttentionSeq pad{
            .first_row = s,
            .num_tokens = 0,
            .start_pos = 0,
            .block_table = reinterpret_cast<const int32_t*>(base + index_at + tables_at) + s * table_room};
        std::memcpy(st + seqs_at + s * static_cast<int64_t>(sizeof(pad)), &pad, sizeof(pad));
        put(rows_at, s, static_cast<int32_t>(s));
        put(slots_at, s, -1);
        continue;
      }
      const BatchSeq& b = batch[static_cast<size_t>(s)];
      if (graphed) table = s * table_room;
      const kernels::AttentionSeq seq{
          .first_row = row,
          .num_tokens = static_cast<int64_t>(b.tokens.size()),
          .start_pos = b.start_pos,
          .block_table = reinterpret_cast<const int32_t*>(base + index_at + tables_at) + table};
      std::memcpy(st + seqs_at + s * static_cast<int64_t>(sizeof(seq)), &seq, sizeof(seq));
      for (int32_t r : b.logit_rows) put(rows_at, logit++, static_cast<int32_t>(row + r));
      for (int32_t blk : b.block_table) put(tables_at, table++, blk);
      for (size_t i = 0; i < b.tokens.size(); ++i, ++row) {
        const int64_t p = b.start_pos + static_cast<int64_t>(i);
        put(ids_at, row, b.tokens[i]);
        put(pos_at, row, static_cast<int32_t>(p));
        // Its cache slot (block * block_size + slot): where its K and V go.
        put(slots_at, row, static_cast<int32_t>(b.block_table[p / bs] * bs + p % bs));
      }
    }
  }
  RETURN_IF_ERROR(step.Write(index_at, staging_.data(), index.size));

  kernels::KernelBackend& be = *backend_;
  // The pool's memory for the ops below (the backend's own buffer).
  uint8_t* kv = static_cast<uint8_t*>(pool.region_base());
  const float scale = c.AttentionScale();
  // The layers (after the embedding, or the stage before's activations).
  const auto layers = [&]() -> absl::Status {
    if (sh.stage == 0) {
      RETURN_IF_ERROR(be.EmbeddingLookup(embed_.view(), ids, x, T));
      if (c.embed_scale != 1.0) be.Scale(x, static_cast<float>(c.embed_scale), T * H);  // Gemma: sqrt(hidden)
    } else {
      be.Recv(*sh.world, (sh.stage - 1) * sh.tp + sh.tp_rank, x, T * H);
    }
    // x += a * w^T (+ bias), normalised first by `out_norm` where a model has
    // one (Gemma): in one GEMM, or, for a row-parallel linear of a
    // tensor-parallel rank, this rank's partial product summed over the ranks.
    // x += partial, summed over the tensor-parallel ranks and normalised
    // by `out_norm` first where they apply.
    auto add_partial = [&](const std::vector<float>& out_norm) {
      if (sh.tp > 1) be.AllReduceSum(*sh.tp_group, partial, T * H);
      if (!out_norm.empty()) be.RmsNorm(partial, out_norm.data(), partial, T, H, static_cast<float>(c.rms_norm_eps));
      be.Add(partial, x, T * H);
    };
    auto add_linear = [&](const float* a, const kernels::HostWeights& w, const std::vector<float>& bias,
                          const std::vector<float>& out_norm) {
      const float* b = bias.empty() ? nullptr : bias.data();
      if (sh.tp == 1 && out_norm.empty()) return be.Gemm(a, w.view(), b, x, T, true);
      RETURN_IF_ERROR(be.Gemm(a, w.view(), b, partial, T, false));
      add_partial(out_norm);
      return absl::OkStatus();
    };
    for (int64_t li = sh.layer_begin; li < sh.layer_end; ++li) {
      const Layer& L = layers_[li - sh.layer_begin];
      be.RmsNorm(x, L.input_norm.data(), h, T, H, static_cast<float>(c.rms_norm_eps));
      const float* bq = L.bqkv.empty() ? nullptr : L.bqkv.data();
      // One GEMM for q, k and v (one pass of the threads, not three), its
      // columns then split into the three the ops below read.
      RETURN_IF_ERROR(be.Gemm(h, L.wqkv.view(), bq, qkv, T, false));
      be.Copy2D(qkv, qkvd, q, qd, T, qd);
      be.Copy2D(qkv + qd, qkvd, k, kvd, T, kvd);
      be.Copy2D(qkv + qd + kvd, qkvd, v, kvd, T, kvd);
      if (c.qk_norm) {  // Each head's q and k, normalised over head_dim (qwen3).
        be.RmsNorm(q, L.q_norm.data(), q, T * nq, hd, static_cast<float>(c.rms_norm_eps));
        be.RmsNorm(k, L.k_norm.data(), k, T * nkv, hd, static_cast<float>(c.rms_norm_eps));
      }
      // Gemma-3's sliding-window layers rotate by their own base.
      const float* freq =
          !inv_freq_local_.empty() && c.layer_window[li] > 0 ? inv_freq_local_.data() : inv_freq_.data();
      be.Rope(q, positions, freq, T, nq, hd);
      be.Rope(k, positions, freq, T, nkv, hd);
      be.KvStore({.k = k, .v = v, .slots = slots, .rows = T, .kv = kv, .layout = kl, .layer = li,
                  .kv_head_begin = kv_head_begin, .kv_heads = nkv});
      be.PagedAttention({.q = q, .out = attn, .kv = kv, .layout = kl, .layer = li, .num_q_heads = nq,
                         .scale = scale * static_cast<float>(c.LayerRope(li).ScoreFactor()),
                         .softcap = static_cast<float>(c.attn_softcap), .window = c.layer_window[li],
                         .seqs = aseqs, .num_seqs = S, .kv_head_begin = kv_head_begin, .kv_heads = nkv});
      RETURN_IF_ERROR(add_linear(attn, L.wo, L.bo, L.attn_out_norm));
      be.RmsNorm(x, L.post_norm.data(), h, T, H, static_cast<float>(c.rms_norm_eps));
      if (c.IsMoeLayer(li)) {
        // The router's scores (every rank alike), then each token's experts.
        RETURN_IF_ERROR(be.Gemm(h, L.router.view(), nullptr, scores, T, false));
        RETURN_IF_ERROR(be.Moe({.x = h, .scores = scores, .out = partial, .experts = L.experts.data(),
                                .num_experts = E, .top_k = K, .renormalize = c.norm_topk_prob, .rows = T,
                                .scratch = base + moe_at}));
        add_partial(L.mlp_out_norm);
        continue;
      }
      RETURN_IF_ERROR(be.Gemm(h, L.wgu.view(), nullptr, gu, T, false));
      if (c.mlp_activation == spec::ModelConfig::Activation::kGeluTanh) {
        be.GeluTanhMul(gu, act, T, I);
      } else {
        be.SiluMul(gu, act, T, I);
      }
      RETURN_IF_ERROR(add_linear(act, L.wdown, {}, L.mlp_out_norm));
    }
    return absl::OkStatus();
  };
  // Final norm and LM head only on the rows whose logits are wanted, on
  // every tp rank alike (the all-reduce gave each the same bits), each
  // rank's share of the vocabulary.
  const kernels::HostWeights& head = lm_head_.n == 0 ? embed_ : lm_head_;
  const auto lm_head = [&]() -> absl::Status {
    be.GatherRows(x, logit_rows, R, H, sel);
    be.RmsNorm(sel, final_norm_.data(), sel, R, H, static_cast<float>(c.rms_norm_eps));
    return be.Gemm(sel, head.view(), nullptr, part, R, false);
  };
  Logits logits{.vocab_size = V};
  // Soft-capped logits (final_logit_softcapping), on the host's copy.
  const auto cap = [&]() {
    const float f = static_cast<float>(c.final_softcap);
    if (f <= 0) return;
    for (float& l : logits.data) l = f * std::tanh(l / f);
  };
  if (graphed) {
    RETURN_IF_ERROR(RunGraphed(bucket, [&]() -> absl::Status {
      RETURN_IF_ERROR(layers());
      return lm_head();
    }));
    logits.data.resize(R_real * V);
    RETURN_IF_ERROR(step.Read(part_at, logits.data.data(), R_real * V * static_cast<int64_t>(sizeof(float))));
    cap();
    return logits;
  }
  RETURN_IF_ERROR(layers());
  if (!heads) {
    be.Send(*sh.world, (sh.stage + 1) * sh.tp + sh.tp_rank, x, T * H);
    return Logits{};
  }
  if (R == 0) return sh.tp_rank == 0 ? Logits{.vocab_size = V} : Logits{};
  RETURN_IF_ERROR(lm_head());
  if (sh.tp == 1) {
    logits.data.resize(R * V);
    RETURN_IF_ERROR(step.Read(part_at, logits.data.data(), R * V * static_cast<int64_t>(sizeof(float))));
    cap();
    return logits;
  }
  // Each row of a GEMM is its own dot products, so a slice's logits are
  // the unsharded head's bits; rank 0 puts each rank's into its columns.
  const int64_t count = VocabRange(sh.tp_rank).second;
  if (sh.tp_rank != 0) {
    be.Send(*sh.tp_group, 0, part, R * count);
    return Logits{};
  }
  float* assembled = at(logits_at);
  for (int r = 0; r < sh.tp; ++r) {
    const auto [rf, rc] = VocabRange(r);
    if (r > 0) be.Recv(*sh.tp_group, r, part, R * rc);
    be.Copy2D(part, rc, assembled + rf, V, R, rc);
  }
  logits.data.resize(R * V);
  RETURN_IF_ERROR(step.Read(logits_at, logits.data.data(), R * V * static_cast<int64_t>(sizeof(float))));
  cap();
  return logits;
}

}  // namespace duet::engine
