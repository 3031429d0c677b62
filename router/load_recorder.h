// The router's record of the load it served lately, for `duet planner`:
// each request's arrival and prompt length, first token (TTFT, prompt and
// cached tokens) and end (output length, TPOT), kept for `keep`. Figures()
// summarises any recent span as placement::LoadFigures (the pools are the
// caller's: the router fills them from its workers' heartbeats), so readers
// need no state of their own: a planner restarted mid-run reads the same
// figures as the one before it.
//
//   LoadRecorder rec(start);
//   rec.Arrived(now, 512);
//   LoadFigures f = rec.Figures(now, absl::Seconds(30));
// Not thread-safe: the router calls it under its lock.
#ifndef DUET_ROUTER_LOAD_RECORDER_H_
#define DUET_ROUTER_LOAD_RECORDER_H_

#include <cstddef>
#include <cstdint>
#include <deque>

#include "absl/time/time.h"
#include "placement/autoscale.h"

namespace duet::router {

class LoadRecorder {
 public:
  struct Options {
    absl::Duration keep = absl::Minutes(10);  // the longest span Figures() covers
    size_t max_events = 1 << 18;              // the oldest go first past it
    size_t max_lengths = 4096;                // prompt and output lengths reported (the latest)
  };
  explicit LoadRecorder(absl::Time start) : LoadRecorder(start, Options{}) {}
  LoadRecorder(absl::Time start, Options options) : start_(start), o_(options) {}

  void Arrived(absl::Time t, int64_t prompt_tokens);
  void FirstToken(absl::Time t, absl::Duration ttft, int64_t prompt_tokens, int64_t cached_tokens);
  // `output_tokens` generated; TPOT over those after the first (none for one).
  void Finished(absl::Time t, int64_t output_tokens, absl::Duration first_to_last);

  // The span [now - window, now], shortened to what is kept and to the time
  // since `start`: its arrivals, lengths, token counts and latency
  // quantiles; `now` in seconds since `start`.
  placement::LoadFigures Figures(absl::Time now, absl::Duration window) const;

 private:
  enum class Kind { kArrived, kFirstToken, kFinished };
  struct Event {
    absl::Time t;
    Kind kind;
    int64_t tokens = 0, cached = 0;  // prompt (arrival, first token) or output (finish) tokens
    double seconds = -1;             // TTFT, or TPOT (-1: one token)
  };
  void Add(Event e);

  absl::Time start_;
  Options o_;
  std::deque<Event> events_;  // in time order
};

}  // namespace duet::router

#endif  // DUET_ROUTER_LOAD_RECORDER_H_
