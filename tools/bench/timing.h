// The benches' wall-clock timing: a steady clock and its spans in seconds.
//
//   const Clock::time_point start = Clock::now();
//   RunOnce();
//   const double s = SecondsSince(start);
#ifndef DUET_TOOLS_BENCH_TIMING_H_
#define DUET_TOOLS_BENCH_TIMING_H_

#include <chrono>

namespace duet::bench {

using Clock = std::chrono::steady_clock;

inline double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
inline double SecondsSince(Clock::time_point start) { return Seconds(Clock::now() - start); }

}  // namespace duet::bench

#endif  // DUET_TOOLS_BENCH_TIMING_H_
