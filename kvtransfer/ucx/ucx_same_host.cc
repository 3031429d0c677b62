#include "kvtransfer/ucx/ucx_transport_impl.h"

namespace duet::kvtransfer::ucx {

std::optional<HostIdentity> OwnHost(const uint64_t* probe_word) {
  HostIdentity h;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  if (!(f >> h.boot_id) || h.boot_id.empty() || h.boot_id.size() > 64) return std::nullopt;
  struct stat st;
  if (stat("/proc/self/ns/pid", &st) != 0) return std::nullopt;
  h.pid_namespace = static_cast<uint64_t>(st.st_ino);
  h.pid = static_cast<uint32_t>(getpid());
  h.probe_address = reinterpret_cast<uint64_t>(probe_word);
  h.nonce = *probe_word;
  return h;
}

bool PidExited(int pidfd) {
  if (pidfd < 0) return true;
  struct pollfd p = {pidfd, POLLIN, 0};
  int n = poll(&p, 1, 0);
  return n != 0;
}

int64_t ReadPeer(pid_t pid, const std::vector<struct iovec>& local,
                 const std::vector<struct iovec>& remote, size_t begin, size_t end) {
  int64_t total = 0;
  for (size_t i = begin; i < end; i += kMaxIov) {
    size_t n = std::min<size_t>(kMaxIov, end - i);
    size_t want = 0;
    for (size_t k = i; k < i + n; ++k) want += local[k].iov_len;
    ssize_t got = process_vm_readv(pid, &local[i], n, &remote[i], n, 0);
    if (got < 0) return -errno;
    if (static_cast<size_t>(got) != want) return -EFAULT;
    total += got;
  }
  return total;
}

int64_t ReadPeer(pid_t pid, const std::vector<struct iovec>& local,
                 const std::vector<struct iovec>& remote) {
  return ReadPeer(pid, local, remote, 0, local.size());
}

absl::StatusOr<int> UcxKvTransport::OpenSameHost(const HostIdentity& peer) {
  int fd = static_cast<int>(syscall(SYS_pidfd_open, static_cast<pid_t>(peer.pid), 0));
  if (fd < 0) return absl::UnavailableError(absl::StrCat("pidfd_open: ", std::strerror(errno)));
  uint64_t word = 0;
  struct iovec local = {&word, sizeof(word)};
  struct iovec remote = {reinterpret_cast<void*>(peer.probe_address), sizeof(word)};
  ssize_t n = process_vm_readv(static_cast<pid_t>(peer.pid), &local, 1, &remote, 1, 0);
  int err = errno;
  if (n != static_cast<ssize_t>(sizeof(word)) || word != peer.nonce || PidExited(fd)) {
    close(fd);
    if (n < 0) return absl::UnavailableError(absl::StrCat("process_vm_readv: ", std::strerror(err)));
    return absl::UnavailableError("the probe word does not hold the peer's nonce (another process?)");
  }
  return fd;
}

void UcxKvTransport::CheckSameHostPeers(absl::Time now) {
  last_pid_check_ = now;
  std::vector<Peer*> dead;
  for (auto& [id, p] : peers_) {
    if (p->same_host && !p->failed && PidExited(p->pidfd)) dead.push_back(p.get());
  }
  for (Peer* p : dead) PeerFailed(p, absl::StrCat("peer lost: process ", p->pid, " exited"), now);
}

void UcxKvTransport::SameHostStep(Transfer* t, absl::Time now, uint64_t budget) {
  if (t->finalized || t->busy) return;
  if (t->abort) {
    Finalize(t, *t->abort, t->abort_detail, now);
    return;
  }
  if (now >= t->deadline) {
    Finalize(t, TransferState::kTimedOut,
             absl::StrCat("not finished within ", absl::FormatDuration(t->timeout)), now);
    return;
  }
  Peer* peer = FindPeer(t->peer);
  if (peer == nullptr || peer->failed || peer->pidfd < 0) {
    Finalize(t, TransferState::kPeerLost,
             peer != nullptr && peer->failed ? peer->failure : "peer disconnected", now);
    return;
  }
  if (budget == 0) return;
  if (t->phase == Phase::kQueued) {
    t->phase = t->epoch_blocks.empty() ? Phase::kData : Phase::kEpochsBefore;
    t->cursor = 0;
    t->cursor_offset = 0;
  }
  const pid_t pid = peer->pid;
  const RegionDescriptor& desc = t->keys->desc;
  // The copy, without mu_: the fields it touches belong to this thread while
  // busy is set (Finalize and release wait for it).
  t->busy = true;
  mu_.Unlock();
  std::vector<struct iovec> local, remote;
  auto read_epochs = [&]() -> int64_t {
    local.clear();
    remote.clear();
    for (const auto& [first, last] : t->epoch_runs) {
      const uint64_t bytes = (last - first + 1) * sizeof(uint64_t);
      local.push_back({&t->epochs_read[first], bytes});
      remote.push_back({reinterpret_cast<void*>(
                            desc.epoch_base +
                            static_cast<uint64_t>(t->epoch_blocks[first]) * sizeof(uint64_t)),
                        bytes});
    }
    // Data reads before the epochs are complete before the epochs are read,
    // and the epochs before any data read after them.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    int64_t n = ReadPeer(pid, local, remote);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    return n;
  };
  std::optional<std::string> lease_ended;
  auto epochs_match = [&](bool before) {
    lease_ended = EpochMismatch(t, before);
    return !lease_ended;
  };
  int64_t error = 0;  // -errno of a failed read
  bool finished = false;
  if (t->phase == Phase::kEpochsBefore) {
    int64_t n = read_epochs();
    if (n < 0) {
      error = n;
    } else if (epochs_match(/*before=*/true)) {
      t->phase = Phase::kData;
      t->cursor = 0;
      t->cursor_offset = 0;
    }
  }
  if (error == 0 && !lease_ended && t->phase == Phase::kData) {
    std::vector<size_t> task_ends;  // local[] index where each copy task ends
    while (error == 0 && t->cursor < t->segments.size() && budget > 0 &&
           !t->stop.load(std::memory_order_relaxed)) {
      local.clear();
      remote.clear();
      task_ends.clear();
      const uint64_t limit = std::min(kChunkBytes, budget);
      // Large batches are cut into tasks for the copy threads.
      uint64_t task_bytes = limit;
      if (copy_pool_ != nullptr) {
        uint64_t batch_bytes = 0;
        for (size_t c = t->cursor; c < t->segments.size() && batch_bytes < limit; ++c) {
          batch_bytes += t->segments[c].length - (c == t->cursor ? t->cursor_offset : 0);
        }
        batch_bytes = std::min(batch_bytes, limit);
        if (batch_bytes >= kParallelCopyBytes) {
          const uint64_t per = 2 * static_cast<uint64_t>(copy_pool_->num_threads());
          task_bytes = std::max(kCopyTaskBytes, (batch_bytes + per - 1) / per);
        }
      }
      uint64_t batch = 0;
      uint64_t task_fill = 0;
      while (t->cursor < t->segments.size() && local.size() < kMaxIov && batch < limit) {
        const Segment& s = t->segments[t->cursor];
        uint64_t length =
            std::min({s.length - t->cursor_offset, limit - batch, task_bytes - task_fill});
        if (length > 0) {
          local.push_back({t->local_base + s.dst_offset + t->cursor_offset, length});
          remote.push_back(
              {reinterpret_cast<void*>(desc.base + s.src_offset + t->cursor_offset), length});
        }
        batch += length;
        task_fill += length;
        if (task_fill >= task_bytes) {
          task_ends.push_back(local.size());
          task_fill = 0;
        }
        t->cursor_offset += length;
        if (t->cursor_offset >= s.length) {
          ++t->cursor;
          t->cursor_offset = 0;
        }
      }
      if (task_fill > 0) task_ends.push_back(local.size());
      int64_t n = 0;
      if (task_ends.size() <= 1) {
        n = ReadPeer(pid, local, remote);
      } else {
        // Each task reads its own pieces; the first failure wins, and tasks
        // not yet started are skipped once one failed or the pull is stopped.
        std::atomic<int64_t> read{0};
        std::atomic<int64_t> failed{0};
        copy_pool_->ParallelFor(
            static_cast<int64_t>(task_ends.size()), [&](int64_t first, int64_t last) {
              for (int64_t k = first; k < last; ++k) {
                if (failed.load(std::memory_order_relaxed) != 0 ||
                    t->stop.load(std::memory_order_relaxed)) {
                  return;
                }
                size_t begin = k == 0 ? 0 : task_ends[k - 1];
                int64_t got = ReadPeer(pid, local, remote, begin, task_ends[k]);
                if (got < 0) {
                  int64_t none = 0;
                  failed.compare_exchange_strong(none, got);
                  return;
                }
                read.fetch_add(got, std::memory_order_relaxed);
              }
            });
        n = failed.load() != 0 ? failed.load() : read.load();
      }
      if (n < 0) {
        error = n;
      } else {
        t->bytes_done += static_cast<uint64_t>(n);
        budget -= std::min<uint64_t>(budget, static_cast<uint64_t>(n));
      }
      if (absl::Now() >= t->deadline) break;
    }
    if (error == 0 && t->cursor >= t->segments.size()) {
      if (t->epoch_blocks.empty()) {
        finished = true;
      } else {
        t->phase = Phase::kEpochsAfter;
      }
    }
  }
  if (error == 0 && !lease_ended && t->phase == Phase::kEpochsAfter &&
      !t->stop.load(std::memory_order_relaxed)) {
    int64_t n = read_epochs();
    if (n < 0) {
      error = n;
    } else if (epochs_match(/*before=*/false)) {
      finished = true;
    }
  }
  LockSpinning();
  t->busy = false;
  now = absl::Now();

  // What was read from the pid is the exporter's only if it is alive now:
  // until it exits, its pid cannot name another process.
  peer = FindPeer(t->peer);
  if (peer != nullptr && !peer->failed && (error == -ESRCH || PidExited(peer->pidfd))) {
    PeerFailed(peer, absl::StrCat("peer lost: process ", pid, " exited"), now);
  }
  if (t->abort) {
    Finalize(t, *t->abort, t->abort_detail, now);
  } else if (peer == nullptr || peer->failed) {
    Finalize(t, TransferState::kPeerLost, peer != nullptr ? peer->failure : "peer disconnected",
             now);
  } else if (error != 0) {
    // EFAULT: the exporter no longer maps those bytes (a deregistered region,
    // whose epochs have all moved on) or the descriptor lies.
    Finalize(t,
             error == -EFAULT && !t->epoch_blocks.empty() ? TransferState::kLeaseExpired
                                                          : TransferState::kPeerLost,
             absl::StrCat("process_vm_readv from pid ", pid, ": ",
                          std::strerror(static_cast<int>(-error))),
             now);
  } else if (lease_ended) {
    Finalize(t, TransferState::kLeaseExpired, *lease_ended, now);
  } else if (finished) {
    Finalize(t, TransferState::kDone, "", now);
  } else if (now >= t->deadline) {
    Finalize(t, TransferState::kTimedOut,
             absl::StrCat("not finished within ", absl::FormatDuration(t->timeout)), now);
  }
}

}  // namespace duet::kvtransfer::ucx
