// FakeFrameSink: a worker::FrameSink that records frames instead of sending
// them, so service tests play the router (and the prefill) in-process and
// wait on the frames they expect rather than on time.
//
//   FakeFrameSink sink;
//   sink.on_peer = [&](const std::string& addr, const proto::Frame& f) { ... };
//   REQUIRE(sink.WaitForRouter([](const auto& frames) { return frames.size() >= 3; }));
//
// Thread-safe. on_peer runs on the sending thread, outside the sink's lock.
#ifndef DUET_DECODE_FAKE_FRAME_SINK_H_
#define DUET_DECODE_FAKE_FRAME_SINK_H_

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/control.pb.h"
#include "worker/frame_sink.h"

namespace duet::decode {

class FakeFrameSink : public worker::FrameSink {
 public:
  using Frames = std::vector<proto::Frame>;
  using PeerFrames = std::vector<std::pair<std::string, proto::Frame>>;

  void SendToRouter(const proto::Frame& f) override {
    absl::MutexLock lock(&mu_);
    router_.push_back(f);
  }
  void SendToPeer(const std::string& address, const proto::Frame& f,
                  std::function<void(absl::Status)>) override {
    if (on_peer) on_peer(address, f);
    absl::MutexLock lock(&mu_);
    peers_.emplace_back(address, f);
  }
  std::string worker_id() const override { return "decode-test"; }
  std::string control_address() const override { return "127.0.0.1:1"; }

  // Waits until pred(router frames) holds; false after `timeout` (a hung
  // engine fails the test instead of hanging it).
  bool WaitForRouter(const std::function<bool(const Frames&)>& pred,
                     absl::Duration timeout = absl::Seconds(120)) {
    absl::MutexLock lock(&mu_);
    auto ready = [&]() { return pred(router_); };
    return mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  }
  bool WaitForPeer(const std::function<bool(const PeerFrames&)>& pred,
                   absl::Duration timeout = absl::Seconds(120)) {
    absl::MutexLock lock(&mu_);
    auto ready = [&]() { return pred(peers_); };
    return mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  }
  Frames router() const {
    absl::MutexLock lock(&mu_);
    return router_;
  }
  PeerFrames peers() const {
    absl::MutexLock lock(&mu_);
    return peers_;
  }

  // Set before the service runs.
  std::function<void(const std::string&, const proto::Frame&)> on_peer;

 private:
  mutable absl::Mutex mu_;
  Frames router_;
  PeerFrames peers_;
};

}  // namespace duet::decode

#endif  // DUET_DECODE_FAKE_FRAME_SINK_H_
