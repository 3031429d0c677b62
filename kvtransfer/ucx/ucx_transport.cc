#include "kvtransfer/ucx/ucx_transport_impl.h"

namespace duet::kvtransfer::ucx {

absl::Status UcxError(ucs_status_t st, absl::string_view what) {
  std::string msg = absl::StrCat(what, ": ", ucs_status_string(st));
  switch (st) {
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_NO_RESOURCE:
    case UCS_ERR_EXCEEDS_LIMIT:
      return absl::ResourceExhaustedError(msg);
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR:
    case UCS_ERR_NO_ELEM:
      return absl::InvalidArgumentError(msg);
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_NO_DEVICE:
    case UCS_ERR_UNSUPPORTED:
      return absl::UnavailableError(msg);
    case UCS_ERR_TIMED_OUT:
      return absl::DeadlineExceededError(msg);
    default:
      return absl::InternalError(msg);
  }
}

bool TlsAllowsSameHost(absl::string_view tls) {
  if (tls.empty()) return true;
  bool exclude = absl::ConsumePrefix(&tls, "^");
  bool named = false;
  for (absl::string_view t : absl::StrSplit(tls, ',', absl::SkipWhitespace())) {
    if (t == "all" || t == "sm" || t == "shm" || t == "cma") named = true;
  }
  return exclude ? !named : named;
}

bool TlsIsTcpOnly(absl::string_view tls) {
  if (tls.empty() || tls[0] == '^') return false;
  for (absl::string_view t : absl::StrSplit(tls, ',', absl::SkipWhitespace())) {
    if (t != "tcp") return false;
  }
  return true;
}

int BoundKeepaliveSockets() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  int set = 0;
  while (const dirent* e = readdir(dir)) {
    int fd = -1;
    if (!absl::SimpleAtoi(e->d_name, &fd) || fd == dirfd(dir)) continue;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    int on = 0;
    socklen_t len = sizeof(on);
    if (getsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, &len) != 0 || on == 0) continue;
    unsigned timeout_ms = 0;
    len = sizeof(timeout_ms);  // fails on a socket that is not TCP
    if (getsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &timeout_ms, &len) != 0 || timeout_ms != 0) continue;
    int idle = 0, interval = 0, count = 0;
    len = sizeof(int);
    if (getsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, &len) != 0 ||
        getsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, &len) != 0 ||
        getsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, &len) != 0) {
      continue;
    }
    timeout_ms = static_cast<unsigned>(idle + count * interval) * 1000u;
    if (timeout_ms > 0 && setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &timeout_ms, sizeof(timeout_ms)) == 0) {
      ++set;
    }
  }
  closedir(dir);
  return set;
}

absl::Status UcxKvTransport::Init() {
  std::string tls;  // UCX_TLS as this transport's UCX sees it.
  if (const char* env = std::getenv("UCX_TLS")) tls = env;
  for (const auto& [name, value] : options_.ucx_config) {
    if (name == "TLS") tls = value;
  }
  // Over TCP alone, TCP's probes replace UCX's keepalive, whose messages to
  // a peer whose link is cut sit unacknowledged in the socket (and a socket
  // with unacknowledged data sends no probes). UCX reads its TCP settings
  // from the environment when it opens an interface (ucp_config_modify does
  // not reach them), so they go there, where a variable already set wins.
  auto micros = [](absl::Duration d) { return absl::StrCat(absl::ToInt64Microseconds(d), "us"); };
  tcp_only_ = TlsIsTcpOnly(tls);
  if (tcp_only_) {
    setenv("UCX_TCP_KEEPIDLE", micros(options_.tcp_keepalive_idle).c_str(), 0);
    setenv("UCX_TCP_KEEPINTVL", micros(options_.tcp_keepalive_interval).c_str(), 0);
    setenv("UCX_TCP_KEEPCNT", absl::StrCat(options_.tcp_keepalive_count).c_str(), 0);
  }
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return UcxError(st, "ucp_config_read");
  absl::Status status;
  if (std::getenv("UCX_KEEPALIVE_INTERVAL") == nullptr) {
    std::string v = tcp_only_ ? "inf" : micros(options_.keepalive_interval);
    st = ucp_config_modify(config, "KEEPALIVE_INTERVAL", v.c_str());
    if (st != UCS_OK) status = UcxError(st, "ucp_config_modify KEEPALIVE_INTERVAL");
  }
  for (const auto& [name, value] : options_.ucx_config) {
    if (!status.ok()) break;
    st = ucp_config_modify(config, name.c_str(), value.c_str());
    if (st != UCS_OK) status = UcxError(st, absl::StrCat("ucp_config_modify ", name, "=", value));
  }
  if (status.ok()) {
    ucp_params_t params = {};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED |
                        UCP_PARAM_FIELD_NAME;
    params.features = UCP_FEATURE_RMA | (options_.busy_poll ? 0 : UCP_FEATURE_WAKEUP);
    params.mt_workers_shared = 0;
    params.name = "duet-kvtransfer";
    st = ucp_init(&params, config, &context_);
    if (st != UCS_OK) status = UcxError(st, "ucp_init");
  }
  ucp_config_release(config);
  RETURN_IF_ERROR(status);

  ucp_worker_params_t wparams = {};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  // Every worker call is made under mu_, so UCX needs no locks of its own.
  wparams.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  st = ucp_worker_create(context_, &wparams, &worker_);
  if (st != UCS_OK) return UcxError(st, "ucp_worker_create");

  ucp_address_t* addr = nullptr;
  size_t addr_len = 0;
  st = ucp_worker_get_address(worker_, &addr, &addr_len);
  if (st != UCS_OK) return UcxError(st, "ucp_worker_get_address");
  std::random_device rd;
  while (probe_word_ == 0) probe_word_ = (uint64_t{rd()} << 32) ^ rd();
  host_ = OwnHost(&probe_word_);
  same_host_lane_ = options_.same_host_lane && host_.has_value() && TlsAllowsSameHost(tls);
  address_ = EncodeAddress(addr, addr_len, host_);
  ucp_worker_release_address(worker_, addr);

  if (!options_.busy_poll) {
    st = ucp_worker_get_efd(worker_, &worker_fd_);
    if (st != UCS_OK) {
      LOG(WARNING) << "UCX worker has no event fd (" << ucs_status_string(st)
                   << "); the progress thread polls instead";
      worker_fd_ = -1;
    }
  }
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno)));


  // Helpers only on cores of their own: a worker pinned to one core copies alone.
  const int copy_threads = std::min(options_.same_host_copy_threads, AvailableCores());
  if (same_host_lane_ && copy_threads > 1) copy_pool_ = std::make_unique<ThreadPool>(copy_threads);
  progress_ = std::thread([this] { ProgressLoop(); });
  return absl::OkStatus();
}

UcxKvTransport::~UcxKvTransport() {
  if (progress_.joinable()) {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    Wake();
    progress_.join();
  }
  if (worker_ != nullptr) {
    absl::MutexLock lock(&mu_);
    absl::Time now = absl::Now();
    for (auto& [id, t] : transfers_) {
      if (!t->finalized) Abort(t.get(), TransferState::kCancelled, "transport destroyed", now);
    }
    for (auto& [id, peer] : peers_) {
      bool busy = !peer->transfers.empty();
      CloseEndpoint(peer.get(), /*force=*/busy, now);
    }
    // Let graceful closes reach their peers and cancelled reads drain, bounded.
    absl::Time until = now + kCloseBound;
    while (absl::Now() < until) {
      ucp_worker_progress(worker_);
      PollClosing(absl::Now());
      bool drained = closing_.empty();
      for (auto& [id, t] : transfers_) drained = drained && t->requests.empty();
      if (drained) break;
    }
    for (Closing& c : closing_) ucp_request_free(c.request);
    closing_.clear();
    for (auto& [id, t] : transfers_) {
      if (!t->requests.empty()) {
        // UCX still owns reads that point at this object: leak it rather
        // than let a late callback touch freed memory.
        LOG(ERROR) << "ucx transfer " << id << ": reads outstanding at shutdown";
        t.release();
      }
    }
    transfers_.clear();
    peers_.clear();  // destroys cached rkeys
    absl::MutexLock rlock(&regions_mu_);
    for (auto& [id, r] : regions_) {
      if (r->memh != nullptr) ucp_mem_unmap(context_, r->memh);
      if (r->epochs != nullptr) retired_epochs_.push_back({std::move(r->epochs), r->epoch_memh});
    }
    regions_.clear();
    for (RetiredEpochs& e : retired_epochs_) ucp_mem_unmap(context_, e.memh);
    retired_epochs_.clear();
  }
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  if (context_ != nullptr) ucp_cleanup(context_);
  if (wake_fd_ >= 0) close(wake_fd_);

}

void UcxKvTransport::LockSpinning() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  for (int i = 0; i < 2000; ++i) {
    if (mu_.TryLock()) return;
    if (i % 64 == 63) std::this_thread::yield();
  }
  mu_.Lock();
}

void UcxKvTransport::Wake() {
  uint64_t one = 1;
  // EAGAIN means the counter is already non-zero: the thread will wake anyway.
  ssize_t n = write(wake_fd_, &one, sizeof(one));
  (void)n;
}

void UcxKvTransport::ProgressLoop() {
  // When the worker last had something to do; the thread sleeps only after
  // spin_window without any.
  absl::Time last_event = absl::InfinitePast();
  bool woken = false;
  bool spin = false;
  bool pid_event = false;
  absl::Time last_socket_check = absl::InfinitePast();
  std::vector<int> pidfds;
  std::vector<struct pollfd> fds;
  for (;;) {
    absl::Duration wait = absl::ZeroDuration();
    if (tcp_only_ && absl::Now() - last_socket_check >= kSocketCheck) {
      BoundKeepaliveSockets();  // outside mu_: it reads /proc
      last_socket_check = absl::Now();
    }
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      unsigned events = 0;
      for (int i = 0; i < 64; ++i) {
        unsigned n = ucp_worker_progress(worker_);
        if (n == 0) break;
        events += n;
      }
      absl::Time now = absl::Now();
      if (events > 0 || woken) last_event = now;
      woken = false;
      // Endpoints that failed inside progress are closed out here, where
      // purging their requests cannot re-enter a callback.
      if (pid_event || now - last_pid_check_ >= kPidCheck) CheckSameHostPeers(now);
      pid_event = false;

      std::vector<PeerId> failed;
      failed.swap(failed_peers_);
      for (PeerId id : failed) {
        if (Peer* p = FindPeer(id)) CloseEndpoint(p, /*force=*/true, now);
      }
      absl::Time next_timer = now + (active_.empty() ? kIdleTick : kBusyTick);
      bool more_to_issue = false;
      std::vector<TransferId> ids(active_.begin(), active_.end());
      for (TransferId id : ids) {
        auto it = transfers_.find(id);
        if (it == transfers_.end()) {
          active_.erase(id);
          continue;
        }
        Transfer* t = it->second.get();
        if (!t->finalized) {
          if (!t->abort && now >= t->deadline) {
            Abort(t, TransferState::kTimedOut,
                  absl::StrCat("not finished within ", absl::FormatDuration(t->timeout)), now);
          }
          if (t->abort && !t->requests.empty() && now >= t->drain_deadline) {
            if (!t->forced_close) {
              // Reads UCX cannot cancel must not land after we report: drop
              // the endpoint, which completes them all.
              t->forced_close = true;
              t->drain_deadline = now + kCloseBound;
              if (Peer* p = FindPeer(t->peer)) {
                PeerFailed(p,
                           absl::StrCat("endpoint closed: reads of transfer ", t->id,
                                        " did not drain after it ended (",
                                        TransferStateName(*t->abort), ")"),
                           now);
                CloseEndpoint(p, /*force=*/true, now);
              }
            } else {
              LOG(ERROR) << "ucx transfer " << t->id << ": " << t->requests.size()
                         << " reads still outstanding after a forced endpoint close; reporting "
                         << TransferStateName(*t->abort) << " anyway";
              Finalize(t, *t->abort, t->abort_detail, now);
            }
          }
          Advance(t, now);
        }
        ReleaseIfDrained(t);
        if (t->released && t->finalized) {
          active_.erase(id);
          if (t->taken) transfers_.erase(it);
          continue;
        }
        if (t->finalized) continue;  // only draining: UCX events wake us
        if (t->same_host) {
          // Copied in steps; a busy one is being copied by a waiter.
          if (!t->busy) more_to_issue = true;
          next_timer = std::min(next_timer, t->deadline);
          continue;
        }
        if (HasMoreToIssue(t) && !t->abort && t->requests.size() < kMaxOutstandingOps) {
          more_to_issue = true;  // the per-round budget ran out: go again at once
        }
        next_timer = std::min(next_timer, t->abort ? t->drain_deadline : t->deadline);
      }
      PollClosing(now);
      if (!closing_.empty()) next_timer = std::min(next_timer, now + kBusyTick);
      if (more_to_issue) continue;
      if (options_.busy_poll && !active_.empty()) continue;
      if (now - last_event < options_.spin_window) {
        // More is likely on its way (the reply to a read just issued, the
        // next phase's read of a pull just served): poll for it rather than
        // pay a wake-up. Yield outside the lock so callers get mu_.
        spin = true;
      } else if (worker_fd_ >= 0) {
        ucs_status_t st = ucp_worker_arm(worker_);
        if (st == UCS_ERR_BUSY) continue;  // events arrived: progress again
        if (st != UCS_OK) {
          LOG(WARNING) << "ucp_worker_arm: " << ucs_status_string(st);
          next_timer = std::min(next_timer, now + kBusyTick);
        }
      } else if (!active_.empty()) {
        next_timer = std::min(next_timer, now + absl::Microseconds(100));
      }
      wait = std::max(absl::ZeroDuration(), next_timer - now);
      pidfds.clear();
      for (auto& [id, p] : peers_) {
        if (p->same_host && !p->failed && p->pidfd >= 0) pidfds.push_back(p->pidfd);
      }
    }
    if (spin) {
      spin = false;
      std::this_thread::yield();
      continue;
    }
    // The wake eventfd, UCX's event fd, and the pidfds of same-host
    // exporters (readable once they exit). A pidfd closed meanwhile only
    // makes a spurious wake-up: the check above uses the live set.
    fds.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    if (worker_fd_ >= 0) fds.push_back({worker_fd_, POLLIN, 0});
    const size_t first_pidfd = fds.size();
    for (int fd : pidfds) fds.push_back({fd, POLLIN, 0});
    struct timespec ts = absl::ToTimespec(wait);
    int n = ppoll(fds.data(), fds.size(), &ts, nullptr);
    for (size_t i = first_pidfd; n > 0 && i < fds.size(); ++i) {
      if (fds[i].revents != 0) pid_event = true;
    }

    if (n > 0 && (fds[0].revents & POLLIN)) {
      uint64_t v;
      ssize_t r = read(wake_fd_, &v, sizeof(v));
      (void)r;
      woken = true;
    }
  }
}

UcxKvTransport::Peer* UcxKvTransport::FindPeer(PeerId id) {
  auto it = peers_.find(id);
  return it == peers_.end() ? nullptr : it->second.get();
}

void UcxKvTransport::OnGetDone(void* request, ucs_status_t status, void* user_data) {
  auto* t = static_cast<Transfer*>(user_data);
  // Callbacks run inside ucp_worker_progress or ucp_ep_close_nbx, both
  // called with mu_ held.
  t->owner->mu_.AssertHeld();
  t->owner->OpDone(t, request, status);
}

void UcxKvTransport::OpDone(Transfer* t, void* request, ucs_status_t status) {
  auto it = t->requests.find(request);
  if (it != t->requests.end()) {
    if (status == UCS_OK) t->bytes_done += it->second;
    t->requests.erase(it);
  }
  if (status != UCS_OK && status != UCS_ERR_CANCELED && t->error == UCS_OK) t->error = status;
  ucp_request_free(request);
}

void UcxKvTransport::OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* peer = static_cast<Peer*>(arg);
  UcxKvTransport* self = peer->owner;
  self->mu_.AssertHeld();  // only ever called from inside progress
  if (peer->ep != ep) return;  // an endpoint we already dropped
  self->PeerFailed(peer, absl::StrCat("peer lost: ", ucs_status_string(status)), absl::Now());
}

void UcxKvTransport::PeerFailed(Peer* peer, std::string why, absl::Time now) {
  if (peer->failed) return;
  peer->failed = true;
  peer->failure = why;
  auto a = peer_by_address_.find(peer->address);
  if (a != peer_by_address_.end() && a->second == peer->id) peer_by_address_.erase(a);
  std::vector<TransferId> ids(peer->transfers.begin(), peer->transfers.end());
  for (TransferId id : ids) {
    auto it = transfers_.find(id);
    if (it != transfers_.end()) Abort(it->second.get(), TransferState::kPeerLost, why, now);
  }
  failed_peers_.push_back(peer->id);
  LOG(WARNING) << "ucx peer " << peer->id << ": " << why;
}

void UcxKvTransport::CloseEndpoint(Peer* peer, bool force, absl::Time now) {
  if (peer->pidfd >= 0) {
    close(peer->pidfd);
    peer->pidfd = -1;
  }
  if (peer->ep == nullptr) return;
  ucp_ep_h ep = peer->ep;
  peer->ep = nullptr;
  peer->keys.clear();  // in-flight transfers hold their own reference
  ucp_request_param_t param = {};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t req = ucp_ep_close_nbx(ep, &param);
  if (UCS_PTR_IS_PTR(req)) {
    closing_.push_back({req, now + kCloseBound});
  } else if (UCS_PTR_STATUS(req) != UCS_OK && !peer->failed) {
    LOG(WARNING) << "ucp_ep_close_nbx: " << ucs_status_string(UCS_PTR_STATUS(req));
  }
}

void UcxKvTransport::PollClosing(absl::Time now) {
  for (size_t i = 0; i < closing_.size();) {
    ucs_status_t st = ucp_request_check_status(closing_[i].request);
    if (st == UCS_INPROGRESS && now < closing_[i].deadline) {
      ++i;
      continue;
    }
    if (st == UCS_INPROGRESS) {
      // A graceful close that the peer never confirmed. Freeing marks the
      // request released: UCX drops it when the close ends or the worker dies.
      LOG(WARNING) << "ucx endpoint close did not complete within " << kCloseBound;
    }
    ucp_request_free(closing_[i].request);
    closing_.erase(closing_.begin() + i);
  }
}

void UcxKvTransport::Abort(Transfer* t, TransferState state, std::string detail, absl::Time now) {
  if (t->finalized || t->abort) return;
  t->abort = state;
  t->stop.store(true, std::memory_order_relaxed);
  t->abort_detail = std::move(detail);
  t->drain_deadline = now + options_.cancel_grace;
  // RMA reads cannot be cancelled in flight by most transports; this is a
  // no-op for them, and the drain deadline above handles the rest. (A copy:
  // a cancel may complete its request, and the callback edits the map.)
  std::vector<void*> reqs;
  for (auto& [req, bytes] : t->requests) reqs.push_back(req);
  for (void* req : reqs) {
    if (t->requests.count(req) != 0) ucp_request_cancel(worker_, req);
  }
}

void UcxKvTransport::Finalize(Transfer* t, TransferState state, std::string detail,
                              absl::Time now) {
  if (t->finalized) return;
  t->finalized = true;
  t->result.state = state;
  t->result.duration = now - t->start;
  t->result.detail = std::move(detail);
  t->result.bytes = t->bytes_done;
  if (Peer* p = FindPeer(t->peer)) p->transfers.erase(t->id);
  metrics_.Record(t->result);
  ReleaseIfDrained(t);
}

void UcxKvTransport::ReleaseIfDrained(Transfer* t) {
  if (t->released || !t->finalized || !t->requests.empty() || t->busy) return;
  t->released = true;
  t->keys.reset();
  absl::MutexLock lock(&regions_mu_);
  auto it = regions_.find(t->local_region);
  if (it != regions_.end()) it->second->local_transfers--;
}

bool UcxKvTransport::HasMoreToIssue(const Transfer* t) const {
  switch (t->phase) {
    case Phase::kQueued:
      return true;
    case Phase::kEpochsBefore:
    case Phase::kEpochsAfter:
      return t->cursor < t->epoch_runs.size();
    case Phase::kData:
      return t->cursor < t->segments.size();
  }
  return false;
}

void UcxKvTransport::IssueSome(Transfer* t, uint64_t* budget) {
  Peer* peer = FindPeer(t->peer);
  if (peer == nullptr || peer->ep == nullptr) {
    t->error = UCS_ERR_CONNECTION_RESET;
    return;
  }
  while (HasMoreToIssue(t) && *budget > 0 && t->requests.size() < kMaxOutstandingOps &&
         t->error == UCS_OK) {
    void* local;
    uint64_t length;
    uint64_t remote;
    ucp_rkey_h rkey;
    bool data = t->phase == Phase::kData;
    if (data) {
      const Segment& s = t->segments[t->cursor];
      length = std::min(kChunkBytes, s.length - t->cursor_offset);
      // A small (inline) budget never issues a read beyond it; a full one
      // always issues at least one chunk.
      if (length > *budget && *budget < kChunkBytes) break;
      local = t->local_base + s.dst_offset + t->cursor_offset;
      remote = t->keys->desc.base + s.src_offset + t->cursor_offset;
      rkey = t->keys->rkey;
      t->cursor_offset += length;
      if (t->cursor_offset >= s.length) {
        ++t->cursor;
        t->cursor_offset = 0;
      }
      if (length == 0) continue;
    } else {
      auto [first, last] = t->epoch_runs[t->cursor++];
      local = &t->epochs_read[first];
      length = (last - first + 1) * sizeof(uint64_t);
      remote = t->keys->desc.epoch_base +
               static_cast<uint64_t>(t->epoch_blocks[first]) * sizeof(uint64_t);
      rkey = t->keys->epoch_rkey;
    }
    ucp_request_param_t param = {};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send = &UcxKvTransport::OnGetDone;
    param.user_data = t;
    if (data && t->local_memh != nullptr) {
      // The destination is registered: zero-copy where the transport can.
      param.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
      param.memh = t->local_memh;
    }
    ucs_status_ptr_t sp = ucp_get_nbx(peer->ep, local, length, remote, rkey, &param);
    if (UCS_PTR_IS_PTR(sp)) {
      t->requests.emplace(sp, data ? length : 0);
    } else if (UCS_PTR_STATUS(sp) == UCS_OK) {
      if (data) t->bytes_done += length;
    } else {
      t->error = UCS_PTR_STATUS(sp);
    }
    *budget -= std::min(*budget, length);
  }
}

void UcxKvTransport::Advance(Transfer* t, absl::Time now, uint64_t budget) {
  if (t->same_host) {
    SameHostStep(t, now, budget);
    return;
  }
  for (;;) {
    if (t->finalized) return;
    if (!t->abort && t->error != UCS_OK) {
      // With UCP_ERR_HANDLING_MODE_PEER a failed read means the endpoint is
      // unusable: fail the peer, which aborts every transfer on it.
      std::string why = absl::StrCat("peer lost: read failed: ", ucs_status_string(t->error));
      Peer* p = FindPeer(t->peer);
      if (p != nullptr && !p->failed) {
        PeerFailed(p, why, now);
      } else {
        Abort(t, TransferState::kPeerLost, p != nullptr ? p->failure : why, now);
      }
    }
    if (t->abort) {
      if (t->requests.empty()) Finalize(t, *t->abort, t->abort_detail, now);
      return;
    }
    if (t->phase == Phase::kQueued) {
      if (now >= t->deadline) {
        Abort(t, TransferState::kTimedOut,
              absl::StrCat("not finished within ", absl::FormatDuration(t->timeout)), now);
        continue;
      }
      Peer* p = FindPeer(t->peer);
      if (p == nullptr || p->failed) {
        Abort(t, TransferState::kPeerLost, p != nullptr ? p->failure : "peer disconnected", now);
        continue;
      }
      t->phase = t->epoch_blocks.empty() ? Phase::kData : Phase::kEpochsBefore;
      t->cursor = 0;
      t->cursor_offset = 0;
    }
    if (HasMoreToIssue(t)) {
      IssueSome(t, &budget);
      if (t->error != UCS_OK) continue;
      if (HasMoreToIssue(t)) return;  // the next progress round issues more
    }
    if (!t->requests.empty()) return;
    // The phase is complete.
    switch (t->phase) {
      case Phase::kQueued:
        break;
      case Phase::kEpochsBefore:
      case Phase::kEpochsAfter: {
        bool before = t->phase == Phase::kEpochsBefore;
        if (!CheckEpochs(t, before, now)) return;
        if (before) {
          t->phase = Phase::kData;
        } else {
          Finalize(t, TransferState::kDone, "", now);
          return;
        }
        t->cursor = 0;
        t->cursor_offset = 0;
        break;
      }
      case Phase::kData:
        if (t->epoch_blocks.empty()) {
          Finalize(t, TransferState::kDone, "", now);
          return;
        }
        t->phase = Phase::kEpochsAfter;
        t->cursor = 0;
        break;
    }
  }
}

absl::StatusOr<std::shared_ptr<UcxKvTransport::RemoteKeys>> UcxKvTransport::KeysFor(
    Peer* peer, const std::string& descriptor) {
  auto it = peer->keys.find(descriptor);
  if (it != peer->keys.end()) return it->second;
  ASSIGN_OR_RETURN(RegionDescriptor desc, DecodeRegion(descriptor));
  auto keys = std::make_shared<RemoteKeys>();
  keys->desc = std::move(desc);
  if (peer->same_host) {
    // Read by address: the packed keys are validated, never unpacked.
    if (peer->keys.size() >= 256) peer->keys.clear();
    peer->keys.emplace(descriptor, keys);
    return keys;
  }
  ucs_status_t st = ucp_ep_rkey_unpack(peer->ep, keys->desc.rkey.data(), &keys->rkey);
  if (st != UCS_OK) {
    return absl::InvalidArgumentError(
        absl::StrCat("remote region: ucp_ep_rkey_unpack: ", ucs_status_string(st)));
  }
  if (keys->desc.num_epochs > 0) {
    st = ucp_ep_rkey_unpack(peer->ep, keys->desc.epoch_rkey.data(), &keys->epoch_rkey);
    if (st != UCS_OK) {
      return absl::InvalidArgumentError(
          absl::StrCat("remote region: epoch table ucp_ep_rkey_unpack: ", ucs_status_string(st)));
    }
  }
  // Bound the cache: exporters re-register rarely, but never let it grow
  // without limit. Keys still used by a transfer live on through it.
  if (peer->keys.size() >= 256) peer->keys.clear();
  peer->keys.emplace(descriptor, keys);
  return keys;
}

absl::StatusOr<RegionId> UcxKvTransport::RegisterRegion(void* base, uint64_t bytes,
                                                        int64_t num_epoch_blocks) {
  RETURN_IF_ERROR(CheckRegisterRegion("ucx", base, bytes, num_epoch_blocks));
  auto region = std::make_unique<Region>();
  region->base = base;
  region->bytes = bytes;
  absl::MutexLock lock(&mu_);
  auto map = [&](void* addr, uint64_t length, ucp_mem_h* memh,
                 std::string* rkey) -> absl::Status {
    ucp_mem_map_params_t p = {};
    p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    p.address = addr;
    p.length = length;
    ucs_status_t st = ucp_mem_map(context_, &p, memh);
    if (st != UCS_OK) return UcxError(st, "ucp_mem_map");
    void* packed = nullptr;
    size_t packed_len = 0;
    st = ucp_rkey_pack(context_, *memh, &packed, &packed_len);
    if (st != UCS_OK) {
      ucp_mem_unmap(context_, *memh);
      *memh = nullptr;
      return UcxError(st, "ucp_rkey_pack");
    }
    rkey->assign(static_cast<const char*>(packed), packed_len);
    ucp_rkey_buffer_release(packed);
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(map(base, bytes, &region->memh, &region->rkey));
  if (num_epoch_blocks > 0) {
    absl::StatusOr<std::unique_ptr<EpochTable>> table = EpochTable::Allocate(num_epoch_blocks);
    absl::Status s = table.status();
    if (s.ok()) {
      region->epochs = *std::move(table);
      s = map(region->epochs->words(), region->epochs->bytes(), &region->epoch_memh, &region->epoch_rkey);
    }
    if (!s.ok()) {
      ucp_mem_unmap(context_, region->memh);
      return s;
    }
  }
  RegionId id = next_region_++;
  absl::MutexLock rlock(&regions_mu_);
  regions_.emplace(id, std::move(region));
  return id;
}

absl::Status UcxKvTransport::DeregisterRegion(RegionId region) {
  absl::MutexLock lock(&mu_);
  absl::MutexLock rlock(&regions_mu_);
  auto it = regions_.find(region);
  if (it == regions_.end()) {
    return absl::NotFoundError(absl::StrCat("DeregisterRegion: unknown region ", region));
  }
  Region* r = it->second.get();
  if (r->local_transfers > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "DeregisterRegion: ", r->local_transfers, " pulls still write into region ", region));
  }
  if (r->epochs != nullptr) {
    // A stale handle may still be pulled after this: every epoch moves on, so
    // such a pull fails its first epoch check and never reads the region.
    // The table itself stays mapped until the transport dies, so that a late
    // remote read of it never touches freed memory.
    r->epochs->BumpAll();
    retired_epochs_.push_back({std::move(r->epochs), r->epoch_memh});
  }
  ucs_status_t st = ucp_mem_unmap(context_, r->memh);
  regions_.erase(it);
  if (st != UCS_OK) return UcxError(st, "ucp_mem_unmap");
  return absl::OkStatus();
}

absl::StatusOr<std::string> UcxKvTransport::ExportRegion(RegionId region) {
  absl::MutexLock rlock(&regions_mu_);
  auto it = regions_.find(region);
  if (it == regions_.end()) {
    return absl::NotFoundError(absl::StrCat("ExportRegion: unknown region ", region));
  }
  const Region& r = *it->second;
  RegionDescriptor d;
  d.base = reinterpret_cast<uint64_t>(r.base);
  d.length = r.bytes;
  d.rkey = r.rkey;
  if (r.epochs != nullptr) {
    d.epoch_base = reinterpret_cast<uint64_t>(r.epochs->words());
    d.num_epochs = static_cast<uint64_t>(r.epochs->num_blocks());
    d.epoch_rkey = r.epoch_rkey;
  }
  return EncodeRegion(d);
}

uint64_t UcxKvTransport::BlockEpoch(RegionId region, int32_t block) {
  absl::ReaderMutexLock rlock(&regions_mu_);
  auto it = regions_.find(region);
  CHECK(it != regions_.end()) << "BlockEpoch: unknown region " << region;
  CHECK(it->second->epochs != nullptr) << "BlockEpoch: region " << region << " has no epoch table";
  return it->second->epochs->Load(block);
}

void UcxKvTransport::BumpEpoch(RegionId region, int32_t block) {
  absl::ReaderMutexLock rlock(&regions_mu_);
  auto it = regions_.find(region);
  CHECK(it != regions_.end()) << "BumpEpoch: unknown region " << region;
  CHECK(it->second->epochs != nullptr) << "BumpEpoch: region " << region << " has no epoch table";
  it->second->epochs->Bump(block);
}

std::optional<std::string> UcxKvTransport::EpochMismatch(const Transfer* t, bool before) {
  auto read = [t](int32_t block) {
    return t->epochs_read[std::lower_bound(t->epoch_blocks.begin(), t->epoch_blocks.end(), block) -
                          t->epoch_blocks.begin()];
  };
  return BrokenPromise(t->block_epochs, read, before ? "before" : "during");
}

bool UcxKvTransport::CheckEpochs(Transfer* t, bool before, absl::Time now) {
  std::optional<std::string> mismatch = EpochMismatch(t, before);
  if (mismatch) Finalize(t, TransferState::kLeaseExpired, std::move(*mismatch), now);
  return !mismatch;
}

absl::StatusOr<PeerId> UcxKvTransport::Connect(const std::string& peer_address) {
  ASSIGN_OR_RETURN(PeerAddress decoded, DecodeAddress(peer_address));
  {
    absl::MutexLock lock(&mu_);
    auto it = peer_by_address_.find(peer_address);
    if (it != peer_by_address_.end()) return it->second;
  }
  // Same host, same PID namespace: read the exporter's memory directly.
  int pidfd = -1;
  if (same_host_lane_ && decoded.host && decoded.host->boot_id == host_->boot_id &&
      decoded.host->pid_namespace == host_->pid_namespace) {
    absl::StatusOr<int> fd = OpenSameHost(*decoded.host);
    if (fd.ok()) {
      pidfd = *fd;
    } else {
      LOG(INFO) << "ucx: no same-host lane to pid " << decoded.host->pid
                << ", using UCX endpoints: " << fd.status().message();
    }
  }
  absl::MutexLock lock(&mu_);
  auto it = peer_by_address_.find(peer_address);
  if (it != peer_by_address_.end()) {
    if (pidfd >= 0) close(pidfd);
    return it->second;
  }
  auto peer = std::make_unique<Peer>();
  peer->owner = this;
  peer->id = next_peer_++;
  peer->address = peer_address;
  if (pidfd >= 0) {
    peer->same_host = true;
    peer->pid = static_cast<pid_t>(decoded.host->pid);
    peer->pidfd = pidfd;
    PeerId id = peer->id;
    LOG(INFO) << "ucx peer " << id << ": same-host lane (process_vm_readv) to pid " << peer->pid;
    peer_by_address_[peer_address] = id;
    peers_.emplace(id, std::move(peer));
    Wake();  // the progress thread watches the new pidfd
    return id;
  }
  const std::string& worker_address = decoded.worker_address;
  ucp_ep_params_t params = {};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(worker_address.data());
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &UcxKvTransport::OnEndpointError;
  params.err_handler.arg = peer.get();
  ucs_status_t st = ucp_ep_create(worker_, &params, &peer->ep);
  if (st != UCS_OK) return UcxError(st, "Connect: ucp_ep_create");
  if (tcp_only_) BoundKeepaliveSockets();  // the socket ucp_ep_create opened
  PeerId id = peer->id;
  peer_by_address_[peer_address] = id;
  peers_.emplace(id, std::move(peer));
  Wake();  // wireup messages need progress
  return id;
}

void UcxKvTransport::Disconnect(PeerId id) {
  absl::MutexLock lock(&mu_);
  auto it = peers_.find(id);
  if (it == peers_.end()) return;
  Peer* peer = it->second.get();
  absl::Time now = absl::Now();
  std::vector<TransferId> ids(peer->transfers.begin(), peer->transfers.end());
  for (TransferId tid : ids) {
    auto t = transfers_.find(tid);
    if (t != transfers_.end()) Abort(t->second.get(), TransferState::kCancelled, "disconnected", now);
  }
  auto a = peer_by_address_.find(peer->address);
  if (a != peer_by_address_.end() && a->second == id) peer_by_address_.erase(a);
  // Force: outstanding reads complete (cancelled) now, not after the peer answers.
  CloseEndpoint(peer, /*force=*/true, now);
  for (TransferId tid : ids) {
    auto t = transfers_.find(tid);
    if (t != transfers_.end()) Advance(t->second.get(), now);
  }
  if (retired_peers_.size() >= 1024) {
    retired_peers_.erase(retired_peers_.begin(), retired_peers_.begin() + 512);
  }
  retired_peers_.push_back(std::move(it->second));
  peers_.erase(it);
  Wake();
}

absl::StatusOr<TransferId> UcxKvTransport::Pull(const PullRequest& request) {
  absl::MutexLock lock(&mu_);
  Peer* peer = FindPeer(request.peer);
  if (peer == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("Pull: unknown peer ", request.peer));
  }
  auto t = std::make_unique<Transfer>();
  t->owner = this;
  t->peer = request.peer;
  t->local_region = request.local_region;
  t->start = absl::Now();
  t->timeout = request.timeout;
  t->deadline = t->start + request.timeout;
  uint64_t local_bytes = 0;
  {
    absl::MutexLock rlock(&regions_mu_);
    auto r = regions_.find(request.local_region);
    if (r == regions_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("Pull: unknown local region ", request.local_region));
    }
    local_bytes = r->second->bytes;
    t->local_base = static_cast<uint8_t*>(r->second->base);
    t->local_memh = r->second->memh;
  }
  // Validate the descriptor even for a failed peer, so that a malformed
  // request is always an error.
  std::shared_ptr<RemoteKeys> keys;
  RegionDescriptor parsed;
  const RegionDescriptor* desc;
  if (!peer->failed) {
    ASSIGN_OR_RETURN(keys, KeysFor(peer, request.remote_region));
    desc = &keys->desc;
  } else {
    ASSIGN_OR_RETURN(parsed, DecodeRegion(request.remote_region));
    desc = &parsed;
  }
  RETURN_IF_ERROR(CheckPullBounds(request, desc->length, local_bytes, desc->num_epochs).status());
  for (const auto& [block, epoch] : request.block_epochs) t->epoch_blocks.push_back(block);
  std::sort(t->epoch_blocks.begin(), t->epoch_blocks.end());
  t->epoch_blocks.erase(std::unique(t->epoch_blocks.begin(), t->epoch_blocks.end()),
                        t->epoch_blocks.end());
  for (size_t i = 0; i < t->epoch_blocks.size(); ++i) {
    if (i > 0 && t->epoch_blocks[i] == t->epoch_blocks[i - 1] + 1) {
      t->epoch_runs.back().second = i;
    } else {
      t->epoch_runs.push_back({i, i});
    }
  }
  t->epochs_read.assign(t->epoch_blocks.size(), 0);
  t->segments = request.segments;
  t->block_epochs = request.block_epochs;
  t->keys = std::move(keys);
  TransferId id = next_transfer_++;
  t->id = id;
  {
    absl::MutexLock rlock(&regions_mu_);
    regions_[request.local_region]->local_transfers++;
  }
  Transfer* raw = t.get();
  transfers_.emplace(id, std::move(t));
  active_.insert(id);
  metrics_.Started();
  if (peer->failed) {
    Finalize(raw, TransferState::kPeerLost, peer->failure, raw->start);
  } else {
    peer->transfers.insert(id);
    if (peer->same_host) {
      raw->same_host = true;
      // A small pull is copied here (microseconds); the progress thread, or
      // a caller in Wait, copies the others.
      uint64_t bytes = 0;
      for (const Segment& s : raw->segments) bytes += s.length;
      if (bytes <= kInlineIssueBytes) {
        SameHostStep(raw, raw->start, kInlineIssueBytes);
        // mu_ was released while copying: the transfer is still ours (only
        // Poll/Wait of its id, which the caller has not seen, collect it).
      }
      // No wake-up: a caller that Waits copies the pull itself, and waking
      // the progress thread meanwhile costs a VM's copy tens of
      // microseconds. Poll hands it to the progress thread instead.
      return id;
    }
    // Send the first reads from here: they leave one thread wake-up sooner.
    Advance(raw, raw->start, kInlineIssueBytes);
    // Completions of reads in flight wake the progress thread, and it sleeps
    // at most kIdleTick, so it needs a nudge only for a transfer with no read
    // out (nothing issued yet, or already ended), a failed endpoint to close,
    // or a deadline sooner than its longest sleep.
    if (raw->requests.empty() || raw->abort || !failed_peers_.empty() ||
        request.timeout < kIdleTick) {
      Wake();
    }
  }
  return id;
}

TransferResult UcxKvTransport::Take(std::map<TransferId, std::unique_ptr<Transfer>>::iterator it) {
  Transfer* t = it->second.get();
  TransferResult r = t->result;
  t->taken = true;
  // A drained transfer goes now; one with reads still outstanding (only
  // after a stalled forced close) stays until the progress thread sees them end.
  if (t->released) transfers_.erase(it);
  return r;
}

std::optional<TransferResult> UcxKvTransport::Poll(TransferId id) {
  absl::MutexLock lock(&mu_);
  auto it = transfers_.find(id);
  if (it == transfers_.end() || it->second->taken) return UnknownTransfer("ucx", id);
  Transfer* t = it->second.get();
  if (!t->finalized) {
    if (t->same_host && !t->nudged) {
      t->nudged = true;  // nobody waits for it: the progress thread copies it
      Wake();
    }
    return std::nullopt;
  }
  return Take(it);
}

TransferResult UcxKvTransport::Wait(TransferId id) {
  absl::MutexLock lock(&mu_);
  auto it = transfers_.find(id);
  if (it == transfers_.end() || it->second->taken) return UnknownTransfer("ucx", id);
  // The progress thread ends the transfer by its deadline plus the drain and
  // forced-close bounds; the extra second only guards against a stalled thread.
  absl::Time limit = it->second->deadline + options_.cancel_grace + 2 * kCloseBound + absl::Seconds(1);
  // A same-host pull is copied by its waiter whenever no other thread is
  // copying it: no thread wake-up between the caller and its bytes.
  auto ready = [this, id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto i = transfers_.find(id);
    return i == transfers_.end() || i->second->finalized ||
           (i->second->same_host && !i->second->busy);
  };
  const absl::Time spin_until = absl::Now() + kWaitSpin;
  for (;;) {
    it = transfers_.find(id);
    if (it == transfers_.end() || it->second->finalized) break;
    Transfer* t = it->second.get();
    if (t->same_host && !t->busy) {
      SameHostStep(t, absl::Now(), std::numeric_limits<uint64_t>::max());
      continue;
    }
    // The progress thread is copying a step of a same-host pull (at most
    // kIssueBudgetBytes, a few milliseconds): watch for its end rather than
    // sleep, so the rest is copied here without a wake-up in between. Past
    // the limit, too: a step always ends.
    if (t->same_host && (absl::Now() < spin_until || absl::Now() >= limit)) {
      mu_.Unlock();
      std::this_thread::yield();
      LockSpinning();
      continue;
    }
    if (!mu_.AwaitWithDeadline(absl::Condition(&ready), limit)) {
      it = transfers_.find(id);
      if (it != transfers_.end() && it->second->busy) continue;
      break;
    }
  }
  it = transfers_.find(id);
  if (it == transfers_.end() || it->second->taken) {
    TransferResult r;
    r.state = TransferState::kCancelled;
    r.detail = absl::StrCat("transfer ", id, " was collected by another caller");
    return r;
  }
  if (!it->second->finalized) {
    LOG(ERROR) << "ucx transfer " << id << ": progress stalled past its deadline";
    Finalize(it->second.get(), TransferState::kTimedOut, "progress stalled past the deadline",
             absl::Now());
  }
  return Take(it);
}

void UcxKvTransport::Cancel(TransferId id) {
  absl::MutexLock lock(&mu_);
  auto it = transfers_.find(id);
  if (it == transfers_.end()) return;
  absl::Time now = absl::Now();
  Abort(it->second.get(), TransferState::kCancelled, "cancelled", now);
  Advance(it->second.get(), now);  // ends it now when nothing is outstanding
  Wake();
}

}  // namespace duet::kvtransfer::ucx

namespace duet::kvtransfer {

absl::StatusOr<KvTransportPtr> NewUcxTransport(const UcxTransportOptions& options) {
  auto t = std::make_unique<ucx::UcxKvTransport>(options);
  RETURN_IF_ERROR(t->Init());
  return KvTransportPtr(std::move(t));
}

}  // namespace duet::kvtransfer
