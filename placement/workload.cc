#include "placement/workload.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <optional>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/status_macros.h"

namespace duet::placement {

absl::StatusOr<std::vector<TraceRow>> ReadTrace(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read trace ", path));
  std::string line;
  if (!std::getline(in, line)) return absl::InvalidArgumentError(absl::StrCat(path, " is empty"));
  std::vector<std::string> header = absl::StrSplit(absl::StripAsciiWhitespace(line), ',');
  int at = -1, pre = -1, dec = -1;
  for (size_t i = 0; i < header.size(); ++i) {
    if (header[i] == "arrived_at") at = static_cast<int>(i);
    if (header[i] == "num_prefill_tokens") pre = static_cast<int>(i);
    if (header[i] == "num_decode_tokens") dec = static_cast<int>(i);
  }
  if (pre < 0 || dec < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": needs columns num_prefill_tokens and num_decode_tokens (and arrived_at for arrivals)"));
  }
  std::vector<TraceRow> rows;
  int64_t n = 1;
  while (std::getline(in, line)) {
    ++n;
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    std::vector<absl::string_view> f = absl::StrSplit(absl::StripAsciiWhitespace(line), ',');
    TraceRow r;
    double p = 0, d = 0;
    if (static_cast<int>(f.size()) <= std::max({at, pre, dec}) || !absl::SimpleAtod(f[pre], &p) ||
        !absl::SimpleAtod(f[dec], &d) || (at >= 0 && !absl::SimpleAtod(f[at], &r.arrival)) || p < 0 || d < 0) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", n, ": malformed row"));
    }
    r.prompt = static_cast<int64_t>(p);
    r.output = static_cast<int64_t>(d);
    rows.push_back(r);
  }
  if (rows.empty()) return absl::InvalidArgumentError(absl::StrCat(path, " has no rows"));
  return rows;
}

namespace {

// Draws RAG prompts (RagOptions).
class RagPrompts {
 public:
  RagPrompts(const RagOptions& o, int64_t requests, uint64_t seed) : o_(o), requests_(requests), rng_(seed ^ 0x5241) {
    std::uniform_int_distribution<int64_t> len(o.doc_min, o.doc_max);
    for (int64_t d = 0; d < o.documents; ++d) {
      std::vector<int32_t> t(static_cast<size_t>(len(rng_)));
      for (int32_t& x : t) x = Token();
      docs_.push_back(std::move(t));
    }
    for (int64_t i = 0; i < o.system_tokens; ++i) system_.push_back(Token());
    std::vector<double> w;
    for (int64_t k = 1; k <= o.documents; ++k) w.push_back(1.0 / std::pow(static_cast<double>(k), o.zipf));
    rank_ = std::discrete_distribution<int64_t>(w.begin(), w.end());
    for (int64_t d = 0; d < o.documents; ++d) order_.push_back(d);
    std::shuffle(order_.begin(), order_.end(), rng_);
  }

  void Fill(int64_t i, SimRequest& req, std::deque<PromptTokens>& prompts) {
    if (!shifted_ && o_.shift_at > 0 && static_cast<double>(i) >= o_.shift_at * static_cast<double>(requests_)) {
      std::shuffle(order_.begin(), order_.end(), rng_);  // a new ranking
      shifted_ = true;
    }
    PromptTokens& r = prompts.emplace_back();
    r.tokens = system_;
    r.doc_begin = static_cast<int64_t>(r.tokens.size());
    std::vector<int64_t> chosen;
    while (static_cast<int64_t>(chosen.size()) < std::min(o_.docs_per_request, o_.documents)) {
      const int64_t d = order_[static_cast<size_t>(rank_(rng_))];
      if (std::find(chosen.begin(), chosen.end(), d) != chosen.end()) continue;
      chosen.push_back(d);
      r.boundaries.push_back(static_cast<int64_t>(r.tokens.size()));
      r.tokens.insert(r.tokens.end(), docs_[static_cast<size_t>(d)].begin(), docs_[static_cast<size_t>(d)].end());
    }
    r.doc_end = static_cast<int64_t>(r.tokens.size());
    r.boundaries.push_back(r.doc_end);
    const int64_t q = std::uniform_int_distribution<int64_t>(o_.question_min, o_.question_max)(rng_);
    for (int64_t k = 0; k < q; ++k) r.tokens.push_back(Token());
    req.prompt = static_cast<int64_t>(r.tokens.size());
    req.output = o_.output;
    req.content = &r;
  }

 private:
  int32_t Token() { return static_cast<int32_t>(3 + rng_() % 30000); }

  const RagOptions o_;
  const int64_t requests_;
  std::mt19937_64 rng_;
  std::vector<std::vector<int32_t>> docs_;
  std::vector<int32_t> system_;
  std::discrete_distribution<int64_t> rank_;
  std::vector<int64_t> order_;  // order_[rank]: the document of that popularity
  bool shifted_ = false;
};

absl::Status CheckRag(const RagOptions& r) {
  if (r.documents < 1 || r.docs_per_request < 1 || r.doc_min < 1 || r.doc_max < r.doc_min || r.system_tokens < 0 ||
      r.question_min < 1 || r.question_max < r.question_min || r.output < 1 || !(r.zipf >= 0) ||
      !(r.shift_at >= 0 && r.shift_at < 1)) {
    return absl::InvalidArgumentError(
        "the RAG workload needs documents, docs per request, 1 <= doc min <= max, question 1 <= min <= max, "
        "output >= 1, zipf >= 0 and 0 <= shift < 1");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Workload> MakeWorkload(const WorkloadOptions& o) {
  std::mt19937_64 rng(o.seed);
  std::vector<TraceRow> trace;
  const bool trace_lengths = o.lengths == "trace";
  if (o.arrivals == "trace" || trace_lengths) {
    if (o.trace.empty()) return absl::InvalidArgumentError("a trace file is needed (--trace)");
    ASSIGN_OR_RETURN(trace, ReadTrace(o.trace));
  }
  int64_t n = o.num_requests;
  if (o.arrivals == "trace") {
    if (trace.front().arrival < 0) return absl::InvalidArgumentError(absl::StrCat(o.trace, " has no arrival times"));
    if (o.rate_scale <= 0) return absl::InvalidArgumentError("rate scale must be positive");
    if (n <= 0) n = static_cast<int64_t>(trace.size());
  } else if (o.arrivals == "diurnal") {
    if (!(o.rate > 0) || !(o.duration_s > 0) || !(o.period_s > 0) || !(o.trough > 0 && o.trough <= 1)) {
      return absl::InvalidArgumentError("diurnal arrivals need a positive peak rate, duration and period and 0 < trough <= 1");
    }
    for (const Burst& b : o.bursts) {
      if (!(b.start_s >= 0) || !(b.duration_s > 0) || !(b.factor > 0)) {
        return absl::InvalidArgumentError("a burst needs a start >= 0, a positive duration and a positive factor");
      }
    }
  } else if (o.arrivals == "poisson" || o.arrivals == "gamma") {
    if (!(o.rate > 0)) return absl::InvalidArgumentError("the arrival rate must be positive");
    if (o.arrivals == "gamma" && !(o.cv > 0)) return absl::InvalidArgumentError("the gamma CV must be positive");
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown arrivals '", o.arrivals, "' (poisson, gamma, trace, diurnal)"));
  }
  // Diurnal arrivals by thinning: Poisson at the highest rate, each kept
  // with probability rate(t) / highest.
  std::vector<double> diurnal;
  if (o.arrivals == "diurnal") {
    double most = 1;
    for (const Burst& b : o.bursts) most = std::max(most, b.factor);
    most *= o.rate;
    std::exponential_distribution<double> gap(most);
    std::uniform_real_distribution<double> keep(0, 1);
    for (double at = gap(rng); at < o.duration_s; at += gap(rng)) {
      if (keep(rng) * most < DiurnalRate(o, at)) diurnal.push_back(at);
    }
    n = static_cast<int64_t>(diurnal.size());
  }
  if (n <= 0) return absl::InvalidArgumentError("the number of requests must be positive");
  // Lengths.
  int64_t fp = 0, fo = 0, pmin = 0, pmax = 0, omin = 0, omax = 0;
  bool uniform = false;
  const bool rag = o.lengths == "rag";
  if (rag) RETURN_IF_ERROR(CheckRag(o.rag));
  if (!trace_lengths && !rag) {
    absl::string_view l = o.lengths;
    std::vector<std::string> v;
    if (absl::ConsumePrefix(&l, "fixed:")) {
      v = absl::StrSplit(l, ',');
      if (v.size() != 2 || !absl::SimpleAtoi(v[0], &fp) || !absl::SimpleAtoi(v[1], &fo) || fp < 1 || fo < 1) {
        return absl::InvalidArgumentError("lengths fixed:P,O need two positive integers");
      }
    } else if (absl::ConsumePrefix(&l, "uniform:")) {
      v = absl::StrSplit(l, ',');
      uniform = true;
      if (v.size() != 4 || !absl::SimpleAtoi(v[0], &pmin) || !absl::SimpleAtoi(v[1], &pmax) ||
          !absl::SimpleAtoi(v[2], &omin) || !absl::SimpleAtoi(v[3], &omax) || pmin < 1 || pmax < pmin || omin < 1 ||
          omax < omin) {
        return absl::InvalidArgumentError("lengths uniform:PMIN,PMAX,OMIN,OMAX need 1 <= min <= max");
      }
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown lengths '", o.lengths, "' (fixed:P,O, uniform:..., trace, rag)"));
    }
  }
  if (!(o.length_scale > 0)) return absl::InvalidArgumentError("the length scale must be positive");
  if (o.overlong != "drop" && o.overlong != "truncate") {
    return absl::InvalidArgumentError("overlong must be drop or truncate");
  }

  Workload w;
  w.requests.reserve(static_cast<size_t>(n));
  double t = 0;
  std::exponential_distribution<double> expo(o.rate);
  // Gamma gaps with mean 1/rate and CV cv: shape 1/cv^2, scale cv^2/rate.
  std::gamma_distribution<double> gamma(1.0 / (o.cv * o.cv), o.cv * o.cv / o.rate);
  std::optional<RagPrompts> rag_prompts;
  if (rag) rag_prompts.emplace(o.rag, n, o.seed);
  for (int64_t i = 0; i < n; ++i) {
    SimRequest r;
    if (o.arrivals == "trace") {
      const TraceRow& row = trace[static_cast<size_t>(i) % trace.size()];
      // Past the end of the trace: it repeats, shifted by its length.
      const double span = trace.back().arrival - trace.front().arrival;
      const double round = static_cast<double>(static_cast<size_t>(i) / trace.size());
      r.arrival = (row.arrival - trace.front().arrival + round * span) / o.rate_scale;
    } else if (!diurnal.empty()) {
      r.arrival = diurnal[static_cast<size_t>(i)];
    } else {
      t += o.arrivals == "poisson" ? expo(rng) : gamma(rng);
      r.arrival = t;
    }
    if (rag) {
      if (w.prompts == nullptr) w.prompts = std::make_shared<std::deque<PromptTokens>>();
      rag_prompts->Fill(i, r, *w.prompts);  // lengths as drawn: the token ids fix them
      if (o.max_context > 0 && r.prompt + r.output > o.max_context) {
        ++w.dropped;
        continue;
      }
      w.requests.push_back(std::move(r));
      continue;
    }
    if (trace_lengths) {
      const TraceRow& row = trace[static_cast<size_t>(i) % trace.size()];
      r.prompt = row.prompt;
      r.output = row.output;
    } else if (uniform) {
      r.prompt = std::uniform_int_distribution<int64_t>(pmin, pmax)(rng);
      r.output = std::uniform_int_distribution<int64_t>(omin, omax)(rng);
    } else {
      r.prompt = fp;
      r.output = fo;
    }
    r.prompt = std::max<int64_t>(1, std::llround(static_cast<double>(r.prompt) * o.length_scale));
    r.output = std::max<int64_t>(1, std::llround(static_cast<double>(r.output) * o.length_scale));
    if (o.max_context > 0 && r.prompt + r.output > o.max_context) {
      if (o.overlong == "drop" || r.output >= o.max_context) {
        ++w.dropped;
        continue;
      }
      r.prompt = o.max_context - r.output;
      ++w.truncated;
    }
    w.requests.push_back(r);
  }
  std::stable_sort(w.requests.begin(), w.requests.end(),
                   [](const SimRequest& a, const SimRequest& b) { return a.arrival < b.arrival; });
  return w;
}

double DiurnalRate(const WorkloadOptions& o, double t) {
  const double s = (1 - std::cos(2 * M_PI * t / o.period_s)) / 2;
  double rate = o.rate * (o.trough + (1 - o.trough) * s * s);
  for (const Burst& b : o.bursts) {
    if (t >= b.start_s && t < b.start_s + b.duration_s) rate *= b.factor;
  }
  return rate;
}

}  // namespace duet::placement
