#include "router/dispatch.h"

#include <catch2/catch.hpp>
#include <map>
#include <vector>

namespace duet::router {
namespace {

WorkerLoad Prefill(std::string id, int64_t queued) {
  return {.id = id, .role = proto::ROLE_PREFILL, .control_address = id + ":1", .queued_prefill_tokens = queued};
}
WorkerLoad Decode(std::string id, int64_t free, int64_t running) {
  return {.id = id, .role = proto::ROLE_DECODE, .control_address = id + ":2", .kv_blocks_free = free,
          .running_requests = running};
}
WorkerLoad Colocated(std::string id, int64_t queued, int64_t free) {
  return {.id = id, .role = proto::ROLE_COLOCATED, .control_address = id + ":3",
          .queued_prefill_tokens = queued, .kv_blocks_free = free};
}

TEST_CASE("least-loaded prefill: fewest queued prefill tokens, ties by id") {
  Dispatcher d(DispatchPolicy::kLeastLoaded);
  std::vector<WorkerLoad> w = {Prefill("p2", 300), Prefill("p0", 500), Prefill("p1", 100), Decode("d0", 10, 0)};
  auto a = d.Pick(w);
  REQUIRE(a.ok());
  CHECK(a->prefill_id == "p1");
  CHECK(a->decode_id == "d0");
  CHECK(a->decode_address == "d0:2");
  // Same answer every time: least-loaded has no hidden state.
  CHECK(d.Pick(w)->prefill_id == "p1");
  w[2].queued_prefill_tokens = 300;  // p1 and p2 tie at 300: p1 (id order).
  CHECK(d.Pick(w)->prefill_id == "p1");
  w[2].queued_prefill_tokens = 301;
  CHECK(d.Pick(w)->prefill_id == "p2");
}

TEST_CASE("least-loaded decode: most free blocks, then fewest running") {
  Dispatcher d(DispatchPolicy::kLeastLoaded);
  std::vector<WorkerLoad> w = {Prefill("p0", 0), Decode("d0", 50, 1), Decode("d1", 80, 9), Decode("d2", 80, 3)};
  auto a = d.Pick(w);
  REQUIRE(a.ok());
  CHECK(a->decode_id == "d2");
  CHECK(a->decode_address == "d2:2");
  w[3].running_requests = 9;  // d1 and d2 tie on both: d1.
  CHECK(d.Pick(w)->decode_id == "d1");
  w[1].kv_blocks_free = 81;
  CHECK(d.Pick(w)->decode_id == "d0");
}

TEST_CASE("a colocated worker is its own decode") {
  Dispatcher d(DispatchPolicy::kLeastLoaded);
  std::vector<WorkerLoad> w = {Colocated("c0", 40, 5), Colocated("c1", 10, 1)};
  auto a = d.Pick(w);
  REQUIRE(a.ok());
  CHECK(a->prefill_id == "c1");
  CHECK(a->decode_id == "c1");
  CHECK(a->decode_address == "c1:3");
}

TEST_CASE("colocated and disaggregated workers share the prefill choice") {
  Dispatcher d(DispatchPolicy::kLeastLoaded);
  std::vector<WorkerLoad> w = {Colocated("c0", 40, 5), Prefill("p0", 10), Decode("d0", 3, 0)};
  auto a = d.Pick(w);
  REQUIRE(a.ok());
  CHECK(a->prefill_id == "p0");
  CHECK(a->decode_id == "d0");
  w[1].queued_prefill_tokens = 41;
  a = d.Pick(w);
  CHECK(a->prefill_id == "c0");
  CHECK(a->decode_id == "c0");
}

TEST_CASE("a prefill without any decode is not a candidate") {
  Dispatcher d(DispatchPolicy::kLeastLoaded);
  std::vector<WorkerLoad> w = {Prefill("p0", 0), Colocated("c0", 1000, 1)};
  auto a = d.Pick(w);
  REQUIRE(a.ok());
  CHECK(a->prefill_id == "c0");
  CHECK(CanServe(w).ok());
}

TEST_CASE("no live worker of a needed role is Unavailable naming it") {
  Dispatcher d(DispatchPolicy::kLeastLoaded);
  auto none = d.Pick({});
  CHECK(none.status().code() == absl::StatusCode::kUnavailable);
  CHECK(none.status().message() == "no live worker");
  std::vector<WorkerLoad> only_prefill = {Prefill("p0", 0)};
  CHECK(d.Pick(only_prefill).status().message() == "no live decode worker");
  CHECK(CanServe(only_prefill).code() == absl::StatusCode::kUnavailable);
  std::vector<WorkerLoad> only_decode = {Decode("d0", 1, 0)};
  CHECK(d.Pick(only_decode).status().message() == "no live prefill worker");
  std::vector<WorkerLoad> both = {Prefill("p0", 0), Decode("d0", 1, 0)};
  CHECK(CanServe(both).ok());
}

TEST_CASE("round-robin cycles over prefills and decodes in id order") {
  Dispatcher d(DispatchPolicy::kRoundRobin);
  // Loads are ignored: p1 is busiest and still gets its turn.
  std::vector<WorkerLoad> w = {Prefill("p1", 1000), Prefill("p0", 0), Decode("d1", 0, 50), Decode("d0", 90, 0),
                               Decode("d2", 5, 5)};
  std::vector<std::string> prefills, decodes;
  for (int i = 0; i < 6; ++i) {
    auto a = d.Pick(w);
    REQUIRE(a.ok());
    prefills.push_back(a->prefill_id);
    decodes.push_back(a->decode_id);
  }
  CHECK(prefills == std::vector<std::string>{"p0", "p1", "p0", "p1", "p0", "p1"});
  CHECK(decodes == std::vector<std::string>{"d0", "d1", "d2", "d0", "d1", "d2"});
}

TEST_CASE("round-robin over colocated workers spreads evenly") {
  Dispatcher d(DispatchPolicy::kRoundRobin);
  std::vector<WorkerLoad> w = {Colocated("c0", 0, 1), Colocated("c1", 0, 1), Colocated("c2", 0, 1)};
  std::map<std::string, int> count;
  for (int i = 0; i < 9; ++i) {
    auto a = d.Pick(w);
    REQUIRE(a.ok());
    CHECK(a->prefill_id == a->decode_id);
    count[a->prefill_id]++;
  }
  CHECK(count == std::map<std::string, int>{{"c0", 3}, {"c1", 3}, {"c2", 3}});
}

TEST_CASE("policy names parse") {
  CHECK(*ParseDispatchPolicy("least_loaded") == DispatchPolicy::kLeastLoaded);
  CHECK(*ParseDispatchPolicy("round_robin") == DispatchPolicy::kRoundRobin);
  auto bad = ParseDispatchPolicy("random");
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(DispatchPolicyName(DispatchPolicy::kRoundRobin) == "round_robin");
}

}  // namespace
}  // namespace duet::router
