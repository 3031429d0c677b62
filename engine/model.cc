#include "engine/model.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "engine/gptq.h"
#include "engine/safetensors.h"

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

// A weight matrix made of the tensors `parts` ({name, rows}) stacked by
// rows, each [rows][k], in `dtype` (nullopt: the first part's own).
struct Part {
  std::string name;
  int64_t rows;
};
absl::StatusOr<kernels::HostWeights> LoadMatrix(const SafetensorsModel& st, const std::vector<Part>& parts,
                                                int64_t k, std::optional<kernels::DType> dtype,
                                                const kernels::KernelBackend& backend) {
  int64_t n = 0;
  for (const Part& p : parts) n += p.rows;
  std::vector<float> dense(n * k);
  int64_t row = 0;
  for (const Part& p : parts) {
    RETURN_IF_ERROR(LoadTensor(st, p.name, {p.rows, k}, dense.data() + row * k));
    row += p.rows;
  }
  if (!dtype) {
    ASSIGN_OR_RETURN(const TensorView* first, st.Get(parts[0].name));
    dtype = KernelDType(first->dtype);
  }
  if (!backend.Supports(kernels::WeightOp::kGemm, *dtype)) {
    return absl::UnimplementedError(absl::StrCat("the ", backend.Name(), " backend does not run ",
                                                 kernels::DTypeName(*dtype), " weights (", parts[0].name, ")"));
  }
  return kernels::QuantizeWeights(dense.data(), n, k, *dtype);
}

// A linear layer made of `parts` stacked by rows: a GPTQ checkpoint's as
// kQ4Z (each part's base name is its name without ".weight"), else as
// LoadMatrix loads it.
absl::StatusOr<kernels::HostWeights> LoadLinear(const SafetensorsModel& st, const ModelConfig& c,
                                                const std::vector<Part>& parts, int64_t k,
                                                std::optional<kernels::DType> dtype,
                                                const kernels::KernelBackend& backend) {
  if (!c.gptq) return LoadMatrix(st, parts, k, dtype, backend);
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

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& dir, kernels::KernelBackend* backend,
                                                   const LoadOptions& options) {
  std::unique_ptr<Model> m(new Model());
  m->dir_ = dir;
  m->backend_ = backend;
  ASSIGN_OR_RETURN(m->config_, ModelConfig::FromFile(
                                   (std::filesystem::path(dir) / "config.json").string()));
  if (m->config_.mlp_bias) {
    return absl::UnimplementedError(absl::StrCat(dir, "/config.json: mlp_bias=true is not supported"));
  }
  m->kv_dtype_ = options.kv_dtype.value_or(backend->DefaultKvDType());
  if (!backend->SupportsKv(m->kv_dtype_)) {
    return absl::UnimplementedError(absl::StrCat("the ", backend->Name(), " backend does not hold a ",
                                                 kernels::DTypeName(m->kv_dtype_), " KV cache"));
  }
  RETURN_IF_ERROR(m->LoadWeights(options));
  m->inv_freq_ = kernels::RopeInvFreq(m->config_.rope);
  return m;
}

absl::Status Model::LoadWeights(const LoadOptions& options) {
  const ModelConfig& c = config_;
  ASSIGN_OR_RETURN(auto st, SafetensorsModel::Open(dir_));
  const int64_t H = c.hidden_size, V = c.vocab_size;
  const int64_t qd = c.q_dim(), kvd = c.kv_dim();
  const std::optional<kernels::DType> all = options.weight_dtype;
  const std::optional<PrecisionMap>& map = options.precision_map;
  if (map) {
    if (static_cast<int64_t>(map->layers.size()) != c.num_layers) {
      return absl::InvalidArgumentError(absl::StrCat("precision map ", map->source, " has ", map->layers.size(),
                                                     " layers; the model in ", dir_, " has ", c.num_layers));
    }
    if (c.gptq) {
      return absl::InvalidArgumentError(absl::StrCat("precision map ", map->source, ": the GPTQ checkpoint in ", dir_,
                                                     " holds its linear layers as q4z; a map applies to float "
                                                     "checkpoints"));
    }
  }
  const std::optional<kernels::DType> embed_dt = map && map->embedding ? map->embedding : all;
  ASSIGN_OR_RETURN(embed_, LoadMatrix(*st, {{"model.embed_tokens.weight", V}}, H, embed_dt, *backend_));
  final_norm_.resize(H);
  RETURN_IF_ERROR(LoadTensor(*st, "model.norm.weight", {H}, final_norm_.data()));
  if (!c.tie_word_embeddings) {
    ASSIGN_OR_RETURN(lm_head_, LoadMatrix(*st, {{"lm_head.weight", V}}, H,
                                          map && map->lm_head ? map->lm_head : all, *backend_));
  } else if (map && map->lm_head && map->lm_head != embed_dt) {
    return absl::InvalidArgumentError(absl::StrCat("precision map ", map->source, ": lm_head is tied to the "
                                                   "embedding in ", dir_, ", so it cannot have its own dtype"));
  }
  layers_.resize(c.num_layers);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    Layer& L = layers_[i];
    const std::optional<kernels::DType> dt = map ? std::optional<kernels::DType>(map->layers[i]) : all;
    const std::string p = absl::StrCat("model.layers.", i, ".");
    L.input_norm.resize(H);
    L.post_norm.resize(H);
    RETURN_IF_ERROR(LoadTensor(*st, p + "input_layernorm.weight", {H}, L.input_norm.data()));
    RETURN_IF_ERROR(LoadTensor(*st, p + "post_attention_layernorm.weight", {H}, L.post_norm.data()));
    RETURN_IF_ERROR(LoadLayerLinears(*st, i, dt));
    if (c.attention_bias) {
      L.bqkv.resize(qd + 2 * kvd);
      RETURN_IF_ERROR(LoadTensor(*st, p + "self_attn.q_proj.bias", {qd}, L.bqkv.data()));
      RETURN_IF_ERROR(LoadTensor(*st, p + "self_attn.k_proj.bias", {kvd}, L.bqkv.data() + qd));
      RETURN_IF_ERROR(LoadTensor(*st, p + "self_attn.v_proj.bias", {kvd}, L.bqkv.data() + qd + kvd));
    }
    if (c.o_bias) {
      L.bo.resize(H);
      RETURN_IF_ERROR(LoadTensor(*st, p + "self_attn.o_proj.bias", {H}, L.bo.data()));
    }
  }
  return absl::OkStatus();
}

absl::Status Model::LoadLayerLinears(const SafetensorsModel& st, int64_t i, std::optional<kernels::DType> dt) {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size, I = c.intermediate_size, qd = c.q_dim(), kvd = c.kv_dim();
  const std::string p = absl::StrCat("model.layers.", i, ".");
  Layer& L = layers_[i];
  ASSIGN_OR_RETURN(L.wqkv, LoadLinear(st, c,
                                      {{p + "self_attn.q_proj.weight", qd},
                                       {p + "self_attn.k_proj.weight", kvd},
                                       {p + "self_attn.v_proj.weight", kvd}},
                                      H, dt, *backend_));
  ASSIGN_OR_RETURN(L.wo, LoadLinear(st, c, {{p + "self_attn.o_proj.weight", H}}, qd, dt, *backend_));
  ASSIGN_OR_RETURN(L.wgu, LoadLinear(st, c, {{p + "mlp.gate_proj.weight", I}, {p + "mlp.up_proj.weight", I}},
                                     H, dt, *backend_));
  ASSIGN_OR_RETURN(L.wdown, LoadLinear(st, c, {{p + "mlp.down_proj.weight", H}}, I, dt, *backend_));
  return absl::OkStatus();
}

absl::Status Model::ReloadLayer(int64_t layer, std::optional<kernels::DType> dtype) {
  if (layer < 0 || layer >= config_.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", layer, " is not in 0..", config_.num_layers - 1));
  }
  if (config_.gptq) {
    return absl::InvalidArgumentError(absl::StrCat("the GPTQ checkpoint in ", dir_, " holds its linear layers as q4z"));
  }
  ASSIGN_OR_RETURN(auto st, SafetensorsModel::Open(dir_));
  return LoadLayerLinears(*st, layer, dtype);
}

int64_t Model::layer_weight_bytes(int64_t layer) const {
  const Layer& L = layers_[layer];
  return L.wqkv.bytes() + L.wo.bytes() + L.wgu.bytes() + L.wdown.bytes();
}

int64_t Model::weight_bytes() const {
  int64_t b = embed_.bytes() + lm_head_.bytes() + static_cast<int64_t>(final_norm_.size()) * 4;
  for (const Layer& L : layers_) {
    b += L.wqkv.bytes() + L.wo.bytes() + L.wgu.bytes() + L.wdown.bytes();
    b += static_cast<int64_t>(L.input_norm.size() + L.post_norm.size() + L.bqkv.size() + L.bo.size()) * 4;
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
  return out;
}

absl::StatusOr<Logits> Model::Forward(absl::Span<const BatchSeq> batch, BlockPool& pool) {
  const auto start = std::chrono::steady_clock::now();
  const ModelConfig& c = config_;
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
  int64_t T = 0, R = 0;
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
    T += len;
    R += static_cast<int64_t>(b.logit_rows.size());
  }

  const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  const int64_t hd = c.head_dim, nq = c.num_heads, nkv = c.num_kv_heads;
  const int64_t qd = c.q_dim(), kvd = c.kv_dim();
  x_.resize(T * H);
  h_.resize(T * H);
  q_.resize(T * qd);
  k_.resize(T * kvd);
  v_.resize(T * kvd);
  qkv_.resize(T * (qd + 2 * kvd));
  attn_.resize(T * qd);
  gu_.resize(T * 2 * I);
  act_.resize(T * I);

  std::vector<int32_t> ids(T), positions(T);
  std::vector<kernels::AttentionSeq> aseqs(batch.size());
  {
    int64_t row = 0;
    for (size_t s = 0; s < batch.size(); ++s) {
      const BatchSeq& b = batch[s];
      aseqs[s] = {.first_row = row, .num_tokens = static_cast<int64_t>(b.tokens.size()),
                  .start_pos = b.start_pos, .block_table = b.block_table.data()};
      for (size_t i = 0; i < b.tokens.size(); ++i, ++row) {
        ids[row] = b.tokens[i];
        positions[row] = static_cast<int32_t>(b.start_pos + i);
      }
    }
  }
  // Cache slot of every row: where its K and V go.
  std::vector<int32_t> row_block(T), row_slot(T);
  for (size_t s = 0; s < batch.size(); ++s) {
    for (int64_t i = 0; i < aseqs[s].num_tokens; ++i) {
      const int64_t r = aseqs[s].first_row + i, pos = aseqs[s].start_pos + i;
      row_block[r] = batch[s].block_table[pos / bs];
      row_slot[r] = static_cast<int32_t>(pos % bs);
    }
  }

  kernels::KernelBackend& be = *backend_;
  uint8_t* kv = pool.data();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  RETURN_IF_ERROR(be.EmbeddingLookup(embed_.view(), ids.data(), x_.data(), T));
  for (int64_t li = 0; li < c.num_layers; ++li) {
    const Layer& L = layers_[li];
    be.RmsNorm(x_.data(), L.input_norm.data(), h_.data(), T, H, static_cast<float>(c.rms_norm_eps));
    const float* bq = L.bqkv.empty() ? nullptr : L.bqkv.data();
    const kernels::WeightMatrix wqkv = L.wqkv.view();
    // One GEMM for q, k and v (one pass of the threads, not three), its
    // rows then split into the three buffers the ops below read.
    RETURN_IF_ERROR(be.Gemm(h_.data(), wqkv, bq, qkv_.data(), T, false));
    for (int64_t r = 0; r < T; ++r) {
      const float* row = qkv_.data() + r * (qd + 2 * kvd);
      std::memcpy(q_.data() + r * qd, row, qd * sizeof(float));
      std::memcpy(k_.data() + r * kvd, row + qd, kvd * sizeof(float));
      std::memcpy(v_.data() + r * kvd, row + qd + kvd, kvd * sizeof(float));
    }
    be.Rope(q_.data(), positions.data(), inv_freq_.data(), T, nq, hd);
    be.Rope(k_.data(), positions.data(), inv_freq_.data(), T, nkv, hd);
    for (int64_t r = 0; r < T; ++r) {
      for (int64_t h = 0; h < nkv; ++h) {
        kl.Store(kv, kl.Offset(row_block[r], li, 0, h, row_slot[r]), k_.data() + r * kvd + h * hd, hd);
        kl.Store(kv, kl.Offset(row_block[r], li, 1, h, row_slot[r]), v_.data() + r * kvd + h * hd, hd);
      }
    }
    kernels::PagedAttentionArgs args{.q = q_.data(), .out = attn_.data(), .kv = kv, .layout = kl,
                                     .layer = li, .num_q_heads = nq, .scale = scale,
                                     .window = c.layer_window[li], .seqs = aseqs.data(),
                                     .num_seqs = static_cast<int64_t>(aseqs.size())};
    be.PagedAttention(args);
    RETURN_IF_ERROR(be.Gemm(attn_.data(), L.wo.view(), L.bo.empty() ? nullptr : L.bo.data(), x_.data(), T, true));
    be.RmsNorm(x_.data(), L.post_norm.data(), h_.data(), T, H, static_cast<float>(c.rms_norm_eps));
    RETURN_IF_ERROR(be.Gemm(h_.data(), L.wgu.view(), nullptr, gu_.data(), T, false));
    be.SiluMul(gu_.data(), act_.data(), T, I);
    RETURN_IF_ERROR(be.Gemm(act_.data(), L.wdown.view(), nullptr, x_.data(), T, true));
  }

  // Final norm and LM head only on the rows whose logits are wanted.
  std::vector<float> sel(R * H);
  {
    int64_t out = 0;
    for (size_t s = 0; s < batch.size(); ++s) {
      for (int32_t r : batch[s].logit_rows) {
        std::memcpy(sel.data() + out * H, x_.data() + (aseqs[s].first_row + r) * H, H * sizeof(float));
        ++out;
      }
    }
  }
  Logits logits;
  logits.vocab_size = V;
  logits.data.resize(R * V);
  if (R > 0) {
    be.RmsNorm(sel.data(), final_norm_.data(), sel.data(), R, H, static_cast<float>(c.rms_norm_eps));
    const kernels::HostWeights& head = lm_head_.n == 0 ? embed_ : lm_head_;
    RETURN_IF_ERROR(be.Gemm(sel.data(), head.view(), nullptr, logits.data.data(), R, false));
  }
  LogStep(batch, start);
  return logits;
}

}  // namespace duet::engine
