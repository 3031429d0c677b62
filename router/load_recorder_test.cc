// The router's load record: a span's figures count exactly the events in
// it, its latency quantiles are the nearest-rank ones of those events, the
// span is cut to what is kept and to the router's age, and the JSON the
// router serves reads back to the same figures.
#include "router/load_recorder.h"

#include <catch2/catch.hpp>

namespace duet::router {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1000000);
absl::Time At(double s) { return kStart + absl::Seconds(s); }

TEST_CASE("a span counts the events inside it and no others") {
  LoadRecorder rec(kStart);
  // Ten requests, one a second from t = 1: prompt 100 + i, output i + 1,
  // first token 0.1 x (i + 1) s after arrival, 0.01 x (i + 1) s per token after it.
  for (int i = 0; i < 10; ++i) {
    const double t = 1 + i;
    rec.Arrived(At(t), 100 + i);
    rec.FirstToken(At(t + 0.1 * (i + 1)), absl::Seconds(0.1 * (i + 1)), 100 + i, 16 * (i % 2));
    rec.Finished(At(t + 0.5 + 0.1 * (i + 1)), i + 1, absl::Seconds(0.01 * (i + 1) * i));
  }
  const placement::LoadFigures all = rec.Figures(At(20), absl::Seconds(60));
  CHECK(all.interval_s == Approx(20));  // no older than the router
  CHECK(all.now == Approx(20));
  CHECK(all.arrivals == 10);
  CHECK(all.first_tokens == 10);
  CHECK(all.finished == 10);
  CHECK(all.prompt_tokens == 1045);
  CHECK(all.cached_tokens == 80);
  CHECK(all.arrival_rate() == Approx(0.5));
  // TTFTs 0.1 .. 1.0: nearest rank of 9 x q.
  CHECK(all.ttft_p50 == Approx(0.6));
  CHECK(all.ttft_p90 == Approx(0.9));
  // The one-token request has no TPOT: 0.02 .. 0.10 over nine.
  CHECK(all.tpot_p50 == Approx(0.06));
  CHECK(all.output_lens.size() == 10);
  CHECK(all.prompt_lens.size() == 10);

  // [15, 20]: no arrival (the last was at 10), one finish (the tenth, at 11.5) is out too.
  const placement::LoadFigures late = rec.Figures(At(20), absl::Seconds(5));
  CHECK(late.arrivals == 0);
  CHECK(late.finished == 0);
  CHECK(late.ttft_p50 == -1);
  CHECK(late.tpot_p90 == -1);

  // [5.6, 8]: arrivals at 6, 7, 8; first tokens at 6.6 and 7.7 (5.5 and 8.8 are out).
  const placement::LoadFigures mid = rec.Figures(At(8), absl::Seconds(2.4));
  CHECK(mid.arrivals == 3);
  CHECK(mid.first_tokens == 2);
  CHECK(mid.prompt_tokens == 105 + 106);
  CHECK(mid.ttft_p50 == Approx(0.7));
}

TEST_CASE("events older than the kept span are gone") {
  LoadRecorder rec(kStart, {.keep = absl::Seconds(30), .max_events = 1000, .max_lengths = 4});
  for (int i = 0; i < 100; ++i) rec.Arrived(At(i), 10);
  const placement::LoadFigures f = rec.Figures(At(99), absl::Seconds(600));
  CHECK(f.interval_s == Approx(30));
  CHECK(f.arrivals == 31);  // [69, 99]
  CHECK(f.prompt_lens.size() == 4);
}

TEST_CASE("figures survive their JSON") {
  LoadRecorder rec(kStart);
  rec.Arrived(At(1), 300);
  rec.FirstToken(At(1.5), absl::Milliseconds(500), 300, 128);
  rec.Finished(At(2.5), 11, absl::Seconds(1));
  placement::LoadFigures f = rec.Figures(At(3), absl::Seconds(3));
  f.decode = {.ready = 2, .starting = 1, .draining = 1, .waiting = 3, .running = 7, .kv_used = 96, .kv_capacity = 4096};
  absl::StatusOr<placement::LoadFigures> back = placement::FiguresFromJson(placement::FiguresToJson(f));
  REQUIRE(back.ok());
  CHECK(placement::FiguresToJson(*back) == placement::FiguresToJson(f));
  CHECK(back->tpot_p50 == Approx(0.1));
  CHECK(back->decode.planned() == 3);
  CHECK(back->cached_share() == Approx(128.0 / 300));
  CHECK_FALSE(placement::FiguresFromJson(nlohmann::json{{"arrivals", 3}}).ok());
  CHECK_FALSE(placement::FiguresFromJson(nlohmann::json{{"interval_s", 30}, {"arrivals", "many"}}).ok());
  CHECK_FALSE(placement::FiguresFromJson(nlohmann::json{{"interval_s", 30}, {"prefill", 2}}).ok());
}

}  // namespace
}  // namespace duet::router
