// What the router itself adds, measured against a synthetic worker.
//
//   bazel run -c opt //tools/bench:router [-- --tokens 32 --interval-ms 20]
//
// The router (the duet binary) runs pinned to core 0. The synthetic worker is
// this binary re-run as a real worker process (--synthetic-worker): it
// registers over the real control plane as a colocated worker and, with no
// model, answers each request with a first token at once and then one token
// per --interval-ms, every request's token of a tick in one TokenBatch frame,
// as a decode step does; it logs CLOCK_MONOTONIC times of every request's
// arrival and every token's send. The client (this process, one epoll thread)
// runs N concurrent streaming /v1/completions and stamps every SSE event on
// arrival; worker and client share core 1. Each request's prompt names it.
//
// Router-added latency, from one clock (same host, CLOCK_MONOTONIC):
//   per request: (client's first token - client's send) - (worker's first
//                token send - worker's receipt): the inbound and outbound
//                router work of a request;
//   per token:   client's receipt - worker's send, tokens 2.. of a stream.
// Both include two loopback TCP hops and the client's own parsing: an upper
// bound on the router's share. Targets at 512 streams: p99 < 1 ms per
// request, < 100 us per streamed token. Beside them, the machine's floor
// (MeasureWriteFloor): a bare thread on the router's core writing a token's
// chunk to 512 loopback connections in turn, which bounds any one-core
// router's per-token p99 when a decode step's 512 tokens arrive together. Then the most concurrent streams the
// one-core router holds: every stream completes and p99 per token (end to
// end) stays under the token interval, doubling from 1024.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/flags.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "base/subprocess.h"
#include "http/client.h"
#include "http/sse.h"
#include "engine/testing/model_maker.h"
#include "worker/runtime.h"
#include "proto/frame.h"

namespace duet::bench {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// A request's name in its prompt: two token ids below 1000.
uint32_t KeyOf(int32_t a, int32_t b) { return static_cast<uint32_t>((a - 1) * 1000 + (b - 1)); }
std::pair<int32_t, int32_t> PromptOf(uint32_t key) {
  return {static_cast<int32_t>(key / 1000 + 1), static_cast<int32_t>(key % 1000 + 1)};
}

// ---------------------------------------------------------------------------
// The synthetic worker.

class SyntheticService : public worker::WorkerService {
 public:
  // per_stream: each request's tokens on its own phase (due every interval
  // from its arrival), sent as they fall due; else one frame per interval
  // with every request's token, as a decode step sends them.
  SyntheticService(std::string model, absl::Duration interval, int32_t token, bool per_stream)
      : model_(std::move(model)), interval_(interval), token_(token), per_stream_(per_stream) {}
  ~SyntheticService() override { Stop(); }

  void Start(worker::FrameSink* sink) {
    sink_ = sink;
    pacer_ = std::thread([this] { Pace(); });
  }
  void Stop() {
    stop_.store(true);
    if (pacer_.joinable()) pacer_.join();
  }

  worker::RegistrationInfo Registration() override {
    worker::RegistrationInfo r;
    r.role = proto::ROLE_COLOCATED;
    r.model = model_;
    r.kv_blocks_total = 1 << 20;
    r.max_model_len = 1 << 16;
    r.layout.set_num_layers(1);
    r.layout.set_num_kv_heads(1);
    r.layout.set_block_size(16);
    r.layout.set_head_dim(1);
    r.layout.set_dtype("f32");
    r.layout.set_layer_end(1);
    r.layout.set_head_end(1);
    return r;
  }

  void OnFrame(const rpc::ConnectionPtr&, proto::Frame frame) override {
    const int64_t now = NowNs();
    if (frame.has_prefill()) {
      const proto::PrefillRequest& p = frame.prefill();
      const uint32_t key = p.spec().prompt_ids_size() >= 2 ? KeyOf(p.spec().prompt_ids(0), p.spec().prompt_ids(1)) : 0;
      proto::Frame f = proto::NewFrame();
      f.mutable_first_token()->set_request_id(p.request_id());
      f.mutable_first_token()->mutable_token()->set_id(token_);
      f.mutable_first_token()->set_worker_id(sink_->worker_id());
      {
        absl::MutexLock lock(&mu_);
        log_ << "R " << key << " " << now << "\n";
        if (p.spec().max_tokens() > 1) {
          active_[p.request_id()] = {key, 1, p.spec().max_tokens(), absl::Now() + interval_};
        }
      }
      const int64_t sent = NowNs();
      sink_->SendToRouter(f);
      absl::MutexLock lock(&mu_);
      log_ << "T " << key << " 0 " << sent << "\n";
      if (p.spec().max_tokens() <= 1) Finish(p.request_id());
    } else if (frame.has_cancel()) {
      absl::MutexLock lock(&mu_);
      active_.erase(frame.cancel().request_id());
    }
  }

  proto::WorkerStats Stats() override {
    proto::WorkerStats s;
    s.set_kv_blocks_total(1 << 20);
    s.set_kv_blocks_free(1 << 20);
    absl::MutexLock lock(&mu_);
    s.set_running_requests(static_cast<int64_t>(active_.size()));
    return s;
  }

  std::string TakeLog() {
    absl::MutexLock lock(&mu_);
    std::string s = log_.str();
    log_.str("");
    return s;
  }

 private:
  struct Active {
    uint32_t key;
    int next;  // index of the next token
    int max_tokens;
    absl::Time due;  // per_stream: when the next token is
  };

  void Finish(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    proto::Frame f = proto::NewFrame();
    f.mutable_finish()->set_request_id(id);
    f.mutable_finish()->set_reason(proto::FINISH_LENGTH);
    sink_->SendToRouter(f);
  }

  // One tick: the next token of every active request, in one frame.
  void Pace() {
    absl::Time next = absl::Now() + interval_;
    while (!stop_.load()) {
      if (per_stream_) {
        absl::Time earliest = absl::Now() + absl::Milliseconds(1);
        {
          absl::MutexLock lock(&mu_);
          for (const auto& [id, a] : active_) earliest = std::min(earliest, a.due);
        }
        absl::SleepFor(earliest - absl::Now());
      } else {
        absl::SleepFor(next - absl::Now());
        next += interval_;
      }
      absl::MutexLock lock(&mu_);
      if (active_.empty()) continue;
      const absl::Time now = absl::Now();
      proto::Frame f = proto::NewFrame();
      std::vector<uint64_t> done;
      std::vector<std::pair<uint32_t, int>> sent;
      for (auto& [id, a] : active_) {
        if (per_stream_) {
          if (a.due > now) continue;
          a.due += interval_;
        }
        proto::TokenEvent* ev = f.mutable_tokens()->add_events();
        ev->set_request_id(id);
        ev->mutable_token()->set_id(token_);
        sent.push_back({a.key, a.next});
        if (++a.next >= a.max_tokens) done.push_back(id);
      }
      if (sent.empty()) continue;
      const int64_t t = NowNs();
      sink_->SendToRouter(f);
      for (const auto& [key, idx] : sent) log_ << "T " << key << " " << idx << " " << t << "\n";
      for (uint64_t id : done) {
        Finish(id);
        active_.erase(id);
      }
    }
  }

  const std::string model_;
  const absl::Duration interval_;
  const int32_t token_;
  const bool per_stream_;
  worker::FrameSink* sink_ = nullptr;
  std::atomic<bool> stop_{false};
  std::thread pacer_;
  absl::Mutex mu_;
  std::map<uint64_t, Active> active_ ABSL_GUARDED_BY(mu_);
  std::ostringstream log_ ABSL_GUARDED_BY(mu_);
};

// Runs as the synthetic worker: registers, prints "ready", then on each
// "log PATH" line on stdin writes (and clears) its log there and prints
// "logged"; exits on "quit" or EOF.
int RunSyntheticWorker(const FlagSet& f) {
  SyntheticService service(f.GetString("model-name"), absl::Milliseconds(f.GetInt("interval-ms")),
                           static_cast<int32_t>(f.GetInt("token")), f.GetBool("per-stream"));
  worker::WorkerRuntime rt({.worker_id = "synthetic-0", .router_address = f.GetString("router")});
  absl::Status fatal;
  absl::Status s = rt.Start(&service, [](absl::Status st) {
    std::cerr << "synthetic worker: " << st << "\n";
    std::exit(1);
  });
  if (!s.ok()) {
    std::cerr << "synthetic worker: " << s << "\n";
    return 1;
  }
  service.Start(&rt);
  std::cout << "ready" << std::endl;
  std::string line;
  while (std::getline(std::cin, line) && line != "quit") {
    if (absl::StartsWith(line, "log ")) {
      std::ofstream(line.substr(4)) << service.TakeLog();
      std::cout << "logged" << std::endl;
    }
  }
  service.Stop();
  rt.Stop();
  return 0;
}

// ---------------------------------------------------------------------------
// The client: N streaming completions at once, on one epoll thread.

struct Stream {
  uint32_t key = 0;
  int fd = -1;
  std::string out;   // request bytes not yet sent
  http::ResponseReader reader;
  http::SseParser events;
  bool done = false;
  bool failed = false;
  std::string error;
  int64_t sent_ns = 0;
  std::vector<int64_t> events_ns;  // arrival of each token event
  uint64_t token_wire_bytes = 0;   // HTTP chunks that carried one token event
  int token_chunks = 0;
};

// Reads what has arrived: the head, then the SSE events of the chunked body.
void Parse(Stream& s, absl::string_view bytes, int64_t now) {
  const absl::Status st = s.reader.Feed(bytes, [&](absl::string_view piece, size_t wire_bytes) {
    s.events.Feed(piece, [&](absl::string_view ev) {
      if (ev == "[DONE]") return;
      if (ev.find("\"error\"") != absl::string_view::npos) {
        s.failed = true;
        s.error = std::string(ev.substr(0, 200));
        return;
      }
      if (ev.find("\"finish_reason\":null") != absl::string_view::npos) {
        s.events_ns.push_back(now);
        s.token_wire_bytes += wire_bytes;
        ++s.token_chunks;
      }
    });
  });
  if (!st.ok()) {
    s.failed = true;
    s.error = std::string(st.message());
  }
  if (s.reader.head_done() && s.reader.status() != 200) {
    s.failed = true;
    s.error = absl::StrCat("HTTP ", s.reader.status());
  }
  if (s.failed || s.reader.complete()) s.done = true;
}

absl::Status RunStreams(int port, const std::string& model, std::vector<Stream>& streams, int tokens) {
  int ep = epoll_create1(0);
  if (ep < 0) return absl::InternalError("epoll_create1");
  for (Stream& s : streams) {
    s.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (s.fd < 0) return absl::ResourceExhaustedError(absl::StrCat("socket: ", std::strerror(errno)));
    int one = 1;
    ::setsockopt(s.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::connect(s.fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    auto [p0, p1] = PromptOf(s.key);
    const std::string body = absl::StrCat(R"({"model": ")", model, R"(", "prompt": [)", p0, ", ", p1,
                                          R"(], "max_tokens": )", tokens, R"(, "stream": true})");
    s.out = absl::StrCat("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n",
                         "Content-Length: ", body.size(), "\r\n\r\n", body);
    epoll_event e{.events = EPOLLIN | EPOLLOUT, .data = {.ptr = &s}};
    epoll_ctl(ep, EPOLL_CTL_ADD, s.fd, &e);
  }
  size_t open = streams.size();
  std::vector<epoll_event> evs(256);
  char buf[65536];
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  while (open > 0 && absl::Now() < deadline) {
    int n = epoll_wait(ep, evs.data(), static_cast<int>(evs.size()), 1000);
    const int64_t now = NowNs();
    for (int i = 0; i < n; ++i) {
      Stream& s = *static_cast<Stream*>(evs[i].data.ptr);
      if (s.done) continue;
      if ((evs[i].events & EPOLLOUT) && !s.out.empty()) {
        ssize_t w = ::send(s.fd, s.out.data(), s.out.size(), MSG_NOSIGNAL);
        if (w > 0) {
          if (s.sent_ns == 0) s.sent_ns = now;
          s.out.erase(0, static_cast<size_t>(w));
        }
        if (s.out.empty()) {
          s.sent_ns = NowNs();
          epoll_event e{.events = EPOLLIN, .data = {.ptr = &s}};
          epoll_ctl(ep, EPOLL_CTL_MOD, s.fd, &e);
        }
      }
      if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
        for (;;) {
          ssize_t r = ::recv(s.fd, buf, sizeof(buf), 0);
          if (r > 0) {
            if (!s.done) Parse(s, absl::string_view(buf, static_cast<size_t>(r)), now);
            continue;
          }
          if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
            if (!s.done) {
              s.failed = true;
              s.error = "connection closed mid-stream";
              s.done = true;
            }
          }
          break;
        }
      }
      if (s.done) {
        ::close(s.fd);
        --open;
      }
    }
  }
  ::close(ep);
  if (open > 0) return absl::DeadlineExceededError(absl::StrCat(open, " streams did not finish"));
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------

// duet_router_overhead_seconds{stage} bucket counts, from the router's /metrics.
using Buckets = std::map<double, double>;  // le -> cumulative count
std::map<std::string, Buckets> ReadOverhead(int port) {
  std::map<std::string, Buckets> out;
  auto r = http::HttpCall("127.0.0.1", port, "GET", "/metrics", "", absl::Seconds(10));
  if (!r.ok()) return out;
  for (absl::string_view line : absl::StrSplit(r->body, '\n')) {
    for (const char* total : {"duet_router_token_frame_seconds_total ", "duet_router_token_frame_tokens_total "}) {
      absl::string_view l = line;
      double v = 0;
      if (absl::ConsumePrefix(&l, total) && absl::SimpleAtod(l, &v)) out["totals"][total[24] == 's' ? 0 : 1] = v;
    }
    if (!absl::ConsumePrefix(&line, "duet_router_overhead_seconds_bucket{stage=\"")) continue;
    const size_t q = line.find('"');
    const std::string stage(line.substr(0, q));
    const size_t le = line.find("le=\"");
    const size_t le_end = line.find('"', le + 4);
    const std::string bound(line.substr(le + 4, le_end - le - 4));
    double count = 0;
    if (!absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &count)) continue;
    out[stage][bound == "+Inf" ? 1e300 : std::stod(bound)] = count;
  }
  return out;
}

// The bucket bound under which fraction p of the observations between two
// snapshots fall, in microseconds (the histogram's resolution).
double BucketPct(const Buckets& before, const Buckets& after, double p) {
  const double total = after.rbegin()->second - (before.empty() ? 0 : before.rbegin()->second);
  if (total <= 0) return 0;
  for (const auto& [le, cum] : after) {
    auto b = before.find(le);
    if (cum - (b == before.end() ? 0 : b->second) >= p * total) return le * 1e6;
  }
  return 1e300;
}

struct Figures {
  int streams = 0;
  double own_req_p50 = 0, own_req_p99 = 0, own_tok_p50 = 0, own_tok_p99 = 0;  // the router's timestamps
  double cost_per_token_us = 0;  // the router's time on token frames / their tokens
  double wire_bytes_per_token = 0;  // a token event's HTTP chunk, as the client got it
  int failed = 0;
  std::string first_error;
  std::vector<double> request_us, token_us;
};

double Pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}


// ---------------------------------------------------------------------------
// The machine's floor for a step's tokens: a thread pinned to the router's
// core writes one SSE chunk of a token's size to each of `streams` loopback
// TCP connections, one after another (as any one-core router must), while an
// epoll reader on the client's core stamps their arrival. What no router on
// this core can beat: per token, write-return minus step start (the floor of
// "router's own") and arrival minus step start (of "end to end").
struct Floor {
  double own_p50 = 0, own_p99 = 0, e2e_p50 = 0, e2e_p99 = 0, us_per_write = 0;
};

absl::StatusOr<Floor> MeasureWriteFloor(int streams, int steps, size_t chunk_bytes, int64_t interval_ms) {
  const int last_core = std::max(0, static_cast<int>(std::thread::hardware_concurrency()) - 1);
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (listener < 0 || bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listener, 4096) != 0 || getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return absl::InternalError(absl::StrCat("floor: listen: ", std::strerror(errno)));
  }
  std::vector<int> readers(streams, -1), writers(streams, -1);
  absl::Status status;
  for (int i = 0; i < streams && status.ok(); ++i) {
    readers[i] = socket(AF_INET, SOCK_STREAM, 0);
    if (readers[i] < 0 || connect(readers[i], reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        (writers[i] = accept(listener, nullptr, nullptr)) < 0) {
      status = absl::InternalError(absl::StrCat("floor: connection ", i, ": ", std::strerror(errno)));
      break;
    }
    int one = 1;
    setsockopt(writers[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    fcntl(readers[i], F_SETFL, O_NONBLOCK);
  }
  close(listener);
  auto close_all = [&] {
    for (int fd : readers) if (fd >= 0) close(fd);
    for (int fd : writers) if (fd >= 0) close(fd);
  };
  if (!status.ok()) {
    close_all();
    return status;
  }
  // arrival[step * streams + i], written by the reader thread.
  std::vector<int64_t> arrival(static_cast<size_t>(steps) * streams, 0), written(arrival.size(), 0);
  std::vector<int64_t> step_start(steps, 0);
  std::atomic<int> received{0};
  std::thread reader([&] {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(std::min(1, last_core), &set);
    sched_setaffinity(0, sizeof(set), &set);
    int ep = epoll_create1(0);
    for (int i = 0; i < streams; ++i) {
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u32 = static_cast<uint32_t>(i);
      epoll_ctl(ep, EPOLL_CTL_ADD, readers[i], &ev);
    }
    std::vector<size_t> got(streams, 0);
    std::vector<epoll_event> events(256);
    char buf[65536];
    while (received.load() < steps * streams) {
      int n = epoll_wait(ep, events.data(), static_cast<int>(events.size()), 1000);
      const int64_t now = NowNs();
      for (int k = 0; k < n; ++k) {
        const int i = static_cast<int>(events[k].data.u32);
        for (;;) {
          ssize_t r = read(readers[i], buf, sizeof(buf));
          if (r <= 0) break;
          const size_t before = got[i] / chunk_bytes;
          got[i] += static_cast<size_t>(r);
          for (size_t c = before; c < got[i] / chunk_bytes && c < static_cast<size_t>(steps); ++c) {
            arrival[c * streams + i] = now;
            received.fetch_add(1);
          }
        }
      }
      if (n == 0) break;  // a second without data: something is wrong; report what arrived
    }
    close(ep);
  });
  {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(0, &set);
    cpu_set_t old;
    sched_getaffinity(0, sizeof(old), &old);
    sched_setaffinity(0, sizeof(set), &set);
    const std::string chunk(chunk_bytes, 'x');
    for (int step = 0; step < steps; ++step) {
      absl::SleepFor(absl::Milliseconds(interval_ms));
      step_start[step] = NowNs();
      for (int i = 0; i < streams; ++i) {
        if (write(writers[i], chunk.data(), chunk.size()) != static_cast<ssize_t>(chunk.size())) {
          status = absl::InternalError(absl::StrCat("floor: write: ", std::strerror(errno)));
        }
        written[static_cast<size_t>(step) * streams + i] = NowNs();
      }
    }
    sched_setaffinity(0, sizeof(old), &old);
  }
  reader.join();
  close_all();
  RETURN_IF_ERROR(status);
  std::vector<double> own, e2e;
  double write_ns = 0;
  for (int step = 0; step < steps; ++step) {
    write_ns += written[static_cast<size_t>(step) * streams + streams - 1] - step_start[step];
    for (int i = 0; i < streams; ++i) {
      const size_t k = static_cast<size_t>(step) * streams + i;
      own.push_back((written[k] - step_start[step]) / 1e3);
      if (arrival[k] > 0) e2e.push_back((arrival[k] - step_start[step]) / 1e3);
    }
  }
  if (e2e.size() != own.size()) return absl::InternalError("floor: not every chunk arrived");
  Floor fl;
  fl.own_p50 = Pct(own, 0.5);
  fl.own_p99 = Pct(own, 0.99);
  fl.e2e_p50 = Pct(e2e, 0.5);
  fl.e2e_p99 = Pct(e2e, 0.99);
  fl.us_per_write = write_ns / 1e3 / steps / streams;
  return fl;
}

class Bench {
 public:
  absl::Status Start(const FlagSet& f, bool per_stream) {
    static int instance = 0;
    run_dir_ = (fs::temp_directory_path() / absl::StrCat("duet-router-bench-", getpid(), "-", instance++)).string();
    fs::remove_all(run_dir_);
    fs::create_directories(run_dir_);
    ASSIGN_OR_RETURN(std::string model_dir, testing::EnsureCachedModel("tiny"));
    model_ = testing::ModelBaseName(model_dir);
    const std::string ready = run_dir_ + "/router.json";
    ASSIGN_OR_RETURN(router_, Subprocess::Start({fs::absolute("tools/duet").string(), "router", "--model", model_dir,
                                                 "--listen", "127.0.0.1:0", "--control-listen", "127.0.0.1:0",
                                                 "--max-connections", "65536", "--max-requests", "65536",
                                                 "--ready-file", ready},
                                                {}, run_dir_ + "/router.log", {0}));
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    Json r;
    while (absl::Now() < deadline) {
      std::ifstream in(ready);
      if (in) {
        r = Json::parse(in, nullptr, false);
        if (!r.is_discarded()) break;
      }
      if (router_->TryWait()) return absl::UnavailableError("the router exited; log: " + router_->log_path());
      absl::SleepFor(absl::Milliseconds(20));
    }
    if (r.is_discarded() || !r.contains("http_port")) return absl::DeadlineExceededError("router not ready");
    port_ = r["http_port"];
    // The synthetic worker: this binary, on core 1, talking over pipes.
    const std::string self = fs::read_symlink("/proc/self/exe").string();
    ASSIGN_OR_RETURN(worker_,
                     Subprocess::StartWithPipes(
                         {self, "--synthetic-worker", "--router=" + r["control"].get<std::string>(),
                          "--model-name=" + model_, absl::StrCat("--interval-ms=", f.GetInt("interval-ms")),
                          per_stream ? "--per-stream=true" : "--per-stream=false"},
                         {}, /*merge_stderr=*/false,
                         /*cpus=*/{std::min(1, static_cast<int>(std::thread::hardware_concurrency()) - 1)}));
    if (ReadLine("") != "ready") return absl::InternalError("synthetic worker did not start");
    // Registered when the router lists it.
    while (absl::Now() < deadline) {
      auto s = http::HttpCall("127.0.0.1", port_, "GET", "/stats", "", absl::Seconds(5));
      if (s.ok() && s->status == 200 && Json::parse(s->body)["workers"].size() == 1) break;
      absl::SleepFor(absl::Milliseconds(20));
    }
    // This process: the client, beside the worker.
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(std::min(1, static_cast<int>(std::thread::hardware_concurrency()) - 1), &set);
    sched_setaffinity(0, sizeof(set), &set);
    rlimit lim;
    getrlimit(RLIMIT_NOFILE, &lim);
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
    return absl::OkStatus();
  }

  ~Bench() {
    if (worker_ != nullptr) {
      worker_->WriteLine("quit").IgnoreError();
      worker_->CloseStdin();
      worker_->Wait();
    }
    if (router_) router_->Terminate(absl::Seconds(5));
  }

  // `streams` concurrent streams of `tokens` tokens, `rounds` times.
  absl::StatusOr<Figures> Measure(int streams, int tokens, int rounds) {
    Figures fig;
    fig.streams = streams;
    const auto before = ReadOverhead(port_);
    for (int round = 0; round < rounds; ++round) {
      std::vector<Stream> ss(static_cast<size_t>(streams));
      for (int i = 0; i < streams; ++i) ss[i].key = static_cast<uint32_t>(next_key_++ % 990000);
      RETURN_IF_ERROR(RunStreams(port_, model_, ss, tokens));
      // The worker's side.
      const std::string log_path = absl::StrCat(run_dir_, "/worker-", streams, "-", round, ".log");
      if (ReadLine("log " + log_path) != "logged") return absl::InternalError("synthetic worker did not write its log");
      std::map<uint32_t, int64_t> recv;
      std::map<std::pair<uint32_t, int>, int64_t> sent;
      std::ifstream in(log_path);
      std::string kind;
      while (in >> kind) {
        uint32_t key;
        if (kind == "R") {
          int64_t t;
          in >> key >> t;
          recv[key] = t;
        } else {
          int idx;
          int64_t t;
          in >> key >> idx >> t;
          sent[{key, idx}] = t;
        }
      }
      uint64_t wire = 0, chunks = 0;
      for (const Stream& s : ss) {
        wire += s.token_wire_bytes;
        chunks += s.token_chunks;
      }
      if (chunks > 0) fig.wire_bytes_per_token = static_cast<double>(wire) / chunks;
      for (const Stream& s : ss) {
        if (s.failed || static_cast<int>(s.events_ns.size()) != tokens) {
          if (fig.failed++ == 0) {
            fig.first_error = s.failed ? s.error : absl::StrCat(s.events_ns.size(), " of ", tokens, " tokens");
          }
          continue;
        }
        auto r = recv.find(s.key);
        auto t0 = sent.find({s.key, 0});
        if (r == recv.end() || t0 == sent.end()) continue;
        fig.request_us.push_back(((s.events_ns[0] - s.sent_ns) - (t0->second - r->second)) / 1e3);
        for (int j = 1; j < tokens; ++j) {
          auto t = sent.find({s.key, j});
          if (t != sent.end()) fig.token_us.push_back((s.events_ns[j] - t->second) / 1e3);
        }
      }
    }
    const auto after = ReadOverhead(port_);
    auto get = [](const std::map<std::string, Buckets>& m, const char* k) {
      auto it = m.find(k);
      return it == m.end() ? Buckets{} : it->second;
    };
    {
      Buckets b = get(before, "totals"), a = get(after, "totals");
      const double secs = a[0] - b[0], toks = a[1] - b[1];
      if (toks > 0) fig.cost_per_token_us = secs / toks * 1e6;
    }
    if (after.count("request") && after.count("token")) {
      fig.own_req_p50 = BucketPct(get(before, "request"), get(after, "request"), 0.5);
      fig.own_req_p99 = BucketPct(get(before, "request"), get(after, "request"), 0.99);
      fig.own_tok_p50 = BucketPct(get(before, "token"), get(after, "token"), 0.5);
      fig.own_tok_p99 = BucketPct(get(before, "token"), get(after, "token"), 0.99);
    }
    return fig;
  }

 private:
  // Sends `command` (none when empty), then the worker's next line; "" when it has none.
  std::string ReadLine(const std::string& command) {
    if (!command.empty() && !worker_->WriteLine(command).ok()) return "";
    return worker_->ReadLine(absl::Minutes(5)).value_or("");
  }

  std::string run_dir_, model_;
  int port_ = 0;
  std::unique_ptr<Subprocess> router_;
  std::unique_ptr<Subprocess> worker_;  // The synthetic worker, over pipes.
  uint64_t next_key_ = 0;
};

absl::Status Run(const FlagSet& f) {
  auto bench = std::make_unique<Bench>();
  Bench& b = *bench;
  std::fprintf(stderr, "[router bench] starting the router (core 0) and the synthetic worker (core 1)\n");
  RETURN_IF_ERROR(b.Start(f, /*per_stream=*/false));
  const int tokens = static_cast<int>(f.GetInt("tokens"));
  std::printf("duet router bench: router pinned to core 0; synthetic worker (real control plane, a token per %lld ms "
              "per stream, one frame per tick) and the epoll client on core 1; %d tokens per stream.\n"
              "router's own: its timestamps (duet_router_overhead_seconds: request = parse, tokenize, dispatch + "
              "first token frame to its client event; token = token frame to client event), p50/p99 as histogram "
              "bucket bounds. end to end: client's CLOCK_MONOTONIC minus the worker's (adds the loopback hops and "
              "thread wake-ups of three processes on two cores): an upper bound. work/tok: the router's time on "
              "token frames divided by their tokens (a decode step's tokens arrive in one frame and are written "
              "out one after another, so a token's latency includes those ahead of it in its frame)\n\n",
              static_cast<long long>(f.GetInt("interval-ms")), tokens);
  std::printf("%8s %9s | %-34s | %-34s | %-9s | %-17s | %-17s | %6s\n", "", "", "router's own, per request (us)",
              "router's own, per token (us)", "work/tok", "end to end, req", "end to end, tok", "");
  std::printf("%8s %9s | %8s %8s %16s | %8s %8s %16s | %9s | %8s %8s | %8s %8s | %6s\n", "streams", "requests", "p50",
              "p99", "target", "p50", "p99", "target", "us", "p50", "p99", "p50", "p99", "errors");
  int held = 0;
  for (int streams : {1, 64, 512}) {
    std::fprintf(stderr, "[router bench] %d concurrent streams\n", streams);
    const int rounds = streams == 1 ? 30 : streams == 64 ? 4 : 2;
    ASSIGN_OR_RETURN(Figures fig, b.Measure(streams, tokens, rounds));
    auto verdict = [&](double v, double limit) {
      if (streams != 512) return std::string("-");
      return absl::StrCat("<", limit, v < limit ? " ok" : " MISS", " x", absl::StrFormat("%.2f", v / limit));
    };
    std::printf("%8d %9zu | %8.1f %8.1f %16s | %8.1f %8.1f %16s | %9.2f | %8.0f %8.0f | %8.0f %8.0f | %6d\n", streams,
                fig.request_us.size(), fig.own_req_p50, fig.own_req_p99, verdict(fig.own_req_p99, 1000).c_str(),
                fig.own_tok_p50, fig.own_tok_p99, verdict(fig.own_tok_p99, 100).c_str(), fig.cost_per_token_us,
                Pct(fig.request_us, 0.5), Pct(fig.request_us, 0.99), Pct(fig.token_us, 0.5), Pct(fig.token_us, 0.99),
                fig.failed);
    if (fig.failed > 0) std::printf("  first error: %s\n", fig.first_error.c_str());
    if (fig.failed == 0 && Pct(fig.token_us, 0.99) < f.GetInt("interval-ms") * 1000.0) held = streams;
    std::fflush(stdout);
    if (streams == 512) {
      std::fprintf(stderr, "[router bench] the machine's floor: 512 loopback writes a step\n");
      const size_t chunk = static_cast<size_t>(std::lround(fig.wire_bytes_per_token > 0 ? fig.wire_bytes_per_token : 200));
      auto fl = MeasureWriteFloor(512, 20, chunk, f.GetInt("interval-ms"));
      if (fl.ok()) {
        std::printf("%8s %9s | %8s %8s %16s | %8.1f %8.1f %16s | %9.2f | %8s %8s | %8.0f %8.0f |\n", "floor", "-",
                    "-", "-", "-", fl->own_p50, fl->own_p99, "-", fl->us_per_write, "-", "-", fl->e2e_p50,
                    fl->e2e_p99);
        std::printf("  floor: one thread on the router's core writes a %zu B chunk (duet's token event as sent) to "
                    "each of 512 loopback TCP connections in turn, an epoll reader on the client's core: per token, "
                    "write returned (own; work/tok: time per write) and arrived (end to end) after the step began. "
                    "Any one-core router's p99 per token at 512 lock-step streams is at least %.0f us from these "
                    "writes alone (duet's own column stops where its writes begin). End to end p99: duet %.0f us, "
                    "x%.2f the bare writes' %.0f us (duet's also crosses the worker-router hop and the client's "
                    "HTTP parsing)\n",
                    chunk, fl->own_p99, Pct(fig.token_us, 0.99), Pct(fig.token_us, 0.99) / fl->e2e_p99, fl->e2e_p99);
      } else {
        std::printf("  floor: %s\n", std::string(fl.status().message()).c_str());
      }
      std::fflush(stdout);
    }
  }
  for (int streams = 1024; streams <= f.GetInt("max-streams"); streams *= 2) {
    std::fprintf(stderr, "[router bench] capacity: %d concurrent streams\n", streams);
    auto fig = b.Measure(streams, tokens, 1);
    // Held: every stream completes and tokens keep the worker's pace (p99
    // end to end below one token interval).
    const bool ok = fig.ok() && fig->failed == 0 && Pct(fig->token_us, 0.99) < f.GetInt("interval-ms") * 1000.0;
    if (fig.ok()) {
      std::printf("%8d %9zu | %8.1f %8.1f %16s | %8.1f %8.1f %16s | %9.2f | %8.0f %8.0f | %8.0f %8.0f | %6d\n", streams,
                  fig->request_us.size(), fig->own_req_p50, fig->own_req_p99, "-", fig->own_tok_p50, fig->own_tok_p99,
                  "-", fig->cost_per_token_us, Pct(fig->request_us, 0.5), Pct(fig->request_us, 0.99),
                  Pct(fig->token_us, 0.5), Pct(fig->token_us, 0.99), fig->failed);
    } else {
      std::printf("%8d  (%s)\n", streams, std::string(fig.status().message()).c_str());
    }
    std::fflush(stdout);
    if (!ok) break;
    held = streams;
  }
  // The same at 512 streams with each stream on its own phase: a frame holds
  // the tokens that fall due together, not a whole step's.
  bench.reset();
  {
    std::fprintf(stderr, "[router bench] per-stream pacing: 512 concurrent streams\n");
    Bench staggered;
    RETURN_IF_ERROR(staggered.Start(f, /*per_stream=*/true));
    ASSIGN_OR_RETURN(Figures fig, staggered.Measure(512, tokens, 2));
    auto verdict = [](double v, double limit) {
      return absl::StrCat("<", limit, v < limit ? " ok" : " MISS", " x", absl::StrFormat("%.2f", v / limit));
    };
    std::printf("%8s %9zu | %8.1f %8.1f %16s | %8.1f %8.1f %16s | %9.2f | %8.0f %8.0f | %8.0f %8.0f | %6d\n",
                "512 (*)", fig.request_us.size(), fig.own_req_p50, fig.own_req_p99,
                verdict(fig.own_req_p99, 1000).c_str(), fig.own_tok_p50, fig.own_tok_p99,
                verdict(fig.own_tok_p99, 100).c_str(), fig.cost_per_token_us, Pct(fig.request_us, 0.5),
                Pct(fig.request_us, 0.99), Pct(fig.token_us, 0.5), Pct(fig.token_us, 0.99), fig.failed);
    std::printf("(*) each stream paced on its own phase (tokens fall due at different times), instead of one frame "
                "per %lld ms step holding every stream's token\n",
                static_cast<long long>(f.GetInt("interval-ms")));
  }
  std::printf("\nmost concurrent streams held on one router core (all complete, p99 end-to-end per token under "
              "the %lld ms token interval): %d "
              "(tried up to %lld)\n",
              static_cast<long long>(f.GetInt("interval-ms")), held, static_cast<long long>(f.GetInt("max-streams")));
  return absl::OkStatus();
}

}  // namespace
}  // namespace duet::bench

int main(int argc, char** argv) {
  duet::FlagSet f("router", "What the router adds to each request and each streamed token, against a synthetic worker.");
  f.Int("tokens", 32, "tokens per stream");
  f.Int("interval-ms", 20, "the synthetic worker's time per token");
  f.Int("max-streams", 8192, "the largest stream count the capacity search tries (doubling from 1024)");
  f.Bool("synthetic-worker", "internal: run as the synthetic worker");
  f.Bool("per-stream", "internal: the synthetic worker paces each stream on its own phase");
  f.String("router", "", "internal: router control address");
  f.String("model-name", "", "internal: served model name");
  f.Int("token", 300, "internal: the token id the synthetic worker emits");
  if (std::optional<int> exit = duet::ParseFlagsOrExit(f, argc, argv)) return *exit;
  if (f.GetBool("synthetic-worker")) return duet::bench::RunSyntheticWorker(f);
  if (absl::Status s = duet::bench::Run(f); !s.ok()) {
    std::fprintf(stderr, "router bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
