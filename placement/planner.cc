#include "placement/planner.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_format.h"

namespace duet::placement {
namespace {

void Keep(std::deque<int64_t>& into, const std::vector<int64_t>& from, size_t limit) {
  for (int64_t v : from) into.push_back(v);
  while (into.size() > limit) into.pop_front();
}

int64_t Draw(const std::deque<int64_t>& from, std::mt19937_64& rng) {
  return from[std::uniform_int_distribution<size_t>(0, from.size() - 1)(rng)];
}

bool SameShape(const InstanceSpec& a, const InstanceSpec& b) {
  return a.par.tp == b.par.tp && a.par.pp == b.par.pp && a.latency == b.latency;
}

// Within a bound on prefill + decode instances: growth trimmed, from the
// pool that grows the most (from P and D) first.
void Trim(ScaleDecision& d, int P, int D, int max_instances, int min_prefill, int min_decode) {
  if (max_instances <= 0) return;
  while (d.prefill + d.decode > max_instances) {
    const bool trim_prefill = (d.prefill - P > d.decode - D || d.decode <= min_decode) && d.prefill > min_prefill;
    if (trim_prefill) --d.prefill;
    else if (d.decode > min_decode) --d.decode;
    else break;
  }
}

}  // namespace

std::string PlannerRecord::Describe() const {
  return absl::StrFormat(
      "%st=%.0fs rate %.2f req/s (forecast %.2f, planned %.2f); prefill %d -> %d (load needs %d), decode %d -> %d "
      "(needs %d, long-run bound %d)%s%s; predicted TTFT p50 %.3f s, TPOT p50 %.4f s; observed %.3f s, %.4f s; correction x%.2f "
      "prefill, x%.2f decode; %d simulations%s%s",
      check ? "check: " : "", now, observed_rate, forecast_rate, planned_rate, prefill_before, decision.prefill, prefill_need,
      decode_before, decision.decode, decode_need, decode_stable,
      decision.to_prefill > 0 ? absl::StrFormat(", %d decode -> prefill", decision.to_prefill) : "",
      decision.to_decode > 0 ? absl::StrFormat(", %d prefill -> decode", decision.to_decode) : "",
      predicted_ttft_p50, predicted_tpot_p50, observed_ttft_p50, observed_tpot_p50, correction_prefill,
      correction_decode, simulations, decision.why.empty() ? "" : ": ", decision.why);
}

Planner::Planner(const ModelSpec& model, LatencyModel& latency, PlannerOptions options)
    : model_(model), base_(latency), o_(std::move(options)), rng_(o_.seed) {
  o_.prefill.role = InstanceRole::kPrefill;
  o_.decode.role = InstanceRole::kDecode;
  corrected_ = NewScaledLatency(&base_, {{0, 1.0}, {1, 1.0}});
}

Planner::Window Planner::MakeWindow(double rate, int64_t backlog) { return MakeWindow(rate, backlog, prompts_, outputs_); }

Planner::Window Planner::MakeWindow(double rate, int64_t backlog, const std::deque<int64_t>& prompts,
                                    const std::deque<int64_t>& outputs) {
  Window w;
  if (prompts.empty()) return w;
  auto request = [&](double t) {
    return SimRequest{.arrival = t,
                      .prompt = Draw(prompts, rng_),
                      .output = outputs.empty() ? o_.default_output : Draw(outputs, rng_)};
  };
  for (int64_t k = 0; k < backlog; ++k) w.requests.push_back(request(0));
  w.backlog = backlog;
  if (rate > 0) {
    const int64_t n = std::clamp<int64_t>(static_cast<int64_t>(rate * o_.window_s), 1, o_.max_window_requests);
    std::exponential_distribution<double> gap(rate);
    double t = 0;
    for (int64_t k = 0; k < n; ++k) {
      t += gap(rng_);
      w.requests.push_back(request(t));
    }
  }
  return w;
}

bool Planner::Meets(InstanceRole role, int n, const Window& w, double* median, double target) {
  return Attainment(role, n, w, median) >= (target > 0 ? target : o_.target);
}

double Planner::Attainment(InstanceRole role, int n, const Window& w, double* median) {
  ++record_.simulations;
  ClusterSpec c = o_.cluster;
  c.instances.clear();
  SimResult r;
  if (role == InstanceRole::kPrefill) {
    // Alone: each request ends at its first token (one output token), a
    // decode instance beside the pool that never gets one (dispatch then
    // sees prefill instances, as the router does).
    c.instances.assign(static_cast<size_t>(n), o_.prefill);
    c.instances.push_back(o_.decode);
    std::vector<SimRequest> prompts = w.requests;
    for (SimRequest& q : prompts) q.output = 1;
    r = Simulate(c, model_, *corrected_, prompts);
    if (median != nullptr) *median = r.Percentile(0.5, /*tpot=*/false, w.backlog);
    return r.TtftAttainment(o_.slo.ttft, w.backlog);
  }
  // Alone: an instant prefill hands each request on as it arrives.
  DecodeOnlyLatency decode_only(*corrected_);
  InstanceSpec entry = o_.prefill;
  entry.latency = nullptr;
  c.instances.push_back(entry);
  InstanceSpec d = o_.decode;
  d.latency = nullptr;
  c.instances.insert(c.instances.end(), static_cast<size_t>(n), d);
  r = Simulate(c, model_, decode_only, w.requests);
  if (median != nullptr) *median = r.Percentile(0.5, /*tpot=*/true, w.backlog);
  return r.TpotAttainment(o_.slo.tpot, w.backlog);
}

int Planner::DecodeStable(double rate) {
  return static_cast<int>(std::ceil(DecodeLoad(rate) / o_.decode_utilization));
}

double Planner::DecodeLoad(double rate) {
  if (outputs_.empty() || prompts_.empty() || rate <= 0) return 0;
  double p = 0, o = 0, o2 = 0;
  for (int64_t x : prompts_) p += static_cast<double>(x);
  for (int64_t x : outputs_) o += static_cast<double>(x), o2 += static_cast<double>(x) * static_cast<double>(x);
  p /= static_cast<double>(prompts_.size());
  o /= static_cast<double>(outputs_.size());
  o2 /= static_cast<double>(outputs_.size());
  const InstanceSpec& d = o_.decode;
  const double kv = d.kv_capacity_tokens > 0 ? d.kv_capacity_tokens : 1e18;
  // The batch a full instance runs, each row halfway through its output.
  const int64_t rows = std::max<int64_t>(1, std::min<int64_t>(d.max_batch_size, static_cast<int64_t>(kv / (p + o))));
  ctx_.assign(static_cast<size_t>(rows), static_cast<int64_t>(p + o / 2));
  const double step = corrected_->Decode(d.par, ctx_);
  // Little's law: a request holds its reservation (prompt + output) for
  // output x step seconds, and a batch row for as long.
  const double by_kv = rate * step * (p * o + o2) / kv;
  const double by_rows = rate * step * o / static_cast<double>(d.max_batch_size);
  return std::max(by_kv, by_rows);
}

int Planner::Fewest(InstanceRole role, int lo, int hi, const Window& w, double target) {
  if (w.requests.empty()) return lo;
  if (hi <= lo) return hi;
  if (!Meets(role, hi, w, nullptr, target)) return hi;
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (Meets(role, mid, w, nullptr, target)) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

int Planner::RecentMost(std::deque<std::pair<double, int>>& needs, double now, int need) const {
  needs.emplace_back(now, need);
  while (needs.front().first < now - o_.cooldown_s) needs.pop_front();
  int most = need;
  for (const auto& [t, n] : needs) most = std::max(most, n);
  return most;
}

std::optional<ScaleDecision> Planner::Check(const LoadFigures& f) {
  // Nothing to compare with before the first decision, or after a restart
  // of the figures' clock.
  if (last_prefill_ < 0 || prompts_.empty() || f.interval_s <= 0 || f.now < last_now_) return std::nullopt;
  const double expected = sized_rate_ * f.interval_s;
  if (static_cast<double>(f.arrivals) <= expected + 3 * std::sqrt(expected) + 3) return std::nullopt;
  const double load = f.arrival_rate() * (1 + o_.margin);
  const int P = f.prefill.planned(), D = f.decode.planned();
  // The record replaces the last decision's only when this check changes the pools.
  const PlannerRecord last = record_;
  record_ = PlannerRecord{};
  record_.check = true;
  record_.now = f.now;
  record_.observed_rate = record_.planned_rate = f.arrival_rate();
  record_.prefill_before = P;
  record_.decode_before = D;
  record_.correction_prefill = correction_prefill_;
  record_.correction_decode = correction_decode_;
  rng_.seed(o_.seed);
  const Window prefill_window = MakeWindow(load, f.prefill.waiting);
  const Window decode_window = MakeWindow(load, f.decode.waiting + f.decode.running);
  record_.decode_stable = std::min(o_.max_decode, DecodeStable(load));
  record_.prefill_need = Fewest(InstanceRole::kPrefill, std::max(o_.min_prefill, P), o_.max_prefill, prefill_window);
  record_.decode_need =
      Fewest(InstanceRole::kDecode, std::max({o_.min_decode, D, record_.decode_stable}), o_.max_decode, decode_window);
  ScaleDecision d{.prefill = std::max(P, record_.prefill_need), .decode = std::max(D, record_.decode_need)};
  Trim(d, P, D, o_.max_instances, o_.min_prefill, o_.min_decode);
  d.prefill = std::max(d.prefill, P);
  d.decode = std::max(d.decode, D);
  sized_rate_ = std::max(sized_rate_, load);
  if (d.prefill == P && d.decode == D) {
    record_ = last;
    return std::nullopt;
  }
  // Only a check that changes the pools changes the planner (a replay of
  // the decisions alone gives them again).
  RecentMost(prefill_needs_, f.now, record_.prefill_need);
  RecentMost(decode_needs_, f.now, record_.decode_need);
  d.why = absl::StrFormat("a burst: %lld arrivals in %.0f s, sized for %.1f", static_cast<long long>(f.arrivals),
                          f.interval_s, expected);
  record_.decision = d;
  if (d.prefill != P) last_change_prefill_ = f.now;
  if (d.decode != D) last_change_decode_ = f.now;
  last_prefill_ = d.prefill;
  last_decode_ = d.decode;
  if (o_.on_decision) o_.on_decision(record_, f);
  return d;
}

ScaleDecision Planner::Decide(const LoadFigures& f) {
  const ScaleDecision d = Size(f);
  if (o_.on_decision) o_.on_decision(record_, f);
  return d;
}

ScaleDecision Planner::Size(const LoadFigures& f) {
  record_ = PlannerRecord{};
  record_.now = f.now;
  Keep(prompts_, f.prompt_lens, o_.lengths_kept);
  Keep(outputs_, f.output_lens, o_.lengths_kept);

  // 1. Forecast.
  const double observed = f.arrival_rate();
  if (!have_level_) {
    level_ = observed;
    trend_ = 0;
    have_level_ = true;
  } else {
    const double previous = level_;
    level_ = o_.trend_alpha * observed + (1 - o_.trend_alpha) * (level_ + trend_);
    trend_ = o_.trend_beta * (level_ - previous) + (1 - o_.trend_beta) * trend_;
  }
  const double forecast = std::max(0.0, level_ + trend_);
  const double planned = o_.forecast == "last" ? observed : std::max(observed, forecast);
  record_.observed_rate = observed;
  record_.forecast_rate = forecast;
  record_.planned_rate = planned;

  // 2. Correct, from intervals whose pools were what the last decision
  // predicted for (nothing starting, switching or draining).
  const int P = f.prefill.planned(), D = f.decode.planned();
  const bool settled = f.prefill.starting == 0 && f.prefill.draining == 0 && f.decode.starting == 0 &&
                       f.decode.draining == 0 && P == last_prefill_ && D == last_decode_;
  record_.observed_ttft_p50 = f.ttft_p50;
  record_.observed_tpot_p50 = f.tpot_p50;
  // Only below twice the SLO: past it the medians measure a queue, not the
  // model's service times.
  auto correct = [&](double& factor, double observed, double predicted, int64_t count, double slo) {
    if (!settled || predicted <= 0 || observed <= 0 || count < 20 || observed > 2 * slo || predicted > 2 * slo) return;
    factor = std::clamp(factor * std::pow(observed / predicted, o_.correction_damping), 1 / o_.correction_limit,
                        o_.correction_limit);
  };
  // The prediction to compare with is the interval just observed,
  // simulated again: its pools, its arrival rate and its own prompt and
  // output lengths. (A prediction made for it beforehand, from the lengths
  // kept over many intervals, would read a shift in the lengths, such as a
  // trace's minutes of short prompts, as an error of the latency model.)
  if (settled && f.first_tokens >= 20) {
    rng_.seed(o_.seed);
    const std::deque<int64_t> seen_prompts(f.prompt_lens.begin(), f.prompt_lens.end());
    const std::deque<int64_t> seen_outputs(f.output_lens.begin(), f.output_lens.end());
    const Window seen = MakeWindow(observed, 0, seen_prompts.empty() ? prompts_ : seen_prompts,
                                   seen_outputs.empty() ? outputs_ : seen_outputs);
    double ttft = -1, tpot = -1;
    Meets(InstanceRole::kPrefill, P, seen, &ttft);
    Meets(InstanceRole::kDecode, D, seen, &tpot);
    correct(correction_prefill_, f.ttft_p50, ttft, f.first_tokens, o_.slo.ttft);
    correct(correction_decode_, f.tpot_p50, tpot, f.finished, o_.slo.tpot);
  }
  // A prefill batch has no decode rows: the first factor; a decode step the second.
  corrected_ = NewScaledLatency(&base_, {{0, correction_prefill_}, {1, correction_decode_}});
  record_.correction_prefill = correction_prefill_;
  record_.correction_decode = correction_decode_;

  // A restarted planner (or an actuator that moved the pools) waits a
  // cool-down before shrinking what it finds. So does one whose figures'
  // clock went back (a restarted router counts from 0): the spans it kept
  // in the old clock would hold the pools for as long as that clock ran.
  if (last_prefill_ < 0 || f.now < last_now_) {
    last_change_prefill_ = last_change_decode_ = f.now;
    prefill_needs_.clear();
    decode_needs_.clear();
  }
  last_now_ = f.now;
  record_.prefill_before = P;
  record_.decode_before = D;
  ScaleDecision d{.prefill = P, .decode = D};
  if (prompts_.empty()) {
    d.prefill = std::clamp(P, o_.min_prefill, o_.max_prefill);
    d.decode = std::clamp(D, o_.min_decode, o_.max_decode);
    d.why = "no load seen yet";
    record_.decision = d;
    last_prefill_ = d.prefill;
    last_decode_ = d.decode;
    return d;
  }

  // 3. Size, 4. hysteresis. Every decision draws its windows from the same
  // seed (common random numbers): the sizes then move with the load and
  // the lengths, not with the draw.
  rng_.seed(o_.seed);
  const double load = planned * (1 + o_.margin);
  sized_rate_ = load;
  const Window prefill_window = MakeWindow(load, f.prefill.waiting);
  const Window decode_window = MakeWindow(load, f.decode.waiting + f.decode.running);
  // The largest need of the last cool-down (HPA's stabilization window):
  // a pool shrinks only to what every decision of that span allowed.
  auto size = [&](InstanceRole role, int now_n, int lo, int hi, int64_t backlog, double last_change, int* need) {
    const Window& w = role == InstanceRole::kPrefill ? prefill_window : decode_window;
    const int stable = role == InstanceRole::kDecode ? std::min(hi, DecodeStable(load)) : lo;
    if (role == InstanceRole::kDecode) record_.decode_stable = stable;
    *need = Fewest(role, std::max(lo, stable), hi, w);
    const int most = RecentMost(role == InstanceRole::kPrefill ? prefill_needs_ : decode_needs_, f.now, *need);
    if (*need >= now_n) return std::clamp(*need, lo, hi);
    if (f.now - last_change < o_.cooldown_s || now_n <= lo || most >= now_n) return std::clamp(now_n, lo, hi);
    const double scaled = load * now_n / (now_n - 1);
    const Window down = MakeWindow(scaled, backlog);
    const int floor = role == InstanceRole::kDecode ? std::min(now_n, DecodeStable(scaled)) : lo;
    return std::clamp(std::max(most, Fewest(role, std::max(lo, floor), now_n, down)), lo, hi);
  };
  d.prefill = size(InstanceRole::kPrefill, P, o_.min_prefill, o_.max_prefill, f.prefill.waiting,
                   last_change_prefill_, &record_.prefill_need);
  d.decode = size(InstanceRole::kDecode, D, o_.min_decode, o_.max_decode, f.decode.waiting + f.decode.running,
                  last_change_decode_, &record_.decode_need);
  if (o_.max_instances > 0 && d.prefill + d.decode > o_.max_instances) {
    // More than the bound: no headroom is left to plan, so the bound is
    // split in proportion to what each pool needs to break even at the
    // forecast load (no margin): prefill at the usual 90% attainment
    // (DistServe's target), decode at its long-run bound at utilization 1;
    // a split that falls halfway goes to the pool short of its need now.
    // At the bound already, a move between the pools (a drain and a start)
    // waits for the shrinking pool's cool-down, and is of at least 1/16 of
    // the bound (two instances of 32: a fleet does not churn for one; a
    // cluster of three moves its one).
    const int cap = o_.max_instances;
    const int even_p = Fewest(InstanceRole::kPrefill, o_.min_prefill, o_.max_prefill,
                              MakeWindow(planned, 0), 0.9);
    const int even_d = std::max(o_.min_decode, static_cast<int>(std::ceil(DecodeLoad(planned))));
    int p = static_cast<int>(std::lround(static_cast<double>(cap) * even_p / (even_p + even_d)));
    if (2 * cap * even_p == (2 * p - 1) * (even_p + even_d) && record_.decode_need > D) --p;  // halfway, decode short
    p = std::clamp(p, o_.min_prefill, cap - o_.min_decode);
    if (P + D == cap && p != P && P >= o_.min_prefill && cap - P >= o_.min_decode &&
        (std::abs(p - P) < std::max(1, cap / 16) || f.now - (p < P ? last_change_prefill_ : last_change_decode_) < o_.cooldown_s)) {
      p = P;
    }
    d.prefill = p;
    d.decode = cap - p;
  }

  // 5. Switch.
  if (o_.switch_roles && SameShape(o_.prefill, o_.decode)) {
    if (d.prefill > P && d.decode < D) d.to_prefill = std::min(d.prefill - P, D - d.decode);
    if (d.decode > D && d.prefill < P) d.to_decode = std::min(d.decode - D, P - d.prefill);
  }
  if (d.prefill != P) last_change_prefill_ = f.now;
  if (d.decode != D) last_change_decode_ = f.now;
  if (d.prefill > P || d.decode > D) d.why = "the forecast load needs more";
  else if (d.prefill < P || d.decode < D) d.why = "the smaller pools meet the SLOs at N/(N-1) of the load";

  // What the decision predicts at the forecast load (no margin), logged and
  // exported beside what the next interval observes.
  const Window at = MakeWindow(planned, f.prefill.waiting);
  Meets(InstanceRole::kPrefill, d.prefill, at, &record_.predicted_ttft_p50);
  const Window at_decode = MakeWindow(planned, f.decode.waiting + f.decode.running);
  Meets(InstanceRole::kDecode, d.decode, at_decode, &record_.predicted_tpot_p50);
  record_.decision = d;
  last_prefill_ = d.prefill;
  last_decode_ = d.decode;
  return d;
}

int QueueThresholdScaler::Pool(double load, int current, double bound, int lo, int hi,
                               std::deque<std::pair<double, int>>& history, double now) const {
  int desired = static_cast<int>(std::ceil(load / bound));
  if (current > 0 && std::abs(desired - current) <= o_.tolerance * current) desired = current;
  desired = std::clamp(desired, lo, hi);
  history.emplace_back(now, desired);
  while (!history.empty() && history.front().first < now - o_.stabilization_s) history.pop_front();
  if (desired < current) {
    int most = desired;
    for (const auto& [t, n] : history) most = std::max(most, n);
    desired = std::min(current, most);
  }
  return desired;
}

ScaleDecision QueueThresholdScaler::Decide(const LoadFigures& f) {
  ScaleDecision d;
  d.prefill = Pool(static_cast<double>(f.prefill.waiting), f.prefill.planned(), o_.prefill_bound, o_.min_prefill,
                   o_.max_prefill, prefill_history_, f.now);
  d.decode = Pool(static_cast<double>(f.decode.waiting + f.decode.running), f.decode.planned(), o_.decode_bound,
                  o_.min_decode, o_.max_decode, decode_history_, f.now);
  Trim(d, f.prefill.planned(), f.decode.planned(), o_.max_instances, o_.min_prefill, o_.min_decode);
  return d;
}

}  // namespace duet::placement
