#include "kvcache/prefix_tree.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "kvcache/block_hash.h"

namespace duet::kvcache {

const char* TierName(Tier t) { return t == Tier::kDevice ? "device" : "host"; }

absl::StatusOr<Policy> ParsePolicy(absl::string_view name) {
  if (name == "lru") return Policy::kLru;
  if (name == "lfu") return Policy::kLfu;
  if (name == "gdsf") return Policy::kGdsf;
  if (name == "pgdsf") return Policy::kPgdsf;
  return absl::InvalidArgumentError(absl::StrCat("cache policy must be lru, lfu, gdsf or pgdsf, not \"", name, "\""));
}

const char* PolicyName(Policy p) {
  switch (p) {
    case Policy::kLru: return "lru";
    case Policy::kLfu: return "lfu";
    case Policy::kGdsf: return "gdsf";
    case Policy::kPgdsf: return "pgdsf";
  }
  return "?";
}

namespace {
constexpr int kDev = static_cast<int>(Tier::kDevice);
constexpr int kHost = static_cast<int>(Tier::kHost);
}  // namespace

PrefixTree::PrefixTree(TreeOptions options, BlockStore* store) : options_(std::move(options)), store_(store) {
  nodes_.emplace_back();
  nodes_[0].alive = true;
}

PrefixTree::~PrefixTree() {
  std::vector<NodeId> children;
  for (const auto& [h, c] : nodes_[0].children) children.push_back(c);
  for (NodeId c : children) RemoveSubtree(c);
}

NodeId PrefixTree::NewNode() {
  NodeId id;
  if (!free_ids_.empty()) {
    id = free_ids_.back();
    free_ids_.pop_back();
    nodes_[id] = Node();
  } else {
    id = static_cast<NodeId>(nodes_.size());
    nodes_.emplace_back();
  }
  nodes_[id].alive = true;
  ++live_nodes_;
  return id;
}

double PrefixTree::Priority(const Node& n, Tier t) const {
  const int ti = static_cast<int>(t);
  switch (options_.policy) {
    case Policy::kLru: return static_cast<double>(n.last_access);
    case Policy::kLfu: return static_cast<double>(n.frequency);
    case Policy::kGdsf:
    case Policy::kPgdsf: return n.priority[ti];
  }
  return 0;
}

// A hit: the frequency counts it, and the GDSF family's priority in each tier
// the node is in restarts from that tier's clock.
void PrefixTree::Touch(Node& n) {
  ++n.frequency;
  n.last_access = ++tick_;
  const double size = static_cast<double>(std::max<int64_t>(1, n.num_blocks()));
  const double cost = options_.policy == Policy::kPgdsf ? n.cost : 1.0;
  for (int t = 0; t < 2; ++t) n.priority[t] = clock_[t] + static_cast<double>(n.frequency) * cost / size;
}

bool PrefixTree::Evictable(const Node& n, Tier t) const {
  if (!n.alive || n.parent < 0 || n.pins > 0) return false;
  if (t == Tier::kDevice) return !n.device.empty() && n.child_device == 0;
  return !n.host.empty() && n.child_host == 0 && (!n.device.empty() || n.children.empty());
}

void PrefixTree::Reindex(NodeId id) {
  if (id < 0) return;
  Node& n = nodes_[id];
  for (int t = 0; t < 2; ++t) {
    if (n.key[t]) {
      evictable_[t].erase(*n.key[t]);
      n.key[t].reset();
    }
    if (Evictable(n, static_cast<Tier>(t))) {
      n.key[t] = Node::Key{Priority(n, static_cast<Tier>(t)), n.last_access, id};
      evictable_[t].insert(*n.key[t]);
    }
  }
}

void PrefixTree::Enter(NodeId id, Tier t, std::vector<int32_t> ids) {
  const int ti = static_cast<int>(t);
  Node& n = nodes_[id];
  std::vector<int32_t>& slot = ti == kDev ? n.device : n.host;
  slot = std::move(ids);
  blocks_[ti] += n.num_blocks();
  const double size = static_cast<double>(std::max<int64_t>(1, n.num_blocks()));
  const double cost = options_.policy == Policy::kPgdsf ? n.cost : 1.0;
  n.priority[ti] = clock_[ti] + static_cast<double>(std::max<int64_t>(1, n.frequency)) * cost / size;
  if (n.parent >= 0) (ti == kDev ? nodes_[n.parent].child_device : nodes_[n.parent].child_host)++;
  Reindex(id);
  Reindex(n.parent);
}

void PrefixTree::Leave(NodeId id, Tier t) {
  const int ti = static_cast<int>(t);
  Node& n = nodes_[id];
  std::vector<int32_t>& slot = ti == kDev ? n.device : n.host;
  if (slot.empty()) return;
  if (ti == kDev) {
    store_->UnrefDevice(slot);
  } else {
    store_->FreeHost(slot);
  }
  slot.clear();
  blocks_[ti] -= n.num_blocks();
  if (n.parent >= 0) (ti == kDev ? nodes_[n.parent].child_device : nodes_[n.parent].child_host)--;
  Reindex(id);
  Reindex(n.parent);
}

// Removes a node with no children, releasing what it holds.
void PrefixTree::Remove(NodeId id) {
  Leave(id, Tier::kDevice);
  Leave(id, Tier::kHost);
  Node& n = nodes_[id];
  for (int t = 0; t < 2; ++t) {
    if (n.key[t]) evictable_[t].erase(*n.key[t]);
    n.key[t].reset();
  }
  const NodeId parent = n.parent;
  nodes_[parent].children.erase(n.hashes.front());
  if (options_.on_change) options_.on_change(n.hashes, /*added=*/false);
  n = Node();
  free_ids_.push_back(id);
  --live_nodes_;
  Reindex(parent);
}

void PrefixTree::RemoveSubtree(NodeId id) {
  std::vector<NodeId> children;
  for (const auto& [h, c] : nodes_[id].children) children.push_back(c);
  for (NodeId c : children) RemoveSubtree(c);
  Remove(id);
}

// Cuts node `id` after its first `keep` blocks: a new node takes those (and
// `id`'s place under its parent), `id` keeps the rest as its only child.
void PrefixTree::Split(NodeId id, int64_t keep) {
  const NodeId head = NewNode();  // may move nodes_
  Node& n = nodes_[id];
  Node& h = nodes_[head];
  const size_t kt = static_cast<size_t>(keep * options_.block_size), kb = static_cast<size_t>(keep);
  h.parent = n.parent;
  h.depth = n.depth;
  h.tokens.assign(n.tokens.begin(), n.tokens.begin() + static_cast<long>(kt));
  h.hashes.assign(n.hashes.begin(), n.hashes.begin() + static_cast<long>(kb));
  n.tokens.erase(n.tokens.begin(), n.tokens.begin() + static_cast<long>(kt));
  n.hashes.erase(n.hashes.begin(), n.hashes.begin() + static_cast<long>(kb));
  n.depth += static_cast<int64_t>(kt);
  for (int t = 0; t < 2; ++t) {
    std::vector<int32_t>& from = t == kDev ? n.device : n.host;
    std::vector<int32_t>& to = t == kDev ? h.device : h.host;
    if (from.empty()) continue;
    to.assign(from.begin(), from.begin() + static_cast<long>(kb));
    from.erase(from.begin(), from.begin() + static_cast<long>(kb));
  }
  h.child_device = n.device.empty() ? 0 : 1;
  h.child_host = n.host.empty() ? 0 : 1;
  h.pins = n.pins;
  h.frequency = n.frequency;
  h.last_access = n.last_access;
  h.priority[0] = n.priority[0];
  h.priority[1] = n.priority[1];
  const auto cost = [&](int64_t prefix, int64_t tokens) {
    return options_.cost ? options_.cost(prefix, tokens) : static_cast<double>(tokens);
  };
  h.cost = cost(h.depth, static_cast<int64_t>(h.tokens.size()));
  n.cost = cost(n.depth, static_cast<int64_t>(n.tokens.size()));
  nodes_[h.parent].children[h.hashes.front()] = head;
  h.children[n.hashes.front()] = id;
  n.parent = head;
  // The parent's tier counts are unchanged: `head` is in every tier `id` was.
  Reindex(head);
  Reindex(id);
}

Match PrefixTree::Lookup(absl::Span<const int32_t> tokens) {
  Match m;
  const std::vector<uint64_t> hashes = BlockHashes(tokens, options_.block_size);
  const size_t bs = static_cast<size_t>(options_.block_size);
  NodeId at = 0;
  size_t pos = 0;  // blocks matched
  bool on_device = true;
  while (pos < hashes.size()) {
    auto it = nodes_[at].children.find(hashes[pos]);
    if (it == nodes_[at].children.end()) break;
    const NodeId c = it->second;
    const Node& n = nodes_[c];
    // Equal hashes chain equal prefixes; the tokens are compared anyway.
    size_t k = 0;
    while (k < n.hashes.size() && pos + k < hashes.size() && n.hashes[k] == hashes[pos + k] &&
           std::equal(n.tokens.begin() + static_cast<long>(k * bs), n.tokens.begin() + static_cast<long>((k + 1) * bs),
                      tokens.begin() + static_cast<long>((pos + k) * bs))) {
      ++k;
    }
    if (k == 0) break;
    const bool partial = k < n.hashes.size();
    if (partial) Split(c, static_cast<int64_t>(k));
    const NodeId matched = partial ? nodes_[c].parent : c;
    m.node = matched;
    pos += k;
    on_device = on_device && !nodes_[matched].device.empty();
    if (on_device) m.device_tokens = static_cast<int64_t>(pos * bs);
    if (partial) break;
    at = c;
  }
  m.tokens = static_cast<int64_t>(pos * bs);
  return m;
}

std::vector<NodeId> PrefixTree::PathTo(NodeId id) const {
  std::vector<NodeId> path;
  for (; id > 0; id = nodes_[id].parent) path.push_back(id);
  std::reverse(path.begin(), path.end());
  return path;
}

// A pin counts on every node from the root to the match's end, so a split
// (whose new node copies the pins of the node it cuts) keeps the counts.
Match PrefixTree::Acquire(absl::Span<const int32_t> tokens, bool hit) {
  Match m = Lookup(tokens);
  for (NodeId id : PathTo(m.node)) {
    Node& n = nodes_[id];
    ++n.pins;
    if (hit) Touch(n);
    Reindex(id);
  }
  return m;
}

void PrefixTree::Hit(const Match& m) {
  for (NodeId id = m.node; id > 0; id = nodes_[id].parent) {
    Touch(nodes_[id]);
    Reindex(id);
  }
}

void PrefixTree::Release(const Match& m) {
  for (NodeId id = m.node; id > 0; id = nodes_[id].parent) {
    --nodes_[id].pins;
    Reindex(id);
  }
}

// n blocks of tier t, evicting that tier's leaves when it is full.
absl::StatusOr<std::vector<int32_t>> PrefixTree::Allocate(Tier t, int64_t n) {
  for (;;) {
    auto got = t == Tier::kDevice ? store_->AllocateDevice(n) : store_->AllocateHost(n);
    if (got.ok() || got.status().code() != absl::StatusCode::kResourceExhausted) return got;
    if (Evict(t, n) == 0) return got;
  }
}

absl::StatusOr<std::vector<int32_t>> PrefixTree::SwapIn(const Match& m) {
  std::vector<int32_t> out;
  for (NodeId id : PathTo(m.node)) {
    if (nodes_[id].device.empty()) {
      // Pinned, so the eviction this may need leaves the path alone.
      absl::StatusOr<std::vector<int32_t>> blocks = Allocate(Tier::kDevice, nodes_[id].num_blocks());
      if (!blocks.ok()) return blocks.status();
      store_->CopyToDevice(nodes_[id].host, *blocks);
      stats_.swap_in_blocks += nodes_[id].num_blocks();
      Enter(id, Tier::kDevice, std::move(*blocks));
    }
    const Node& n = nodes_[id];
    out.insert(out.end(), n.device.begin(), n.device.end());
  }
  return out;
}

int64_t PrefixTree::Insert(absl::Span<const int32_t> tokens, absl::Span<const int32_t> blocks,
                           absl::Span<const int64_t> boundaries) {
  const std::vector<uint64_t> hashes = BlockHashes(tokens, options_.block_size);
  const size_t bs = static_cast<size_t>(options_.block_size);
  const size_t total = std::min(hashes.size(), blocks.size());
  std::vector<size_t> cuts;  // block indices where a new node must start
  for (int64_t b : boundaries) {
    if (b > 0) cuts.push_back(static_cast<size_t>(b) / bs);
  }
  std::sort(cuts.begin(), cuts.end());
  int64_t added = 0;
  NodeId at = 0;
  size_t pos = 0;
  while (pos < total) {
    auto it = nodes_[at].children.find(hashes[pos]);
    if (it != nodes_[at].children.end()) {
      NodeId c = it->second;
      size_t k = 0;
      while (k < nodes_[c].hashes.size() && pos + k < total && nodes_[c].hashes[k] == hashes[pos + k]) ++k;
      if (k < nodes_[c].hashes.size()) {
        Split(c, static_cast<int64_t>(k));
        c = nodes_[c].parent;
      }
      if (nodes_[c].device.empty()) {  // host only: the sequence's blocks become its device copy
        std::vector<int32_t> ids(blocks.begin() + static_cast<long>(pos), blocks.begin() + static_cast<long>(pos + k));
        store_->RefDevice(ids);
        added += static_cast<int64_t>(k);
        Enter(c, Tier::kDevice, std::move(ids));
      }
      pos += k;
      at = c;
      continue;
    }
    // A new node up to the next boundary.
    size_t end = total;
    for (size_t cut : cuts) {
      if (cut > pos) {
        end = std::min(end, cut);
        break;
      }
    }
    const NodeId id = NewNode();
    Node& n = nodes_[id];
    n.parent = at;
    n.depth = static_cast<int64_t>(pos * bs);
    n.tokens.assign(tokens.begin() + static_cast<long>(pos * bs), tokens.begin() + static_cast<long>(end * bs));
    n.hashes.assign(hashes.begin() + static_cast<long>(pos), hashes.begin() + static_cast<long>(end));
    n.cost = options_.cost ? options_.cost(n.depth, static_cast<int64_t>(n.tokens.size()))
                           : static_cast<double>(n.tokens.size());
    n.frequency = 1;
    n.last_access = ++tick_;
    nodes_[at].children[n.hashes.front()] = id;
    if (options_.on_change) options_.on_change(n.hashes, /*added=*/true);
    std::vector<int32_t> ids(blocks.begin() + static_cast<long>(pos), blocks.begin() + static_cast<long>(end));
    store_->RefDevice(ids);
    added += static_cast<int64_t>(end - pos);
    Enter(id, Tier::kDevice, std::move(ids));
    pos = end;
    at = id;
  }
  return added;
}

void PrefixTree::EvictOne(NodeId id, Tier t) {
  const int64_t size = nodes_[id].num_blocks();
  const int ti = static_cast<int>(t);
  clock_[ti] = std::max(clock_[ti], nodes_[id].priority[ti]);
  stats_.evicted_blocks[ti] += size;
  if (t == Tier::kHost) {
    Leave(id, Tier::kHost);
    if (nodes_[id].device.empty()) Remove(id);  // no children: it was a host leaf
    return;
  }
  if (options_.host_tier && nodes_[id].host.empty()) {
    // Swap out: the one host copy it keeps while it stays there. Making
    // room on host cannot evict this node (it is not on host yet).
    absl::StatusOr<std::vector<int32_t>> slots = Allocate(Tier::kHost, size);
    if (slots.ok()) {
      store_->CopyToHost(nodes_[id].device, *slots);
      stats_.swap_out_blocks += size;
      Enter(id, Tier::kHost, std::move(*slots));
    }
  }
  if (nodes_[id].host.empty()) {
    // No copy left to keep: it goes, and its host-only children with it.
    stats_.dropped_blocks += size;
    RemoveSubtree(id);
    return;
  }
  Leave(id, Tier::kDevice);
}

int64_t PrefixTree::Evict(Tier t, int64_t blocks) {
  const int ti = static_cast<int>(t);
  int64_t freed = 0;
  while (freed < blocks && !evictable_[ti].empty()) {
    const NodeId id = std::get<2>(*evictable_[ti].begin());
    freed += nodes_[id].num_blocks();
    EvictOne(id, t);
  }
  return freed;
}

void PrefixTree::Clear() {
  std::vector<NodeId> stack = {0};
  while (!stack.empty()) {
    const NodeId id = stack.back();
    stack.pop_back();
    std::vector<NodeId> children;
    for (const auto& [h, c] : nodes_[id].children) children.push_back(c);
    for (NodeId c : children) {
      if (nodes_[c].pins > 0) {
        stack.push_back(c);
      } else {
        RemoveSubtree(c);
      }
    }
  }
}

std::vector<PrefixTree::Entry> PrefixTree::Entries() const {
  std::vector<Entry> out;
  std::vector<std::pair<NodeId, std::vector<int32_t>>> stack = {{0, {}}};
  while (!stack.empty()) {
    auto [id, prefix] = stack.back();
    stack.pop_back();
    const Node& n = nodes_[id];
    if (id != 0) {
      prefix.insert(prefix.end(), n.tokens.begin(), n.tokens.end());
      out.push_back({prefix, static_cast<int64_t>(n.tokens.size()), n.device, n.host, n.pins});
    }
    for (const auto& [h, c] : n.children) stack.push_back({c, prefix});
  }
  return out;
}

std::string PrefixTree::CheckInvariants() const {
  int64_t blocks[2] = {0, 0}, live = 0;
  std::set<Node::Key> evictable[2];
  for (NodeId id = 1; id < static_cast<NodeId>(nodes_.size()); ++id) {
    const Node& n = nodes_[id];
    if (!n.alive) continue;
    ++live;
    const std::string at = absl::StrCat("node ", id, " (depth ", n.depth, "): ");
    if (n.hashes.empty() || n.tokens.size() != n.hashes.size() * static_cast<size_t>(options_.block_size)) {
      return at + "its tokens are not whole blocks";
    }
    if (n.device.empty() && n.host.empty()) return at + "in no tier";
    if (!n.device.empty() && static_cast<int64_t>(n.device.size()) != n.num_blocks()) return at + "device blocks miscounted";
    if (!n.host.empty() && static_cast<int64_t>(n.host.size()) != n.num_blocks()) return at + "host slots miscounted";
    const Node& p = nodes_[n.parent];
    if (!p.alive) return at + "its parent is gone";
    auto it = p.children.find(n.hashes.front());
    if (it == p.children.end() || it->second != id) return at + "its parent does not list it";
    if (n.depth != p.depth + static_cast<int64_t>(p.tokens.size())) return at + "wrong depth";
    // The first hash chains from the parent's last.
    const uint64_t parent_hash = n.parent == 0 ? kRootHash : p.hashes.back();
    if (HashBlock(parent_hash, absl::MakeConstSpan(n.tokens).subspan(0, static_cast<size_t>(options_.block_size))) !=
        n.hashes.front()) {
      return at + "its first hash does not chain from its parent";
    }
    if (!n.device.empty() && n.parent != 0 && p.device.empty()) return at + "on device under a parent that is not";
    if (n.pins < 0) return at + "negative pins";
    if (n.parent != 0 && p.pins < n.pins) return at + "pinned more than its parent";
    int cd = 0, ch = 0;
    for (const auto& [h, c] : n.children) {
      cd += !nodes_[c].device.empty();
      ch += !nodes_[c].host.empty();
    }
    if (cd != n.child_device || ch != n.child_host) return at + "child tier counts are off";
    for (int t = 0; t < 2; ++t) {
      if (Evictable(n, static_cast<Tier>(t))) {
        if (!n.key[t]) return at + "evictable but not indexed in " + TierName(static_cast<Tier>(t));
        evictable[t].insert(*n.key[t]);
      } else if (n.key[t]) {
        return at + "indexed but not evictable in " + TierName(static_cast<Tier>(t));
      }
    }
    blocks[kDev] += n.device.empty() ? 0 : n.num_blocks();
    blocks[kHost] += n.host.empty() ? 0 : n.num_blocks();
  }
  if (live != live_nodes_) return "live node count is off";
  for (int t = 0; t < 2; ++t) {
    if (blocks[t] != blocks_[t]) return absl::StrCat(TierName(static_cast<Tier>(t)), " block count is off");
    if (evictable[t] != evictable_[t]) return absl::StrCat(TierName(static_cast<Tier>(t)), " eviction index is off");
  }
  return "";
}

}  // namespace duet::kvcache
