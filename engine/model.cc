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

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& dir,
                                                   kernels::KernelBackend* backend) {
  std::unique_ptr<Model> m(new Model());
  m->dir_ = dir;
  m->backend_ = backend;
  ASSIGN_OR_RETURN(m->config_, ModelConfig::FromFile(
                                   (std::filesystem::path(dir) / "config.json").string()));
  if (m->config_.mlp_bias) {
    return absl::UnimplementedError(absl::StrCat(dir, "/config.json: mlp_bias=true is not supported"));
  }
  RETURN_IF_ERROR(m->LoadWeights());
  m->inv_freq_ = kernels::RopeInvFreq(m->config_.rope);
  return m;
}

absl::Status Model::LoadWeights() {
  const ModelConfig& c = config_;
  ASSIGN_OR_RETURN(auto st, SafetensorsModel::Open(dir_));
  const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  const int64_t qd = c.q_dim(), kvd = c.kv_dim();
  embed_.resize(V * H);
  RETURN_IF_ERROR(LoadTensor(*st, "model.embed_tokens.weight", {V, H}, embed_.data()));
  final_norm_.resize(H);
  RETURN_IF_ERROR(LoadTensor(*st, "model.norm.weight", {H}, final_norm_.data()));
  if (!c.tie_word_embeddings) {
    lm_head_.resize(V * H);
    RETURN_IF_ERROR(LoadTensor(*st, "lm_head.weight", {V, H}, lm_head_.data()));
  }
  layers_.resize(c.num_layers);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    Layer& L = layers_[i];
    const std::string p = absl::StrCat("model.layers.", i, ".");
    L.input_norm.resize(H);
    L.post_norm.resize(H);
    RETURN_IF_ERROR(LoadTensor(*st, p + "input_layernorm.weight", {H}, L.input_norm.data()));
    RETURN_IF_ERROR(LoadTensor(*st, p + "post_attention_layernorm.weight", {H}, L.post_norm.data()));
    L.wqkv.resize((qd + 2 * kvd) * H);
    RETURN_IF_ERROR(LoadTensor(*st, p + "self_attn.q_proj.weight", {qd, H}, L.wqkv.data()));
    RETURN_IF_ERROR(LoadTensor(*st, p + "self_attn.k_proj.weight", {kvd, H}, L.wqkv.data() + qd * H));
    RETURN_IF_ERROR(LoadTensor(*st, p + "self_attn.v_proj.weight", {kvd, H},
                               L.wqkv.data() + (qd + kvd) * H));
    if (c.attention_bias) {
      L.bqkv.resize(qd + 2 * kvd);
      RETURN_IF_ERROR(LoadTensor(*st, p + "self_attn.q_proj.bias", {qd}, L.bqkv.data()));
      RETURN_IF_ERROR(LoadTensor(*st, p + "self_attn.k_proj.bias", {kvd}, L.bqkv.data() + qd));
      RETURN_IF_ERROR(LoadTensor(*st, p + "self_attn.v_proj.bias", {kvd}, L.bqkv.data() + qd + kvd));
    }
    L.wo.resize(H * qd);
    RETURN_IF_ERROR(LoadTensor(*st, p + "self_attn.o_proj.weight", {H, qd}, L.wo.data()));
    if (c.o_bias) {
      L.bo.resize(H);
      RETURN_IF_ERROR(LoadTensor(*st, p + "self_attn.o_proj.bias", {H}, L.bo.data()));
    }
    L.wgu.resize(2 * I * H);
    RETURN_IF_ERROR(LoadTensor(*st, p + "mlp.gate_proj.weight", {I, H}, L.wgu.data()));
    RETURN_IF_ERROR(LoadTensor(*st, p + "mlp.up_proj.weight", {I, H}, L.wgu.data() + I * H));
    L.wdown.resize(H * I);
    RETURN_IF_ERROR(LoadTensor(*st, p + "mlp.down_proj.weight", {H, I}, L.wdown.data()));
  }
  return absl::OkStatus();
}

kernels::KvLayout Model::KvLayoutFor(int64_t block_size) const {
  return kernels::KvLayout{.num_layers = config_.num_layers,
                           .num_kv_heads = config_.num_kv_heads,
                           .block_size = block_size,
                           .head_dim = config_.head_dim};
}

absl::StatusOr<Logits> Model::Forward(absl::Span<const BatchSeq> batch, BlockPool& pool) {
  const auto start = std::chrono::steady_clock::now();
  const ModelConfig& c = config_;
  const kernels::KvLayout& kl = pool.layout();
  if (kl.num_layers != c.num_layers || kl.num_kv_heads != c.num_kv_heads ||
      kl.head_dim != c.head_dim) {
    return absl::InvalidArgumentError("KV pool layout does not match the model");
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
  float* kv = pool.data();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  be.EmbeddingLookup(embed_.data(), ids.data(), x_.data(), T, H);
  for (int64_t li = 0; li < c.num_layers; ++li) {
    const Layer& L = layers_[li];
    be.RmsNorm(x_.data(), L.input_norm.data(), h_.data(), T, H, static_cast<float>(c.rms_norm_eps));
    const float* bq = L.bqkv.empty() ? nullptr : L.bqkv.data();
    be.Gemm(h_.data(), L.wqkv.data(), bq, q_.data(), T, qd, H, false);
    be.Gemm(h_.data(), L.wqkv.data() + qd * H, bq ? bq + qd : nullptr, k_.data(), T, kvd, H, false);
    be.Gemm(h_.data(), L.wqkv.data() + (qd + kvd) * H, bq ? bq + qd + kvd : nullptr, v_.data(), T,
            kvd, H, false);
    be.Rope(q_.data(), positions.data(), inv_freq_.data(), T, nq, hd);
    be.Rope(k_.data(), positions.data(), inv_freq_.data(), T, nkv, hd);
    for (int64_t r = 0; r < T; ++r) {
      for (int64_t h = 0; h < nkv; ++h) {
        std::memcpy(kv + kl.Offset(row_block[r], li, 0, h, row_slot[r]), k_.data() + r * kvd + h * hd,
                    hd * sizeof(float));
        std::memcpy(kv + kl.Offset(row_block[r], li, 1, h, row_slot[r]), v_.data() + r * kvd + h * hd,
                    hd * sizeof(float));
      }
    }
    kernels::PagedAttentionArgs args{.q = q_.data(), .out = attn_.data(), .kv = kv, .layout = kl,
                                     .layer = li, .num_q_heads = nq, .scale = scale,
                                     .window = c.layer_window[li], .seqs = aseqs.data(),
                                     .num_seqs = static_cast<int64_t>(aseqs.size())};
    be.PagedAttention(args);
    be.Gemm(attn_.data(), L.wo.data(), L.bo.empty() ? nullptr : L.bo.data(), x_.data(), T, H, qd, true);
    be.RmsNorm(x_.data(), L.post_norm.data(), h_.data(), T, H, static_cast<float>(c.rms_norm_eps));
    be.Gemm(h_.data(), L.wgu.data(), nullptr, gu_.data(), T, 2 * I, H, false);
    be.SiluMul(gu_.data(), act_.data(), T, I);
    be.Gemm(act_.data(), L.wdown.data(), nullptr, x_.data(), T, H, I, true);
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
    const float* head = lm_head_.empty() ? embed_.data() : lm_head_.data();
    be.Gemm(sel.data(), head, nullptr, logits.data.data(), R, V, H, false);
  }
  LogStep(batch, start);
  return logits;
}

}  // namespace duet::engine
