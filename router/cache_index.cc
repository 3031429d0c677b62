#include "router/cache_index.h"

#include <algorithm>

#include "kvcache/block_hash.h"

namespace duet::router {

bool CacheIndex::Apply(const std::string& worker_id, const proto::CacheEvents& e) {
  if (e.block_size() < 1) {
    entries_.erase(worker_id);
    return false;
  }
  if (e.snapshot()) {
    Entry& en = entries_[worker_id];
    en.seq = e.seq();
    en.block_size = e.block_size();
    en.hashes = std::unordered_set<uint64_t>(e.added().begin(), e.added().end());
    return true;
  }
  auto it = entries_.find(worker_id);
  if (it == entries_.end()) return false;  // no snapshot yet
  Entry& en = it->second;
  if (e.seq() != en.seq + 1 || e.block_size() != en.block_size) {
    entries_.erase(it);
    return false;
  }
  en.seq = e.seq();
  for (uint64_t h : e.added()) en.hashes.insert(h);
  for (uint64_t h : e.removed()) en.hashes.erase(h);
  return true;
}

void CacheIndex::Drop(const std::string& worker_id) { entries_.erase(worker_id); }

int64_t CacheIndex::CachedTokens(const std::string& worker_id, absl::Span<const int32_t> prompt,
                                 PromptHashes* memo) const {
  auto it = entries_.find(worker_id);
  if (it == entries_.end() || prompt.empty()) return 0;
  const Entry& en = it->second;
  PromptHashes local;
  PromptHashes& by_size = memo != nullptr ? *memo : local;
  auto [at, fresh] = by_size.try_emplace(en.block_size);
  if (fresh) at->second = kvcache::BlockHashes(prompt.subspan(0, prompt.size() - 1), en.block_size);
  const std::vector<uint64_t>& hashes = at->second;
  size_t n = 0;
  while (n < hashes.size() && en.hashes.count(hashes[n]) > 0) ++n;
  return static_cast<int64_t>(n) * en.block_size;
}

std::vector<int64_t> CacheIndex::CachedTokens(absl::Span<const dispatch::WorkerLoad* const> workers,
                                              absl::Span<const int32_t> prompt) const {
  PromptHashes hashes;  // the prompt's, computed once per block size
  std::vector<int64_t> out;
  out.reserve(workers.size());
  for (const dispatch::WorkerLoad* w : workers) out.push_back(CachedTokens(w->id, prompt, &hashes));
  return out;
}

int64_t CacheIndex::blocks(const std::string& worker_id) const {
  auto it = entries_.find(worker_id);
  return it == entries_.end() ? 0 : static_cast<int64_t>(it->second.hashes.size());
}

}  // namespace duet::router
