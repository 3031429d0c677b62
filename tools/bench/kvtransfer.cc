// duet's UCX KV pull (kvtransfer/ucx) beside ucx_perftest's UCP get on the
// same transports, measured in the same run (STYLE rule 9).
//
//   bazel run -c opt //tools/bench:kvtransfer [-- --tls tcp --large-mib 1024 --spin-us 50]
//
// The bench re-runs its own binary as the exporter (--exporter): a process
// with a registered pool and epoch table, like a prefill worker. This process
// is the importer (decode): it pulls into its own registered pool through
// NewUcxTransport, for the `bench` model's KV layout (12 layers, 4 KV heads,
// block_size 16, head_dim 64, F32: 393,216 bytes a block, 32,768 a layer):
//   (a) whole blocks, 1..256 per pull, at random non-adjacent ids (one
//       segment per block, as in real use) and at consecutive ids (merged);
//   (b) one layer of each block (layer-wise pull);
//   (c) one segment of --large-mib / 2 and --large-mib, beyond the LLC;
//   and latency: 8 B, a layer and a block, with and without the epoch reads,
//   also with spin_window --alt-spin-us on both sides;
//   (d) the pulls of (a) at random ids again with a BF16 KV layout (the same
//       tokens in half the bytes, --kv-dtype bf16), beside (a)'s times.
// Every pull carries its blocks' epochs (the lease check of real pulls).
//
// On one host duet uses its same-host lane (process_vm_readv, see
// ucx_transport.h) unless --tls / UCX_TLS leaves out intra-node transports
// (--tls tcp). Its references are then UCX's transport of the same mechanism,
// ucx_perftest -t get -D zcopy -x cma -d memory -O 1, as a server/client pair
// and as one process (-l); the shm column stays for information. duet's
// importer copies pulls of 1 MiB or more with its same_host_copy_threads
// (default 2; --copy-threads 1 times the waiting thread alone, like the
// single-threaded references).
// On UCX's lanes (--tls tcp), all ucx_perftest -t ucp_get -s <bytes of the pull> -O 1:
//   pair  server and client processes on loopback, -e and duet's UCX_TLS:
//         duet's endpoints use UCP_ERR_HANDLING_MODE_PEER, so both get the
//         same lanes (TCP on UCX 1.13, even on one host). Its server
//         progresses only between 1 ms polls of its control socket, which
//         caps it near one get per millisecond: weak below a few MiB.
//   -l    one process reading from itself over the same lanes, responder
//         always progressed: UCX's own cost of a get on these lanes.
//   shm   the pair on the default transports without -e (shared memory),
//         for information: what a same-host mode could reach.
// The lanes each side used are read from UCX_LOG_LEVEL=info ("ep_cfg") of
// ucx_perftest and of a probe process that pulls once through duet.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/flags.h"
#include "base/huge_buffer.h"
#include "base/netns.h"
#include "base/status_macros.h"
#include "base/subprocess.h"
#include "base/thread_pool.h"
#include "kvtransfer/layout.h"
#include "kvtransfer/transport.h"
#include "kvtransfer/ucx/ucx_transport.h"
#include "tools/bench/timing.h"


namespace duet::bench {
namespace {

using kvtransfer::KvTransport;
using kvtransfer::PeerId;
using kvtransfer::PullRequest;
using kvtransfer::RegionId;
using kvtransfer::Segment;
using kvtransfer::ShardLayout;
using kvtransfer::TransferResult;
using kvtransfer::TransferState;

// The `bench` model (engine/testing/model_maker): 12 layers, 4 KV heads of
// 64, F32 KV (dtype_bytes 2: --kv-dtype bf16 or f16).
ShardLayout BenchLayout(int64_t dtype_bytes = 4) {
  return ShardLayout{.num_layers_total = 12, .layer_begin = 0, .layer_end = 12,
                     .num_kv_heads_total = 4, .head_begin = 0, .head_end = 4,
                     .block_size = 16, .head_dim = 64, .dtype_bytes = dtype_bytes};
}

// Every 8-byte word of the exporter's pool holds its own offset ^ kWordKey,
// so any destination word says which source word it came from.
constexpr uint64_t kWordKey = 0x6475657400000000ull;  // "duet"

void Progress(const std::string& line) {
  std::fprintf(stderr, "[kvtransfer bench] %s\n", line.c_str());
  std::fflush(stderr);
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Pools as workers allocate them (engine::BlockPool): huge-page backed,
// every page faulted in before timing.
HugeBuffer AllocTouched(uint64_t bytes) { return HugeBuffer(bytes, /*touch=*/true); }

// ---------------------------------------------------------------------------
// Child processes: the exporter, the lane probe and ucx_perftest.


std::string SelfPath() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("/proc/self/exe");
}

// The "ep_cfg[i]: ..." lane descriptions UCX logs at UCX_LOG_LEVEL=info.
// How duet's lanes read when its transport used the same-host lane.
constexpr absl::string_view kSameHostLane = "same-host lane (process_vm_readv)";

std::string EndpointConfigs(const std::string& log) {
  std::set<std::string> seen;
  std::vector<std::string> out;
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    if (line.find(kSameHostLane) != absl::string_view::npos && seen.insert("same-host").second) {
      out.push_back(std::string(kSameHostLane));
    }
    size_t at = line.find("ep_cfg[");
    if (at == absl::string_view::npos) continue;
    size_t colon = line.find(": ", at);
    if (colon == absl::string_view::npos) continue;
    std::string lanes(line.substr(colon + 2));
    while (!lanes.empty() && (lanes.back() == ' ' || lanes.back() == '\r')) lanes.pop_back();
    if (seen.insert(lanes).second) out.push_back(lanes);
  }
  return out.empty() ? "(not logged)" : absl::StrJoin(out, " | ");
}

// ---------------------------------------------------------------------------
// ucx_perftest as a loopback server/client pair.

struct PerftestResult {
  bool ok = false;
  std::string error;
  double gb_per_s = 0;     // overall bandwidth
  double latency_us = 0;   // typical (median) time per operation
  std::string lanes;       // the client's endpoint configuration
};

absl::StatusOr<int> FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    close(fd);
    return absl::InternalError(absl::StrCat("bind: ", std::strerror(errno)));
  }
  int port = ntohs(a.sin_port);
  close(fd);
  return port;
}

// Whether process `pid` (in its network namespace) has something listening
// on TCP `port` (ucx_perftest's server prints its readiness into a pipe that
// stdio buffers, so look at the kernel's table).
bool Listening(int port, pid_t pid) {
  char hex[8];
  std::snprintf(hex, sizeof(hex), "%04X", port);
  for (const char* table : {"tcp", "tcp6"}) {
    std::ifstream f(absl::StrCat("/proc/", pid, "/net/", table));
    std::string line;
    std::getline(f, line);  // header
    while (std::getline(f, line)) {
      std::istringstream in(line);
      std::string slot, local, remote, state;
      in >> slot >> local >> remote >> state;
      if (state == "0A" && local.size() > 5 && local.substr(local.size() - 4) == hex) return true;
    }
  }
  return false;
}

enum class PerftestMode {
  kPair,      // server and client processes, -e (duet's error handling), duet's UCX_TLS
  kLoopback,  // -l: one process reads from itself, -e, duet's UCX_TLS
  kShm,       // server and client, default transports, no error handling
  kCmaPair,   // UCT get zcopy on cma (process_vm_readv), server and client
  kCmaLoopback,  // the same, one process reading itself
};

bool IsCma(PerftestMode mode) { return mode == PerftestMode::kCmaPair || mode == PerftestMode::kCmaLoopback; }

// One ucx_perftest -t ucp_get run of `size` bytes per get, one get
// outstanding (-O 1): what one pull of that size asks of UCX. With `net`,
// the server runs in the exporter's namespace and the client (in this
// thread's, the importer's) reaches it across the veth links.
PerftestResult RunPerftest(uint64_t size, int iters, PerftestMode mode, const std::string& tls, const Netns* net) {
  PerftestResult result;
  // Both sides see duet's UCX_TLS, or for kShm the default transports.
  // Shared memory and CMA runs take UCX's own choice: UCX_TLS removed.
  std::vector<std::string> env = {mode == PerftestMode::kShm || IsCma(mode) ? "UCX_TLS"
                                  : tls.empty()                             ? ""
                                                                            : "UCX_TLS=" + tls};
  if (env[0].empty()) env.clear();
  std::vector<std::string> test = {"-t", "ucp_get", "-s", std::to_string(size), "-n", std::to_string(iters),
                                   "-w", std::to_string(std::max(1, iters / 10)), "-O", "1"};
  if (IsCma(mode)) {
    test[1] = "get";
    test.insert(test.begin() + 2, {"-D", "zcopy", "-x", "cma", "-d", "memory"});
  } else if (mode != PerftestMode::kShm) {
    test.push_back("-e");
  }
  for (int attempt = 0; attempt < 2 && !result.ok; ++attempt) {
    std::unique_ptr<Subprocess> server;
    std::vector<std::string> argv = {"ucx_perftest"};
    if (mode == PerftestMode::kLoopback || mode == PerftestMode::kCmaLoopback) {
      argv.push_back("-l");
    } else {
      auto port = FreePort();
      if (!port.ok()) {
        result.error = port.status().ToString();
        return result;
      }
      const std::string p = std::to_string(*port);
      std::vector<std::string> server_argv = {"ucx_perftest", "-p", p};
      if (net != nullptr) server_argv = net->Wrap("exporter", server_argv);
      auto started = Subprocess::StartWithPipes(server_argv, env, /*merge_stderr=*/true);
      if (!started.ok()) {
        result.error = started.status().ToString();
        return result;
      }
      server = std::move(*started);
      const absl::Time until = absl::Now() + absl::Seconds(10);
      while (!Listening(*port, server->pid()) && absl::Now() < until) absl::SleepFor(absl::Milliseconds(2));
      argv.insert(argv.end(), {net != nullptr ? net->address("exporter") : "127.0.0.1", "-p", p});
    }
    argv.insert(argv.end(), test.begin(), test.end());
    std::vector<std::string> client_env = env;
    client_env.push_back("UCX_LOG_LEVEL=info");
    auto client = Subprocess::StartWithPipes(argv, client_env, /*merge_stderr=*/true);
    if (!client.ok()) {
      result.error = client.status().ToString();
      return result;
    }
    const std::string out = (*client)->ReadToEnd(absl::Seconds(120)).value_or("");
    (*client)->WaitFor(absl::Seconds(5)).IgnoreError();
    if (server != nullptr) {
      server->ReadToEnd(absl::Seconds(5)).IgnoreError();
      server->WaitFor(absl::Seconds(5)).IgnoreError();
    }
    result.lanes = IsCma(mode) ? "get_zcopy(cma/memory)" : EndpointConfigs(out);
    for (absl::string_view line : absl::StrSplit(out, '\n')) {
      if (!absl::StartsWith(line, "Final:")) continue;
      std::vector<std::string> w = absl::StrSplit(line.substr(6), ' ', absl::SkipWhitespace());
      double lat = 0, mb = 0;
      // iterations, latency typical/average/overall (us), bandwidth average/overall (MiB/s), ...
      if (w.size() >= 6 && absl::SimpleAtod(w[1], &lat) && absl::SimpleAtod(w[5], &mb)) {
        result.ok = true;
        result.latency_us = lat;
        result.gb_per_s = mb * 1048576.0 / 1e9;
      }
    }
    if (!result.ok) {
      std::string tail = out.size() > 300 ? out.substr(out.size() - 300) : out;
      result.error = absl::StrCat("no Final line: ", tail);
    }
  }
  return result;
}

// ---------------------------------------------------------------------------
// The exporter process (--exporter) and the lane probe (--probe).

// UCX_TLS for every process of the run: --tls, or tcp across the veth.
std::string Tls(const FlagSet& f) { return f.GetBool("veth") ? "tcp" : f.GetString("tls"); }

kvtransfer::UcxTransportOptions TransportOptions(const FlagSet& f) {
  kvtransfer::UcxTransportOptions o;
  if (!Tls(f).empty()) o.ucx_config.push_back({"TLS", Tls(f)});
  o.busy_poll = f.GetBool("busy-poll");
  if (f.GetInt("spin-us") >= 0) o.spin_window = absl::Microseconds(f.GetInt("spin-us"));
  if (f.GetInt("copy-threads") > 0) o.same_host_copy_threads = static_cast<int>(f.GetInt("copy-threads"));
  return o;
}

// Registers a pool of --pool-blocks blocks (every word its offset ^ kWordKey)
// with an epoch table, prints "address <hex>", "region <hex>", "ready", then
// waits for "quit" (or EOF) on stdin.
int RunExporter(const FlagSet& f) {
  const uint64_t block_bytes = kvtransfer::ShardBlockBytes(BenchLayout());
  const int64_t blocks = f.GetInt("pool-blocks");
  const uint64_t bytes = block_bytes * static_cast<uint64_t>(blocks);
  kvtransfer::UcxTransportOptions o = TransportOptions(f);
  o.busy_poll = false;  // an exporter never spins: it would steal the importer's core
  auto t = kvtransfer::NewUcxTransport(o);
  if (!t.ok()) {
    std::cerr << "exporter: " << t.status() << "\n";
    return 1;
  }
  HugeBuffer buffer = AllocTouched(bytes);
  auto* pool = buffer.As<uint64_t>();
  for (uint64_t w = 0; w < bytes / 8; ++w) pool[w] = (w * 8) ^ kWordKey;
  auto region = (*t)->RegisterRegion(pool, bytes, blocks);
  if (!region.ok()) {
    std::cerr << "exporter: " << region.status() << "\n";
    return 1;
  }
  auto exported = (*t)->ExportRegion(*region);
  std::printf("address %s\nregion %s\nready\n", absl::BytesToHexString((*t)->address()).c_str(),
              absl::BytesToHexString(*exported).c_str());
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line) && line != "quit") {
  }
  t->reset();
  return 0;
}

// Connects to the exporter, pulls one block with its epoch and exits: run
// with UCX_LOG_LEVEL=info, its output names the lanes UCX chose for duet's
// endpoint (same options, same peer error handling).
int RunProbe(const FlagSet& f) {
  auto t = kvtransfer::NewUcxTransport(TransportOptions(f));
  if (!t.ok()) {
    std::cout << "probe: " << t.status() << std::endl;
    return 1;
  }
  const uint64_t block_bytes = kvtransfer::ShardBlockBytes(BenchLayout());
  HugeBuffer buffer = AllocTouched(block_bytes);
  uint8_t* dst = buffer.As<uint8_t>();
  auto region = (*t)->RegisterRegion(dst, block_bytes, 0);
  auto peer = (*t)->Connect(absl::HexStringToBytes(f.GetString("probe-address")));
  if (!region.ok() || !peer.ok()) {
    std::cout << "probe: cannot register or connect" << std::endl;
    return 1;
  }
  PullRequest r;
  r.peer = *peer;
  r.remote_region = absl::HexStringToBytes(f.GetString("probe-region"));
  r.local_region = *region;
  r.segments = {Segment{0, 0, block_bytes}};
  r.block_epochs = {{0, 0}};
  auto id = (*t)->Pull(r);
  TransferResult res = id.ok() ? (*t)->Wait(*id) : TransferResult{};
  std::cout << "probe " << kvtransfer::TransferStateName(res.state) << std::endl;
  t->reset();
  return res.state == TransferState::kDone ? 0 : 1;
}

// ---------------------------------------------------------------------------
// The importer: this process.

struct Pull {
  std::string group;
  std::string name;
  int64_t blocks = 0;
  std::vector<Segment> segments;
  std::vector<std::pair<int32_t, uint64_t>> block_epochs;
  uint64_t bytes() const {
    uint64_t b = 0;
    for (const Segment& s : segments) b += s.length;
    return b;
  }
};

struct Measured {
  double median_s = 0;
  int reps = 0;
};

// n distinct block ids below `limit`, sorted; `even` picks only even ids so
// that no two are adjacent (every block its own segment).
std::vector<int32_t> RandomIds(std::mt19937_64& rng, int64_t n, int64_t limit, bool even) {
  std::vector<int32_t> all;
  for (int64_t b = 0; b < limit; b += even ? 2 : 1) all.push_back(static_cast<int32_t>(b));
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(static_cast<size_t>(n));
  return all;
}

absl::StatusOr<Pull> PlannedPull(const std::string& group, const std::string& name,
                                 const std::vector<int32_t>& src, const std::vector<int32_t>& dst,
                                 std::optional<std::pair<int64_t, int64_t>> layers,
                                 int64_t dtype_bytes = 4) {
  const ShardLayout l = BenchLayout(dtype_bytes);
  ASSIGN_OR_RETURN(auto plans, kvtransfer::PlanTransfer({l}, {l}, {src}, {dst}, layers));
  if (plans.size() != 1) return absl::InternalError("expected one transfer plan");
  Pull p{group, name, static_cast<int64_t>(src.size()), std::move(plans[0].segments), {}};
  for (int32_t b : src) p.block_epochs.push_back({b, 0});
  return p;
}

// Checks the destination words of every segment (all of them up to 64 MiB,
// then every 509th) against the exporter's offset pattern.
absl::Status CheckData(const uint8_t* dst, const std::vector<Segment>& segments) {
  for (const Segment& s : segments) {
    const uint64_t words = s.length / 8;
    const uint64_t step = s.length > (64ull << 20) ? 509 : 1;
    for (uint64_t w = 0; w < words; w += step) {
      uint64_t got;
      std::memcpy(&got, dst + s.dst_offset + w * 8, 8);
      const uint64_t want = (s.src_offset + w * 8) ^ kWordKey;
      if (got != want) {
        return absl::DataLossError(absl::StrCat("segment src ", s.src_offset, " dst ", s.dst_offset,
                                                ": word ", w, " is ", got, ", want ", want));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Measured> Measure(KvTransport& t, PeerId peer, const std::string& remote,
                                 RegionId local, const uint8_t* local_base, const Pull& pull,
                                 int min_reps, double min_seconds) {
  PullRequest r;
  r.peer = peer;
  r.remote_region = remote;
  r.local_region = local;
  r.segments = pull.segments;
  r.block_epochs = pull.block_epochs;
  r.timeout = absl::Seconds(30);
  auto one = [&]() -> absl::StatusOr<double> {
    const auto start = Clock::now();
    ASSIGN_OR_RETURN(kvtransfer::TransferId id, t.Pull(r));
    TransferResult res = t.Wait(id);
    const double s = SecondsSince(start);
    if (res.state != TransferState::kDone || res.bytes != pull.bytes()) {
      return absl::InternalError(absl::StrCat(pull.group, " ", pull.name, ": pull ended ",
                                              kvtransfer::TransferStateName(res.state), " after ",
                                              res.bytes, " bytes: ", res.detail));
    }
    return s;
  };
  RETURN_IF_ERROR(one().status());  // warm-up, then check what it wrote
  RETURN_IF_ERROR(CheckData(local_base, pull.segments));
  std::vector<double> times;
  const auto start = Clock::now();
  while (times.size() < 1000) {
    const double elapsed = SecondsSince(start);
    if (static_cast<int>(times.size()) >= min_reps && elapsed >= min_seconds) break;
    if (times.size() >= 3 && elapsed >= 4 * min_seconds + 2.0) break;  // slow rows: a few reps
    ASSIGN_OR_RETURN(double s, one());
    times.push_back(s);
  }
  return Measured{Median(times), static_cast<int>(times.size())};
}

std::string Bytes(uint64_t b) {
  if (b >= (1ull << 20) && b % (1ull << 20) == 0) return absl::StrCat(b >> 20, " MiB");
  std::string s = std::to_string(b);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s + " B";
}

std::string LastLevelCache() {
  std::string best;
  for (int i = 0; i < 8; ++i) {
    std::ifstream f(absl::StrCat("/sys/devices/system/cpu/cpu0/cache/index", i, "/size"));
    std::string s;
    if (f >> s) best = s;
  }
  return best.empty() ? "unknown" : best;
}

// Runs `pulls` against a fresh exporter process of `pool_blocks` blocks, both
// transports with this spin window (-1: the transport's default), the
// exporter in `net`'s exporter namespace when given. `lanes`, when given,
// gets the lanes UCX chose for duet's endpoint.
absl::StatusOr<std::vector<Measured>> MeasurePulls(const FlagSet& f, const std::vector<Pull>& pulls,
                                                   int64_t pool_blocks, int64_t spin_us,
                                                   std::string* lanes, const Netns* net) {
  const uint64_t pool_bytes = kvtransfer::ShardBlockBytes(BenchLayout()) * static_cast<uint64_t>(pool_blocks);
  const std::string tls = Tls(f);
  std::vector<std::string> common;
  if (!tls.empty()) common.push_back("--tls=" + tls);
  common.push_back(absl::StrCat("--spin-us=", spin_us));
  std::vector<std::string> argv = {SelfPath(), "--exporter", absl::StrCat("--pool-blocks=", pool_blocks)};
  argv.insert(argv.end(), common.begin(), common.end());
  if (net != nullptr) argv = net->Wrap("exporter", argv);
  ASSIGN_OR_RETURN(auto exporter, Subprocess::StartWithPipes(argv, {}, /*merge_stderr=*/false));
  std::string address, remote;
  for (const char* key : {"address", "region", "ready"}) {
    ASSIGN_OR_RETURN(std::string line, exporter->ReadLine(absl::Seconds(60)));
    if (!absl::StartsWith(line, key)) {
      return absl::InternalError(absl::StrCat("exporter: expected ", key, ", got: ", line));
    }
    if (std::string(key) == "address") address = absl::HexStringToBytes(line.substr(8));
    if (std::string(key) == "region") remote = absl::HexStringToBytes(line.substr(7));
  }
  if (lanes != nullptr) {
    Progress("lane probe: duet's endpoint under UCX_LOG_LEVEL=info");
    std::vector<std::string> pargv = {SelfPath(), "--probe",
                                      "--probe-address=" + absl::BytesToHexString(address),
                                      "--probe-region=" + absl::BytesToHexString(remote)};
    pargv.insert(pargv.end(), common.begin(), common.end());
    *lanes = "(probe failed)";
    auto probe = Subprocess::StartWithPipes(pargv, {"UCX_LOG_LEVEL=info"}, /*merge_stderr=*/true);
    if (probe.ok()) {
      const std::string out = (*probe)->ReadToEnd(absl::Seconds(30)).value_or("");
      (*probe)->WaitFor(absl::Seconds(5)).IgnoreError();
      *lanes = EndpointConfigs(out);
      if (out.find("probe done") == std::string::npos) *lanes += " (probe pull failed)";
    }
  }

  kvtransfer::UcxTransportOptions options = TransportOptions(f);
  if (spin_us >= 0) options.spin_window = absl::Microseconds(spin_us);
  ASSIGN_OR_RETURN(kvtransfer::KvTransportPtr transport, kvtransfer::NewUcxTransport(options));
  KvTransport& t = *transport;
  HugeBuffer buffer = AllocTouched(pool_bytes);
  uint8_t* dst = buffer.As<uint8_t>();
  ASSIGN_OR_RETURN(RegionId local, t.RegisterRegion(dst, pool_bytes, 0));
  ASSIGN_OR_RETURN(PeerId peer, t.Connect(address));
  const std::string only = f.GetString("only");
  std::vector<Measured> out(pulls.size());
  for (size_t i = 0; i < pulls.size(); ++i) {
    const std::string name = absl::StrCat(pulls[i].group, " ", pulls[i].name);
    if (!only.empty() && name.find(only) == std::string::npos) continue;
    Progress(absl::StrCat("duet", spin_us > 0 ? absl::StrCat(" (spin ", spin_us, " us)") : "", ": ", name,
                          " (", Bytes(pulls[i].bytes()), ", ", pulls[i].segments.size(), " segments)"));
    ASSIGN_OR_RETURN(out[i], Measure(t, peer, remote, local, dst, pulls[i],
                                     static_cast<int>(f.GetInt("reps")), f.GetDouble("min-seconds")));
  }
  t.Disconnect(peer);
  transport.reset();
  exporter->WriteLine("quit").IgnoreError();
  exporter->WaitFor(absl::Seconds(10)).IgnoreError();
  return out;
}

std::string Fixed(double v, int decimals) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

absl::Status Run(const FlagSet& f) {
  const ShardLayout layout = BenchLayout();
  const uint64_t block_bytes = kvtransfer::ShardBlockBytes(layout);
  const uint64_t large = static_cast<uint64_t>(f.GetInt("large-mib")) << 20;
  if (large < (2ull << 20)) return absl::InvalidArgumentError("--large-mib must be >= 2");
  const std::vector<int64_t> counts = {1, 4, 16, 64, 256};
  // Room for 256 blocks at even ids, and for the largest single segment.
  const int64_t pool_blocks = std::max<int64_t>(
      2 * counts.back() + 2, static_cast<int64_t>((large + block_bytes - 1) / block_bytes));
  // Across the veth: the exporter and ucx_perftest's server in one
  // namespace, this process (the importer, the perftest client) in another,
  // UCX on TCP over their eth0.
  std::unique_ptr<Netns> net;
  if (f.GetBool("veth")) {
    if (!f.GetString("tls").empty() && f.GetString("tls") != "tcp") {
      return absl::InvalidArgumentError("--veth runs UCX over TCP only; leave --tls out or give tcp");
    }
    ASSIGN_OR_RETURN(net, Netns::Create({"exporter", "importer"}));
    RETURN_IF_ERROR(net->Enter("importer"));
    setenv("UCX_NET_DEVICES", "eth0", 1);  // this process and every child
    Progress(absl::StrCat("network namespaces ", net->Name("exporter"), " (", net->address("exporter"), ") and ",
                          net->Name("importer"), " (", net->address("importer"), "), veth links to a bridge"));
  }
  const std::string tls = Tls(f);
  const char* env_tls = std::getenv("UCX_TLS");
  const std::string tls_note = !tls.empty() ? tls : env_tls != nullptr ? env_tls : "(default)";
  const int64_t spin_us = f.GetInt("spin-us");
  const int64_t alt_spin_us = f.GetInt("alt-spin-us");
  const int64_t default_spin_us =
      absl::ToInt64Microseconds(kvtransfer::UcxTransportOptions{}.spin_window);
  const int64_t main_spin_us = spin_us >= 0 ? spin_us : default_spin_us;

  // The pulls, in table order.
  std::mt19937_64 rng(20240611);
  std::vector<Pull> pulls;
  for (int64_t n : counts) {
    ASSIGN_OR_RETURN(Pull p, PlannedPull("blocks, random ids", absl::StrCat(n),
                                         RandomIds(rng, n, pool_blocks, true),
                                         RandomIds(rng, n, pool_blocks, false), std::nullopt));
    pulls.push_back(std::move(p));
  }
  for (int64_t n : counts) {
    std::vector<int32_t> src(n), dst_ids(n);
    for (int64_t i = 0; i < n; ++i) {
      src[i] = static_cast<int32_t>(3 + i);
      dst_ids[i] = static_cast<int32_t>(pool_blocks - n + i);
    }
    ASSIGN_OR_RETURN(Pull p, PlannedPull("blocks, consecutive ids", absl::StrCat(n), src, dst_ids,
                                         std::nullopt));
    pulls.push_back(std::move(p));
  }
  for (int64_t n : counts) {
    ASSIGN_OR_RETURN(Pull p, PlannedPull("layer 5 of each block", absl::StrCat(n),
                                         RandomIds(rng, n, pool_blocks, true),
                                         RandomIds(rng, n, pool_blocks, false),
                                         std::make_pair(int64_t{5}, int64_t{6})));
    pulls.push_back(std::move(p));
  }
  for (uint64_t bytes : {large / 2, large}) {
    Pull p{"one segment, beyond LLC", Bytes(bytes),
           static_cast<int64_t>((bytes + block_bytes - 1) / block_bytes), {Segment{0, 0, bytes}}, {}};
    for (int32_t b = 0; b < p.blocks; ++b) p.block_epochs.push_back({b, 0});
    pulls.push_back(std::move(p));
  }
  // Latency, measured back to back: pulls of 8 B, one layer slice and one
  // block from block 1, with the epoch reads (three round trips) and
  // without them (one).
  std::vector<Pull> lat;
  for (uint64_t size : {uint64_t{8}, layout.LayerBytes(), block_bytes}) {
    for (bool epochs : {true, false}) {
      Pull p{"latency", absl::StrCat(Bytes(size), ", ", epochs ? "epoch check (3 phases)" : "no epoch check (1 phase)"),
             1, {Segment{block_bytes, 0, size}}, {}};
      if (epochs) p.block_epochs = {{1, 0}};
      lat.push_back(std::move(p));
    }
  }

  // The random-id block pulls again with a BF16 KV cache: the same tokens
  // in blocks of half the bytes (the exporter's pool holds both layouts'
  // ids: a BF16 block id below pool_blocks lies in its first half).
  std::vector<Pull> half;
  for (int64_t n : counts) {
    ASSIGN_OR_RETURN(Pull p, PlannedPull("blocks, random ids, BF16 KV", absl::StrCat(n),
                                         RandomIds(rng, n, pool_blocks, true),
                                         RandomIds(rng, n, pool_blocks, false), std::nullopt, 2));
    half.push_back(std::move(p));
  }

  Progress(absl::StrCat("exporter: ", pool_blocks, " blocks of ", block_bytes, " B (",
                        (block_bytes * pool_blocks) >> 20, " MiB), UCX_TLS ", tls_note));
  std::vector<Pull> main_pulls = pulls;
  main_pulls.insert(main_pulls.end(), lat.begin(), lat.end());
  main_pulls.insert(main_pulls.end(), half.begin(), half.end());
  std::string duet_lanes;
  ASSIGN_OR_RETURN(std::vector<Measured> duet,
                   MeasurePulls(f, main_pulls, pool_blocks, spin_us, &duet_lanes, net.get()));
  // duet on its same-host lane is compared with UCX's transport of the same
  // mechanism, UCT's cma get (UCP 1.13 never puts RMA on cma); spinning
  // only matters to UCX's lanes.
  const bool same_host = duet_lanes.find(std::string(kSameHostLane)) != std::string::npos;
  std::vector<Measured> alt(lat.size());
  if (alt_spin_us > 0 && !same_host) {
    ASSIGN_OR_RETURN(alt, MeasurePulls(f, lat, 4, alt_spin_us, nullptr, net.get()));
  }

  if (f.GetBool("no-perftest") || !f.GetString("only").empty()) {
    for (size_t i = 0; i < main_pulls.size(); ++i) {
      if (duet[i].reps == 0) continue;
      const Pull& p = main_pulls[i];
      std::printf("%-26s %-36s %14s %4zu segs: %8.3f GB/s, median %9.1f us of %d", p.group.c_str(),
                  p.name.c_str(), Bytes(p.bytes()).c_str(), p.segments.size(), p.bytes() / duet[i].median_s * 1e-9,
                  duet[i].median_s * 1e6, duet[i].reps);
      const size_t li = i - pulls.size();
      if (i >= pulls.size() && li < lat.size() && alt[li].reps > 0) std::printf("; spin %lld us: %9.1f us", static_cast<long long>(alt_spin_us), alt[li].median_s * 1e6);
      std::printf("\n");
    }
    return absl::OkStatus();
  }

  // ucx_perftest for each distinct size: the pair and the one-process
  // loopback on duet's transports, and the pair on shared memory.
  std::vector<uint64_t> sizes;
  for (size_t i = 0; i < pulls.size() + lat.size(); ++i) sizes.push_back(main_pulls[i].bytes());  // not `half`
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  struct Ref {
    PerftestResult pair, loopback, shm;
  };
  std::map<uint64_t, Ref> ref;
  for (uint64_t s : sizes) {
    const int iters = static_cast<int>(std::clamp<uint64_t>((128ull << 20) / s, 3, 300));
    Ref& r = ref[s];
    if (net != nullptr) {
      // Only the pair crosses the veth: one process reading itself, or
      // shared memory, would not.
      Progress(absl::StrCat("ucx_perftest -t ucp_get -s ", s, " -n ", iters, " -O 1 -e: pair across the veth"));
      r.pair = RunPerftest(s, iters, PerftestMode::kPair, tls, net.get());
      continue;
    }
    if (same_host) {
      Progress(absl::StrCat("ucx_perftest -t get -D zcopy -x cma -d memory -s ", s, " -n ", iters,
                            " -O 1: pair, -l; ucx_perftest -t ucp_get pair shm"));
      r.pair = RunPerftest(s, iters, PerftestMode::kCmaPair, tls, nullptr);
      r.loopback = RunPerftest(s, iters, PerftestMode::kCmaLoopback, tls, nullptr);
    } else {
      Progress(absl::StrCat("ucx_perftest -t ucp_get -s ", s, " -n ", iters, " -O 1: pair -e, -l -e, pair shm"));
      r.pair = RunPerftest(s, iters, PerftestMode::kPair, tls, nullptr);
      r.loopback = RunPerftest(s, iters, PerftestMode::kLoopback, tls, nullptr);
    }
    r.shm = RunPerftest(s, iters, PerftestMode::kShm, tls, nullptr);
  }
  std::string pair_lanes, loopback_lanes, shm_lanes;
  for (const auto& [size, r] : ref) {
    if (r.pair.ok && pair_lanes.empty()) pair_lanes = r.pair.lanes;
    if (r.loopback.ok && loopback_lanes.empty()) loopback_lanes = r.loopback.lanes;
    if (r.shm.ok && shm_lanes.empty()) shm_lanes = r.shm.lanes;
  }
  if (net != nullptr) loopback_lanes = shm_lanes = "(not run: it would not cross the veth)";

  std::printf("duet kvtransfer bench: UCX pulls of the bench model's KV (12 layers x 4 KV heads x 16 slots x 64 "
              "x F32: %s a block, %s a layer) from an exporter process %s; LLC %s\n",
              Bytes(block_bytes).c_str(), Bytes(layout.LayerBytes()).c_str(),
              net != nullptr ? "in another network namespace, across veth links and a bridge (--veth; only the "
                               "'pair' reference crosses them)"
                             : "on this host",
              LastLevelCache().c_str());
  if (same_host) {
    std::printf("UCX_TLS %s. Lanes: duet %s; references ucx_perftest -t get -D zcopy -x cma -d memory "
                "(UCT's cma transport: process_vm_readv, the same mechanism); shm: ucx_perftest -t ucp_get "
                "without -e %s\n",
                tls_note.c_str(), duet_lanes.c_str(), shm_lanes.c_str());
    std::printf("duet: median of >= %lld pulls (Pull then Wait), each with its blocks' epoch checks, pulls of "
                ">= 1 MiB copied by %d threads (same_host_copy_threads, at most the cores this process may use; "
                "--copy-threads 1: the waiter alone). "
                "References, "
                "overall bandwidth, one get outstanding (-O 1): 'pair' = server + client processes; '-l' = one "
                "process reading itself; 'shm' = UCP get on the default transports (a shared segment UCX "
                "allocated and maps itself, which a registered KV pool is not), for information\n\n",
                static_cast<long long>(f.GetInt("reps")),
                std::min(TransportOptions(f).same_host_copy_threads, AvailableCores()));
  } else {
    std::printf("UCX_TLS %s. Lanes: duet (UCP_ERR_HANDLING_MODE_PEER) %s; ucx_perftest -e %s; -l -e %s; "
                "shm (no -e) %s\n",
                tls_note.c_str(), duet_lanes.c_str(), pair_lanes.c_str(), loopback_lanes.c_str(),
                shm_lanes.c_str());
    std::printf("duet: median of >= %lld pulls, each with its blocks' epoch checks, spin_window %lld us%s. "
                "References, ucx_perftest -t ucp_get -s <bytes> -O 1, overall bandwidth: 'pair' = server + client "
                "processes (its server progresses only between 1 ms polls); '-l' = one process reading itself "
                "(responder always progressed); 'shm' = pair on the default transports, for information\n\n",
                static_cast<long long>(f.GetInt("reps")), static_cast<long long>(main_spin_us),
                f.GetBool("busy-poll") ? ", busy_poll" : "");
  }
  std::printf("%-24s %6s %14s %5s %9s %9s %9s %7s %7s %8s %9s\n", "pull", "blocks", "bytes", "segs", "duet GB/s",
              "pair GB/s", "-l GB/s", "x pair", "x -l", "target", "shm GB/s");
  for (size_t i = 0; i < pulls.size(); ++i) {
    const Pull& p = pulls[i];
    const uint64_t b = p.bytes();
    const double gbs = b / duet[i].median_s * 1e-9;
    const Ref& r = ref[b];
    auto col = [](const PerftestResult& x) { return x.ok ? Fixed(x.gb_per_s, 3) : std::string("n/a"); };
    auto ratio = [gbs](const PerftestResult& x) { return x.ok ? Fixed(gbs / x.gb_per_s, 2) : std::string("-"); };
    std::printf("%-24s %6lld %14s %5zu %9.3f %9s %9s %7s %7s %8s %9s\n", p.group.c_str(),
                static_cast<long long>(p.blocks), Bytes(b).c_str(), p.segments.size(), gbs, col(r.pair).c_str(),
                col(r.loopback).c_str(), ratio(r.pair).c_str(), ratio(r.loopback).c_str(),
                b >= (1ull << 20) ? ">= 0.85" : "-", r.shm.ok ? Fixed(r.shm.gb_per_s, 2).c_str() : "n/a");
  }

  std::printf("\n%-38s %8s %9s %8s %8s %11s %8s %8s\n", "latency (median us)", "duet",
              alt_spin_us > 0 ? absl::StrCat("spin ", alt_spin_us).c_str() : "-", "pair", "-l",
              "duet - best", "target", "shm");
  for (size_t i = 0; i < lat.size(); ++i) {
    const Measured& d = duet[pulls.size() + i];
    const Ref& r = ref[lat[i].bytes()];
    double best = 0;
    for (const PerftestResult* x : {&r.pair, &r.loopback}) {
      if (x->ok && (best == 0 || x->latency_us < best)) best = x->latency_us;
    }
    auto col = [](const PerftestResult& x) { return x.ok ? Fixed(x.latency_us, 1) : std::string("n/a"); };
    const bool headline = lat[i].bytes() == block_bytes && !lat[i].block_epochs.empty();
    std::printf("%-38s %8.1f %9s %8s %8s %11s %8s %8s\n", lat[i].name.c_str(), d.median_s * 1e6,
                alt[i].reps > 0 ? Fixed(alt[i].median_s * 1e6, 1).c_str() : "-", col(r.pair).c_str(),
                col(r.loopback).c_str(), best > 0 ? absl::StrCat(d.median_s * 1e6 >= best ? "+" : "", Fixed(d.median_s * 1e6 - best, 1)).c_str() : "-",
                headline ? "< 20" : "-", r.shm.ok ? Fixed(r.shm.latency_us, 2).c_str() : "n/a");
  }
  std::printf("\n%-26s %7s %12s %9s %12s %9s %10s %8s\n", "KV dtype, same tokens", "tokens", "F32 bytes",
              "F32 us", "BF16 bytes", "BF16 us", "BF16 / F32", "bytes");
  for (size_t i = 0; i < half.size(); ++i) {
    const Measured& full = duet[i];  // "blocks, random ids": the same counts
    const Measured& h = duet[pulls.size() + lat.size() + i];
    std::printf("%-26s %7lld %12s %9.1f %12s %9.1f %10.2f %8.2f\n", "blocks, random ids",
                static_cast<long long>(half[i].blocks * layout.block_size), Bytes(pulls[i].bytes()).c_str(),
                full.median_s * 1e6, Bytes(half[i].bytes()).c_str(), h.median_s * 1e6, h.median_s / full.median_s,
                static_cast<double>(half[i].bytes()) / static_cast<double>(pulls[i].bytes()));
  }
  for (const auto& [size, r] : ref) {
    for (const auto& [name, x] : {std::pair<const char*, const PerftestResult*>{"pair", &r.pair},
                                  {"-l", &r.loopback}, {"shm", &r.shm}}) {
      if (!x->ok && (net == nullptr || x == &r.pair)) {
        std::printf("ucx_perftest %s, %s: %s\n", name, Bytes(size).c_str(), x->error.c_str());
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace duet::bench

int main(int argc, char** argv) {
  duet::FlagSet f("kvtransfer",
                  "duet's UCX KV pull beside ucx_perftest -t ucp_get on the same transports, "
                  "in one table.");
  f.String("tls", "", "UCX_TLS for duet's transports and ucx_perftest (empty: the environment's)");
  f.Bool("veth",
         "run the exporter and ucx_perftest's server in one network namespace and this process in another, "
         "joined by veth links to a bridge, UCX over TCP on their eth0 (needs root; the namespaces are removed "
         "at the end)");
  f.Int("reps", 7, "at least this many timed pulls per row (median reported)");
  f.Double("min-seconds", 0.25, "and keep pulling a row for at least this long");
  f.Int("large-mib", 1024, "the largest single-segment pull, MiB (also one of half that size)");
  f.Bool("busy-poll", "importer's progress thread spins while pulls are in flight");
  f.Int("copy-threads", 0,
        "UcxTransportOptions::same_host_copy_threads of the importer (0: the default, "
        "2)");
  f.Int("spin-us", -1, "UcxTransportOptions::spin_window of both processes, us (-1: the default)");
  f.Int("alt-spin-us", 50, "also time the latency rows with this spin_window, us (0: don't)");
  f.String("only", "", "diagnosis: time only the rows whose name contains this, no ucx_perftest");
  f.Bool("no-perftest", "diagnosis: duet's figures only");
  f.Bool("exporter", "internal: run as the exporter process");
  f.Int("pool-blocks", 0, "internal: exporter pool size in blocks");
  f.Bool("probe", "internal: run as the lane probe");
  f.String("probe-address", "", "internal: exporter address (hex)");
  f.String("probe-region", "", "internal: exporter region (hex)");
  if (std::optional<int> exit = duet::ParseFlagsOrExit(f, argc, argv)) return *exit;
  if (f.GetBool("exporter")) return duet::bench::RunExporter(f);
  if (f.GetBool("probe")) return duet::bench::RunProbe(f);
  if (absl::Status s = duet::bench::Run(f); !s.ok()) {
    std::fprintf(stderr, "kvtransfer bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
