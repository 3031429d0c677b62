// The knowledge tree: one worker's cache of computed KV, as a prefix tree
// whose nodes hold runs of full KV blocks in two tiers, the device pool (the
// engine's KV blocks) and a larger host pool. Any block-aligned token prefix
// already computed is found again (as SGLang's radix cache does); node
// boundaries may follow documents (as RAGCache does), so a document's KV is
// found under the same system prompt and preceding documents.
//
//   PrefixTree tree({.block_size = 16, .policy = Policy::kPgdsf, .host_tier = true}, &store);
//   Match m = tree.Acquire(prompt_without_last_token);   // pinned: nothing on it is evicted
//   ASSIGN_OR_RETURN(std::vector<int32_t> cached, tree.SwapIn(m));  // device blocks of m.tokens
//   ... compute the rest into fresh blocks ...
//   tree.Insert(prompt, all_blocks);   // the tree references the blocks it keeps
//   tree.Release(m);                   // when the request (and any lease on its blocks) ends
//
// Placement of blocks: a node is on device, on host, or both. The device
// nodes of any path form a prefix of it (a node leaves the device only after
// its children have), and every node has at least one copy. A node is
// copied to host on its first eviction from device (swap-out) and keeps that
// one host copy while it stays there; a host hit is copied back (swap-in),
// the host copy staying. Only unpinned leaves of a tier are evicted: device
// leaves are nodes with no child on device; host leaves have no child on
// host and, unless they are on device too, no children at all.
//
// Replacement: PGDSF (priority = clock + frequency x cost / size, cost the
// prefill seconds the node saves, each tier's clock raised to the priority
// of each node it evicts), or LRU, LFU and GDSF (cost 1) to compare.
//
// Lookup, insert, pin, unpin and each eviction are O(depth) in blocks plus a
// log factor for the eviction order. The tree depends only on base/: it
// moves and frees blocks through its BlockStore, so the simulator can run
// the same code. Not thread-safe: its worker's scheduler thread owns it.
#ifndef DUET_KVCACHE_PREFIX_TREE_H_
#define DUET_KVCACHE_PREFIX_TREE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace duet::kvcache {

enum class Tier : int { kDevice = 0, kHost = 1 };
const char* TierName(Tier t);

enum class Policy { kLru, kLfu, kGdsf, kPgdsf };
// lru | lfu | gdsf | pgdsf
absl::StatusOr<Policy> ParsePolicy(absl::string_view name);
const char* PolicyName(Policy p);

// Where the tree's blocks live. Device blocks are the engine's pool, with
// reference counts (a block the tree holds may also be in running
// sequences); host slots belong to the tree alone.
class BlockStore {
 public:
  virtual ~BlockStore() = default;
  virtual void RefDevice(absl::Span<const int32_t> blocks) = 0;
  virtual void UnrefDevice(absl::Span<const int32_t> blocks) = 0;
  // n fresh device blocks (one reference each), or ResourceExhausted.
  virtual absl::StatusOr<std::vector<int32_t>> AllocateDevice(int64_t n) = 0;
  // n free host slots, or ResourceExhausted.
  virtual absl::StatusOr<std::vector<int32_t>> AllocateHost(int64_t n) = 0;
  virtual void FreeHost(absl::Span<const int32_t> slots) = 0;
  // Block i's KV to slot i (and back).
  virtual void CopyToHost(absl::Span<const int32_t> blocks, absl::Span<const int32_t> slots) = 0;
  virtual void CopyToDevice(absl::Span<const int32_t> slots, absl::Span<const int32_t> blocks) = 0;
};

struct TreeOptions {
  int64_t block_size = 16;
  Policy policy = Policy::kPgdsf;
  bool host_tier = false;  // false: evicted nodes are dropped
  // PGDSF's cost: the prefill seconds that caching `tokens` tokens after a
  // prefix of `prefix` tokens saves. Default: one unit per token.
  std::function<double(int64_t prefix, int64_t tokens)> cost;
  // Called with the chained block hashes of a node when it joins the tree
  // (added) and when it leaves it (from every tier); splits change nothing.
  std::function<void(absl::Span<const uint64_t> hashes, bool added)> on_change;
};

using NodeId = int32_t;

// A cached prefix, ending on a node boundary. It names the node it ends at,
// whose path from the root it covers: a later split of a node on that path
// inserts a node into the path but leaves the match valid.
struct Match {
  NodeId node = 0;            // where it ends; 0 (the root): nothing cached
  int64_t tokens = 0;         // cached tokens (a multiple of the block size)
  int64_t device_tokens = 0;  // the leading part of them already on device (when looked up)
};

class PrefixTree {
 public:
  PrefixTree(TreeOptions options, BlockStore* store);
  ~PrefixTree();  // releases every block, pinned or not
  PrefixTree(const PrefixTree&) = delete;
  PrefixTree& operator=(const PrefixTree&) = delete;

  // The longest cached block-aligned prefix of `tokens`; a node the match
  // ends inside is split there. Counts nothing and pins nothing.
  Match Lookup(absl::Span<const int32_t> tokens);
  // Lookup, then pins the path (nothing on it is evicted until Release) and,
  // with `hit`, counts a hit on each of its nodes. A caller that may give
  // up (a queue head that does not fit yet) pins without counting and calls
  // Hit once it uses the match, so waiting does not raise a frequency.
  Match Acquire(absl::Span<const int32_t> tokens, bool hit = true);
  void Hit(const Match& m);
  void Release(const Match& m);

  // The device blocks of an acquired match, in order, copying its host-only
  // nodes to device first (they keep their host copy). ResourceExhausted if
  // the device has no room even after evicting (nodes copied before stay).
  absl::StatusOr<std::vector<int32_t>> SwapIn(const Match& m);

  // Adds the full blocks of `tokens` the tree lacks, held in `blocks` (the
  // sequence's device blocks, one per full block of `tokens`); the tree
  // takes a reference on each block it keeps. A cached node that is only on
  // host takes the sequence's blocks as its device copy. New nodes start at
  // `boundaries` (token positions; those off a block boundary round down).
  // Returns the blocks newly referenced.
  int64_t Insert(absl::Span<const int32_t> tokens, absl::Span<const int32_t> blocks,
                 absl::Span<const int64_t> boundaries = {});

  // Frees at least `blocks` blocks of `tier`, evicting leaves by the policy
  // (from device, swapping each to host where the host tier has or can make
  // room), or as many as unpinned leaves allow. Returns the blocks freed.
  int64_t Evict(Tier tier, int64_t blocks);

  // Drops every unpinned node from both tiers (vLLM's reset_prefix_cache).
  void Clear();

  int64_t block_size() const { return options_.block_size; }
  int64_t blocks(Tier t) const { return blocks_[static_cast<int>(t)]; }
  int64_t nodes() const { return live_nodes_; }
  struct Stats {
    int64_t evicted_blocks[2] = {0, 0};  // by tier
    int64_t swap_out_blocks = 0;         // device -> host
    int64_t swap_in_blocks = 0;          // host -> device
    int64_t dropped_blocks = 0;          // evicted from device with no host copy to keep
  };
  const Stats& stats() const { return stats_; }

  // Tests: every cached node as (tokens from the root, on device, on host),
  // and the first broken invariant (empty when all hold).
  struct Entry {
    std::vector<int32_t> tokens;    // from the root through this node
    int64_t node_tokens = 0;        // this node's own (the last ones)
    std::vector<int32_t> device, host;  // its blocks in each tier (empty: not there)
    int pins = 0;
  };
  std::vector<Entry> Entries() const;
  std::string CheckInvariants() const;

 private:
  struct Node {
    NodeId parent = -1;
    std::vector<int32_t> tokens;   // whole blocks
    std::vector<uint64_t> hashes;  // chained hash of each of its blocks
    int64_t depth = 0;             // tokens before this node
    std::unordered_map<uint64_t, NodeId> children;  // by the child's first block hash
    std::vector<int32_t> device, host;  // empty: not in that tier
    int child_device = 0, child_host = 0;  // children in each tier
    int pins = 0;
    int64_t frequency = 0;
    uint64_t last_access = 0;
    double cost = 0;
    double priority[2] = {0, 0};
    using Key = std::tuple<double, uint64_t, NodeId>;
    std::optional<Key> key[2];  // its place in evictable_[tier], if any
    bool alive = false;
    int64_t num_blocks() const { return static_cast<int64_t>(hashes.size()); }
  };

  NodeId NewNode();
  void Split(NodeId n, int64_t keep_blocks);
  void Touch(Node& n);
  void Enter(NodeId n, Tier t, std::vector<int32_t> ids);
  void Leave(NodeId n, Tier t);
  void Remove(NodeId n);
  void RemoveSubtree(NodeId n);
  bool Evictable(const Node& n, Tier t) const;
  double Priority(const Node& n, Tier t) const;
  void Reindex(NodeId n);
  std::vector<NodeId> PathTo(NodeId n) const;  // root's child first
  void EvictOne(NodeId n, Tier t);
  absl::StatusOr<std::vector<int32_t>> Allocate(Tier t, int64_t n);

  const TreeOptions options_;
  BlockStore* const store_;
  std::vector<Node> nodes_;  // nodes_[0] is the root
  std::vector<NodeId> free_ids_;
  int64_t live_nodes_ = 0;
  int64_t blocks_[2] = {0, 0};
  double clock_[2] = {0, 0};
  uint64_t tick_ = 0;
  std::set<Node::Key> evictable_[2];
  Stats stats_;
};

}  // namespace duet::kvcache

#endif  // DUET_KVCACHE_PREFIX_TREE_H_
