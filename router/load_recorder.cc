#include "router/load_recorder.h"

#include <algorithm>
#include <iterator>
#include <vector>

namespace duet::router {

void LoadRecorder::Add(Event e) {
  // In time order; events come nearly in order, so the place is found from the back.
  auto it = events_.end();
  while (it != events_.begin() && std::prev(it)->t > e.t) --it;
  events_.insert(it, e);
  const absl::Time newest = events_.back().t;
  while (events_.size() > o_.max_events || events_.front().t < newest - o_.keep) events_.pop_front();
}

void LoadRecorder::Arrived(absl::Time t, int64_t prompt_tokens) {
  Add({.t = t, .kind = Kind::kArrived, .tokens = prompt_tokens});
}

void LoadRecorder::FirstToken(absl::Time t, absl::Duration ttft, int64_t prompt_tokens, int64_t cached_tokens) {
  Add({.t = t, .kind = Kind::kFirstToken, .tokens = prompt_tokens, .cached = cached_tokens,
       .seconds = absl::ToDoubleSeconds(ttft)});
}

void LoadRecorder::Finished(absl::Time t, int64_t output_tokens, absl::Duration first_to_last) {
  Add({.t = t, .kind = Kind::kFinished, .tokens = output_tokens,
       .seconds = output_tokens > 1 ? absl::ToDoubleSeconds(first_to_last) / static_cast<double>(output_tokens - 1)
                                    : -1});
}

placement::LoadFigures LoadRecorder::Figures(absl::Time now, absl::Duration window) const {
  placement::LoadFigures f;
  window = std::min({window, o_.keep, std::max(now - start_, absl::ZeroDuration())});
  f.now = absl::ToDoubleSeconds(now - start_);
  f.interval_s = absl::ToDoubleSeconds(window);
  const absl::Time from = now - window;
  std::vector<double> ttft, tpot;
  for (auto it = events_.rbegin(); it != events_.rend() && it->t >= from; ++it) {
    if (it->t > now) continue;
    switch (it->kind) {
      case Kind::kArrived:
        ++f.arrivals;
        if (f.prompt_lens.size() < o_.max_lengths) f.prompt_lens.push_back(it->tokens);
        break;
      case Kind::kFirstToken:
        ++f.first_tokens;
        f.prompt_tokens += it->tokens;
        f.cached_tokens += it->cached;
        ttft.push_back(it->seconds);
        break;
      case Kind::kFinished:
        ++f.finished;
        if (f.output_lens.size() < o_.max_lengths) f.output_lens.push_back(it->tokens);
        if (it->seconds >= 0) tpot.push_back(it->seconds);
        break;
    }
  }
  placement::SetLatencyQuantiles(f, ttft, tpot);
  return f;
}

}  // namespace duet::router
