// CacheIndex: the router's view of where prompt prefixes are cached, one set
// of chained block hashes (kvcache/block_hash) per prefill or colocated
// worker, kept from the CacheEvents the workers send. Approximate: it lags a
// worker by the events in flight, and a worker's entries are dropped when it
// is lost or its events skip a number (until its next snapshot).
//
//   CacheIndex index;
//   if (!index.Apply("prefill-0", events)) send the worker a CacheSnapshotRequest;
//   int64_t cached = index.CachedTokens("prefill-0", prompt);
//   index.Drop("prefill-0");                   // the worker is lost
//
// Not thread-safe: the router calls it under its lock.
#ifndef DUET_ROUTER_CACHE_INDEX_H_
#define DUET_ROUTER_CACHE_INDEX_H_

#include <cstdint>
#include <map>
#include <string>
#include <unordered_set>
#include <vector>

#include "absl/types/span.h"
#include "dispatch/dispatch.h"
#include "proto/control.pb.h"

namespace duet::router {

// The router's dispatch::CacheView for cache_aware.
class CacheIndex : public dispatch::CacheView {
 public:
  // Applies one worker's events. A snapshot replaces its set; deltas apply
  // in order. False when the worker's set is not current (a delta before
  // any snapshot, or after a gap in `seq`): its entries are dropped and the
  // caller should ask for a snapshot.
  bool Apply(const std::string& worker_id, const proto::CacheEvents& events);
  void Drop(const std::string& worker_id);

  // Leading tokens of `prompt` the worker has cached, in whole blocks of
  // its block size, leaving the last token (always computed); 0 when
  // unknown. One prompt asked of several workers: pass the same `hashes`,
  // so its block hashes are computed once per block size.
  using PromptHashes = std::map<int64_t, std::vector<uint64_t>>;  // by block size
  int64_t CachedTokens(const std::string& worker_id, absl::Span<const int32_t> prompt,
                       PromptHashes* hashes = nullptr) const;
  // Each worker's, the prompt's hashes computed once (dispatch::CacheView).
  std::vector<int64_t> CachedTokens(absl::Span<const dispatch::WorkerLoad* const> workers,
                                    absl::Span<const int32_t> prompt) const override;

  // Hashes held for a worker (0 when unknown), and the workers known.
  int64_t blocks(const std::string& worker_id) const;
  size_t workers() const { return entries_.size(); }

 private:
  struct Entry {
    uint64_t seq = 0;
    int64_t block_size = 0;
    std::unordered_set<uint64_t> hashes;
  };
  std::map<std::string, Entry> entries_;
};

}  // namespace duet::router

#endif  // DUET_ROUTER_CACHE_INDEX_H_
