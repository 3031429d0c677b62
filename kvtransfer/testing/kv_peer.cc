// kv_peer: a KV exporter process for the UCX transport tests. It registers a
// pool filled with testing::FillBlock at epoch 0, prints its transport
// address and region descriptor, then obeys one command per stdin line:
//
//   rewrite <block>        BumpEpoch, rewrite the block for the new epoch -> "ok <epoch>"
//   epochs <b> [<b>...]    the epochs a handle would promise now (that of
//                          each block's last complete write) -> "epochs <e> [<e>...]"
//   expire-loop <ms>       in the background, keep ending the lease of a random
//                          block (bump, rewrite), <ms> apart (0: back to back) -> "ok"
//   stop                   end the loop -> "stopped <rewrites>"
//   quit                   -> "bye", then exits; so does EOF on stdin
//
//   kv_peer --blocks=64 --block-bytes=65536 --seed=7 [--ucx-tls=tcp]
//   -> "address <hex>", "region <hex>", "ready"
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/flags.h"
#include "base/huge_buffer.h"
#include "kvtransfer/testing/pattern.h"
#include "kvtransfer/ucx/ucx_transport.h"

namespace duet::kvtransfer::testing {
namespace {

void Reply(const std::string& line) {
  std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);
}

int Main(int argc, char** argv) {
  FlagSet flags("kv_peer", "KV exporter process for transport tests.");
  flags.Int("blocks", 64, "blocks in the pool");
  flags.Int("block-bytes", 65536, "bytes per block (multiple of 8)");
  flags.Int("seed", 1, "pattern and loop seed");
  flags.String("ucx-tls", "", "UCX_TLS for this transport (empty: the environment's)");
  absl::Status parsed = flags.Parse(argc, argv);
  if (!parsed.ok()) {
    std::cerr << parsed << "\n";
    return 2;
  }
  const int32_t blocks = static_cast<int32_t>(flags.GetInt("blocks"));
  const uint64_t block_bytes = static_cast<uint64_t>(flags.GetInt("block-bytes"));
  const uint64_t seed = static_cast<uint64_t>(flags.GetInt("seed"));

  UcxTransportOptions options;
  if (!flags.GetString("ucx-tls").empty()) options.ucx_config.push_back({"TLS", flags.GetString("ucx-tls")});
  auto transport = NewUcxTransport(options);
  if (!transport.ok()) {
    std::cerr << "kv_peer: " << transport.status() << "\n";
    return 1;
  }
  KvTransport& t = **transport;
  const uint64_t pool_bytes = block_bytes * static_cast<uint64_t>(blocks);
  HugeBuffer buffer(pool_bytes);  // as engine::BlockPool allocates
  auto* pool = buffer.As<uint8_t>();
  for (int32_t b = 0; b < blocks; ++b) FillBlock(pool + b * block_bytes, block_bytes, seed, b, 0);
  auto region = t.RegisterRegion(pool, pool_bytes, blocks);
  if (!region.ok()) {
    std::cerr << "kv_peer: " << region.status() << "\n";
    return 1;
  }
  auto exported = t.ExportRegion(*region);
  Reply("address " + absl::BytesToHexString(t.address()));
  Reply("region " + absl::BytesToHexString(*exported));
  Reply("ready");

  // The epoch a new handle would promise for each block: like a prefill
  // worker, this peer grants a lease only on a block whose contents are
  // complete, so the promised epoch is published after the rewrite.
  std::vector<std::atomic<uint64_t>> published(blocks);
  for (auto& p : published) p.store(0);
  // Ends a block's lease the way a prefill worker reuses a block: bump the
  // epoch first, then write the block's new contents.
  auto rewrite = [&](int32_t b) {
    t.BumpEpoch(*region, b);
    uint64_t epoch = t.BlockEpoch(*region, b);
    FillBlock(pool + b * block_bytes, block_bytes, seed, b, epoch);
    published[b].store(epoch);
    return epoch;
  };

  absl::Mutex mu;
  bool stop_loop = false;
  std::atomic<uint64_t> loop_rewrites{0};
  std::thread loop;
  auto stop = [&] {
    if (!loop.joinable()) return;
    {
      absl::MutexLock lock(&mu);
      stop_loop = true;
    }
    loop.join();
  };

  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    if (cmd == "rewrite") {
      int32_t b = -1;
      in >> b;
      if (b < 0 || b >= blocks) {
        Reply("error bad block");
        continue;
      }
      Reply("ok " + std::to_string(rewrite(b)));
    } else if (cmd == "epochs") {
      std::string out = "epochs";
      int32_t b;
      while (in >> b) {
        if (b < 0 || b >= blocks) break;
        out += " " + std::to_string(published[b].load());
      }
      Reply(out);
    } else if (cmd == "expire-loop") {
      double ms = 0;
      in >> ms;
      stop();
      stop_loop = false;
      loop_rewrites = 0;
      loop = std::thread([&, ms] {
        std::mt19937_64 rng(seed * 7919 + 1);
        for (;;) {
          {
            absl::MutexLock lock(&mu);
            // A paced load generator, woken early by "stop".
            if (ms > 0) {
              mu.AwaitWithTimeout(absl::Condition(&stop_loop), absl::Milliseconds(ms));
            }
            if (stop_loop) return;
          }
          rewrite(static_cast<int32_t>(rng() % static_cast<uint64_t>(blocks)));
          loop_rewrites++;
        }
      });
      Reply("ok");
    } else if (cmd == "stop") {
      stop();
      Reply("stopped " + std::to_string(loop_rewrites.load()));
    } else if (cmd == "quit") {
      break;
    } else {
      Reply("error unknown command");
    }
  }
  stop();
  transport->reset();
  Reply("bye");
  return 0;
}

}  // namespace
}  // namespace duet::kvtransfer::testing

int main(int argc, char** argv) { return duet::kvtransfer::testing::Main(argc, argv); }
