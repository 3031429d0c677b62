// Arguments of the paged attention op, shared by every backend.
//
//   PagedAttentionArgs args{.q = q, .out = out, .kv = pool, .layout = layout, ...};
//   backend.PagedAttention(args);
//
// One call covers a whole batch that mixes prefill chunks and decode tokens:
// each sequence contributes `num_tokens` consecutive query rows whose
// positions are `start_pos .. start_pos + num_tokens - 1`; their keys and
// values (including the chunk's own, already written) live in the paged pool
// at `layer` under the sequence's block table. A query at position p attends
// causally to positions [max(0, p - window + 1), p] (window 0: no window),
// which is Hugging Face's eager sliding-window rule.
#ifndef DUET_KERNELS_ATTENTION_H_
#define DUET_KERNELS_ATTENTION_H_

#include <cstdint>

#include "kernels/kv_layout.h"

namespace duet::kernels {

struct AttentionSeq {
  int64_t first_row = 0;   // Row of q/out where this sequence's tokens start.
  int64_t num_tokens = 0;  // Query rows of this sequence in the batch.
  int64_t start_pos = 0;   // Position of its first query row.
  const int32_t* block_table = nullptr;  // Block ids covering [0, start_pos + num_tokens).
};

struct PagedAttentionArgs {
  const float* q = nullptr;  // [rows][num_q_heads][head_dim]
  float* out = nullptr;      // [rows][num_q_heads][head_dim]
  const void* kv = nullptr;  // The pool, of layout.dtype.
  KvLayout layout;
  int64_t layer = 0;
  int64_t num_q_heads = 0;   // A multiple of KvHeads() (GQA).
  float scale = 1.0f;        // Usually 1 / sqrt(head_dim).
  // Scores s (already scaled) become softcap * tanh(s / softcap) before the
  // softmax (Gemma-2's attn_logit_softcapping); 0: as they are.
  float softcap = 0.0f;
  int64_t window = 0;        // Sliding window in positions; 0 = none.
  const AttentionSeq* seqs = nullptr;
  int64_t num_seqs = 0;
  // The KV heads this call reads, [kv_head_begin, kv_head_begin + kv_heads)
  // of the layout's (kv_heads 0: all of them), whose query heads alone q and
  // out hold: a tensor-parallel rank's share of a pool of the unsharded
  // layout.
  int64_t kv_head_begin = 0;
  int64_t kv_heads = 0;
  int64_t KvHeads() const { return kv_heads > 0 ? kv_heads : layout.num_kv_heads; }
};

// Storing a batch's new keys and values into the paged pool: row r's K and
// V of head h go to (slots[r] / block_size, layer, K or V, kv_head_begin + h,
// slots[r] % block_size), in the pool's dtype (KvLayout::Store); a row whose
// slot is negative stores nothing (a padding row of a replayed step graph).
struct KvStoreArgs {
  const float* k = nullptr;  // [rows][kv_heads][head_dim]
  const float* v = nullptr;  // [rows][kv_heads][head_dim]
  const int32_t* slots = nullptr;  // [rows]: block * block_size + slot
  int64_t rows = 0;
  void* kv = nullptr;  // The pool, of layout.dtype.
  KvLayout layout;
  int64_t layer = 0;
  int64_t kv_head_begin = 0;  // As PagedAttentionArgs'.
  int64_t kv_heads = 0;       // 0: all of the layout's.
  int64_t KvHeads() const { return kv_heads > 0 ? kv_heads : layout.num_kv_heads; }
};

}  // namespace duet::kernels

#endif  // DUET_KERNELS_ATTENTION_H_
