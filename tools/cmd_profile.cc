// duet profile: times the duet engine on this machine over a grid of batch
// shapes and writes the latency coefficients duet sim and duet place read
// (DistServe's fitted format, TP 1).
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/flags.h"
#include "base/status_macros.h"
#include "engine/block_pool.h"
#include "engine/model.h"
#include "kernels/cpu/cpu_backend.h"
#include "tools/commands.h"
#include "engine/testing/model_maker.h"

namespace duet::tools {
namespace {

using engine::BatchSeq;
using engine::SequenceKv;

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Least squares for y = X b with three columns (normal equations), on the
// columns `use` says (the others' coefficients are 0), rows weighted by `w`.
std::vector<double> Fit3(const std::vector<std::array<double, 3>>& x, const std::vector<double>& y,
                         const std::vector<double>& w, std::array<bool, 3> use = {true, true, true}) {
  double a[3][4] = {};
  for (size_t i = 0; i < x.size(); ++i) {
    for (int r = 0; r < 3; ++r) {
      for (int c = 0; c < 3; ++c) a[r][c] += w[i] * x[i][r] * x[i][c];
      a[r][3] += w[i] * x[i][r] * y[i];
    }
  }
  for (int r = 0; r < 3; ++r) {
    if (use[r]) continue;
    for (int c = 0; c < 4; ++c) a[r][c] = 0;
    for (int c = 0; c < 3; ++c) a[c][r] = 0;
    a[r][r] = 1;
  }
  for (int p = 0; p < 3; ++p) {  // Gauss-Jordan with partial pivoting
    int best = p;
    for (int r = p + 1; r < 3; ++r) {
      if (std::fabs(a[r][p]) > std::fabs(a[best][p])) best = r;
    }
    for (int c = 0; c < 4; ++c) std::swap(a[p][c], a[best][c]);
    if (std::fabs(a[p][p]) < 1e-300) return {0, 0, 0};
    for (int r = 0; r < 3; ++r) {
      if (r == p) continue;
      const double f = a[r][p] / a[p][p];
      for (int c = 0; c < 4; ++c) a[r][c] -= f * a[p][c];
    }
  }
  return {a[0][3] / a[0][0], a[1][3] / a[1][1], a[2][3] / a[2][2]};
}

struct Point {
  std::array<double, 3> x;
  double ms;
  std::string what;
};

absl::Status Run(const FlagSet& f) {
  for (const char* flag : {"threads", "block-size", "max-context", "max-batch", "reps"}) {
    if (f.GetInt(flag) < 1) return absl::InvalidArgumentError(absl::StrCat("--", flag, " must be at least 1"));
  }
  std::string dir = f.GetString("model");
  if (dir.empty()) {
    ASSIGN_OR_RETURN(dir, testing::EnsureCachedModel("tiny"));
  }
  auto backend = kernels::NewCpuBackend(static_cast<int>(f.GetInt("threads")));
  ASSIGN_OR_RETURN(std::unique_ptr<engine::Model> model, engine::Model::Load(dir, backend.get()));
  const int64_t bs = f.GetInt("block-size");
  const int64_t max_ctx = std::min<int64_t>(model->config().max_position_embeddings, f.GetInt("max-context"));
  const int64_t max_batch = f.GetInt("max-batch");
  engine::BlockPool pool(model->KvLayoutFor(bs), (max_ctx / bs + 2) * std::max<int64_t>(max_batch, 8));
  const int reps = static_cast<int>(f.GetInt("reps"));
  // A grid of shapes is timed in `reps` passes, each shape once per pass,
  // and each keeps its median: a slow spell of the machine (this VM's speed
  // drifts by 10-20% for tens of seconds at a time) then spoils one of a
  // shape's timings, not all of them.
  struct Shape {
    std::function<absl::Status()> run;
    bool warm = false;  // run once untimed before each timing
    Point point;        // x and label; ms is the median
    std::vector<double> ms;
  };
  auto time_grid = [&](std::vector<Shape>& grid, const char* what) -> absl::Status {
    for (int pass = 0; pass < reps; ++pass) {
      std::fprintf(stderr, "[duet profile] %s: pass %d of %d over %zu shapes\n", what, pass + 1, reps, grid.size());
      for (Shape& shape : grid) {
        if (shape.warm) RETURN_IF_ERROR(shape.run());
        const auto start = std::chrono::steady_clock::now();
        RETURN_IF_ERROR(shape.run());
        shape.ms.push_back(Seconds(start) * 1e3);
      }
    }
    for (Shape& shape : grid) {
      std::sort(shape.ms.begin(), shape.ms.end());
      shape.point.ms = shape.ms[shape.ms.size() / 2];
      std::fprintf(stderr, "[duet profile] %s %s: %.1f ms\n", what, shape.point.what.c_str(), shape.point.ms);
    }
    return absl::OkStatus();
  };
  std::vector<int32_t> tokens(static_cast<size_t>(max_ctx * max_batch));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(3 + (i * 7919) % 900);

  // Prefill: single prompts and batches, ms against sum(l) and sum(l^2).
  std::vector<Point> prefill;
  std::vector<std::vector<int64_t>> shapes;
  for (int64_t l = 16; l <= max_ctx; l *= 2) shapes.push_back({l});
  for (int64_t n : {2, 4, 8}) {
    for (int64_t l : {32, 128, 256}) {
      if (l <= max_ctx && n <= max_batch) shapes.push_back(std::vector<int64_t>(static_cast<size_t>(n), l));
    }
  }
  std::vector<Shape> prefill_grid;
  for (const auto& lens : shapes) {
    Shape shape;
    shape.run = [&, lens]() -> absl::Status {
      std::vector<SequenceKv> kv;
      std::vector<BatchSeq> batch;
      kv.reserve(lens.size());
      for (size_t i = 0; i < lens.size(); ++i) {
        kv.emplace_back(&pool);
        RETURN_IF_ERROR(kv.back().Reserve(lens[i]));
      }
      for (size_t i = 0; i < lens.size(); ++i) {
        batch.push_back({.tokens = absl::MakeConstSpan(tokens).subspan(i * max_ctx, lens[i]),
                         .start_pos = 0,
                         .block_table = kv[i].block_table(),
                         .logit_rows = {static_cast<int32_t>(lens[i] - 1)}});
      }
      return model->Forward(batch, pool).status();
    };
    double s1 = 0, s2 = 0;
    for (int64_t l : lens) {
      s1 += static_cast<double>(l);
      s2 += static_cast<double>(l) * static_cast<double>(l);
    }
    // Short batches are bound by reading the weights: warm them as the decode
    // shapes are (long ones are compute-bound).
    shape.warm = s1 <= 256;
    shape.point = {{1, s1, s2}, 0, absl::StrCat(lens.size(), " x ", lens[0], " tokens")};
    prefill_grid.push_back(std::move(shape));
  }
  RETURN_IF_ERROR(time_grid(prefill_grid, "prefill"));
  for (const Shape& shape : prefill_grid) prefill.push_back(shape.point);
  // Decode: batch sizes x contexts, one step, ms against sum(context) and
  // batch size. Batches 1, 2 and 3 are all timed: on the CPU backend one
  // sequence is a matrix-vector product and a few are dot products per
  // weight row, so the cost per sequence bends there. Every sequence holds
  // the longest context's KV (the first is prefilled, its blocks copied to
  // the others); a step at a shorter context reads only the positions before
  // it. Each shape runs once untimed before each timing: right after other
  // work (the prefills, another shape) the first pass over the weights reads
  // cold memory on some machines, and the workers' steps follow each other hot.
  std::vector<Point> decode;
  std::vector<int64_t> contexts;
  for (int64_t ctx : {int64_t{16}, int64_t{64}, int64_t{256}, int64_t{512}, max_ctx / 4, max_ctx / 2}) {
    if (ctx >= 1 && ctx + 1 <= max_ctx && std::find(contexts.begin(), contexts.end(), ctx) == contexts.end()) {
      contexts.push_back(ctx);
    }
  }
  std::sort(contexts.begin(), contexts.end());
  std::vector<int64_t> batches;
  for (int64_t n = 1; n <= max_batch; n = n < 4 ? n + 1 : (n & (n - 1)) == 0 ? n + n / 2 : n / 3 * 4) {
    batches.push_back(n);
  }
  if (batches.back() != max_batch) batches.push_back(max_batch);
  if (!contexts.empty()) {
    const int64_t longest = contexts.back();
    std::vector<SequenceKv> kv;
    kv.reserve(static_cast<size_t>(max_batch));
    for (int64_t i = 0; i < max_batch; ++i) {
      kv.emplace_back(&pool);
      RETURN_IF_ERROR(kv.back().Reserve(longest + 1));
    }
    std::fprintf(stderr, "[duet profile] decode: a context of %lld tokens for %lld sequences\n",
                 static_cast<long long>(longest), static_cast<long long>(max_batch));
    BatchSeq ctx_seq{.tokens = absl::MakeConstSpan(tokens).subspan(0, static_cast<size_t>(longest)),
                     .start_pos = 0,
                     .block_table = kv[0].block_table()};
    RETURN_IF_ERROR(model->Forward({&ctx_seq, 1}, pool).status());  // untimed
    const int64_t stride = model->KvLayoutFor(bs).BlockStride();
    for (size_t i = 1; i < kv.size(); ++i) {
      for (size_t j = 0; j < kv[0].block_table().size(); ++j) {
        std::memcpy(pool.data() + kv[i].block_table()[j] * stride, pool.data() + kv[0].block_table()[j] * stride,
                    static_cast<size_t>(pool.block_bytes()));
      }
    }
    std::vector<Shape> decode_grid;
    for (int64_t n : batches) {
      for (int64_t ctx : contexts) {
        std::vector<BatchSeq> batch;
        for (int64_t i = 0; i < n; ++i) {
          batch.push_back({.tokens = absl::MakeConstSpan(tokens).subspan(static_cast<size_t>(ctx), 1),
                           .start_pos = ctx,
                           .block_table = kv[static_cast<size_t>(i)].block_table(),
                           .logit_rows = {0}});
        }
        Shape shape;
        shape.run = [&, batch]() { return model->Forward(batch, pool).status(); };
        shape.warm = true;
        shape.point = {{1, static_cast<double>(n * ctx), static_cast<double>(n)}, 0,
                       absl::StrCat(n, " x context ", ctx)};
        decode_grid.push_back(std::move(shape));
      }
    }
    RETURN_IF_ERROR(time_grid(decode_grid, "decode"));
    for (const Shape& shape : decode_grid) decode.push_back(shape.point);
  }
  // Fits minimise the relative error (rows weighted by 1/ms^2): a step of
  // 40 ms matters as much to TPOT as one of 400 to a long prompt's TTFT.
  // The idle penalty: one decode step after the engine sat idle for each
  // gap, against the same step hot. On some machines (this VM) the first
  // pass over the weights after a second or more in which nothing read
  // memory costs several times a hot one (any core reading other memory
  // meanwhile avoids it); duet sim charges it to a batch that starts after
  // the whole cluster sat idle.
  std::vector<std::pair<double, double>> idle_penalty;
  {
    std::vector<double> gaps;
    for (absl::string_view g : absl::StrSplit(f.GetString("idle-gaps"), ',', absl::SkipEmpty())) {
      double x = 0;
      if (!absl::SimpleAtod(g, &x) || !(x > 0) || (!gaps.empty() && x <= gaps.back())) {
        return absl::InvalidArgumentError("--idle-gaps: rising positive seconds, comma-separated");
      }
      gaps.push_back(x);
    }
    if (!gaps.empty()) {
      const int64_t ctx = std::min<int64_t>(64, max_ctx - 1);
      SequenceKv kv(&pool);
      RETURN_IF_ERROR(kv.Reserve(ctx + 1));
      BatchSeq b{.tokens = absl::MakeConstSpan(tokens).subspan(0, static_cast<size_t>(ctx)),
                 .start_pos = 0,
                 .block_table = kv.block_table()};
      RETURN_IF_ERROR(model->Forward({&b, 1}, pool).status());
      auto step = [&]() -> absl::StatusOr<double> {
        BatchSeq d{.tokens = absl::MakeConstSpan(tokens).subspan(static_cast<size_t>(ctx), 1),
                   .start_pos = ctx,
                   .block_table = kv.block_table(),
                   .logit_rows = {0}};
        const auto start = std::chrono::steady_clock::now();
        RETURN_IF_ERROR(model->Forward({&d, 1}, pool).status());
        return Seconds(start) * 1e3;
      };
      std::vector<double> hot;
      for (int i = 0; i < 5; ++i) {
        ASSIGN_OR_RETURN(double ms, step());
        hot.push_back(ms);
      }
      std::sort(hot.begin(), hot.end());
      for (double gap : gaps) {
        std::fprintf(stderr, "[duet profile] a decode step after %g s idle (twice)\n", gap);
        double sum = 0;
        for (int i = 0; i < 2; ++i) {
          std::this_thread::sleep_for(std::chrono::duration<double>(gap));
          ASSIGN_OR_RETURN(double ms, step());
          sum += ms;
        }
        idle_penalty.push_back({gap, std::max(0.0, sum / 2 - hot[2])});
      }
    }
  }
  auto fit = [](const std::vector<Point>& pts, std::array<bool, 3> use) {
    std::vector<std::array<double, 3>> x;
    std::vector<double> y, w;
    for (const Point& p : pts) {
      x.push_back(p.x);
      y.push_back(p.ms);
      w.push_back(1 / (p.ms * p.ms));
    }
    return Fit3(x, y, w, use);
  };
  auto predict = [](const Point& p, const std::vector<double>& c) {
    return c[0] + c[1] * p.x[1] + c[2] * p.x[2];
  };
  auto squared_error = [&](const std::vector<Point>& pts, const std::vector<double>& c) {
    double e = 0;
    for (const Point& p : pts) e += std::pow((predict(p, c) - p.ms) / p.ms, 2);
    return e;
  };
  if (prefill.size() < 3 || decode.size() < 3) {
    return absl::InvalidArgumentError(absl::StrCat("too few shapes to fit three coefficients (", prefill.size(),
                                                   " prefill, ", decode.size(),
                                                   " decode): raise --max-context or --max-batch"));
  }
  const std::vector<double> zero = {0, 0, 0};
  const std::vector<double> pc = fit(prefill, {true, true, true});
  // Decode in two regimes, as DistServe's format allows: batches below the
  // threshold use decoding_smallbs, the rest decoding_largebs. On the CPU
  // backend one sequence is a matrix-vector product and several a packed
  // GEMM, so the cost per sequence changes with the batch. The threshold with
  // the smallest error wins (none: one set for all). A side with one batch
  // size fits no per-sequence term (it would be the intercept's twin).
  // Decode points with batch < t, the rest.
  auto split = [&](int64_t t) {
    std::pair<std::vector<Point>, std::vector<Point>> parts;
    for (const Point& p : decode) (p.x[2] < static_cast<double>(t) ? parts.first : parts.second).push_back(p);
    return parts;
  };
  auto batch_sizes = [](const std::vector<Point>& pts) {
    std::set<double> b;
    for (const Point& p : pts) b.insert(p.x[2]);
    return b.size();
  };
  int64_t threshold = int64_t{1} << 30;
  std::vector<double> dc_small = fit(decode, {true, true, true}), dc_large = dc_small;
  double best = dc_small == zero ? std::numeric_limits<double>::infinity() : squared_error(decode, dc_small);
  for (int64_t t : batches) {
    if (t < 2) continue;
    const auto [small, large] = split(t);
    if (small.size() < 3 || large.size() < 3) continue;
    const std::vector<double> s = fit(small, {true, true, batch_sizes(small) > 1});
    const std::vector<double> l = fit(large, {true, true, batch_sizes(large) > 1});
    if (s == zero || l == zero) continue;
    const double e = squared_error(small, s) + squared_error(large, l);
    if (e < best) {
      best = e;
      threshold = t;
      dc_small = s;
      dc_large = l;
    }
  }
  // duet's own decode table: per profiled batch size, a + b sum(context)
  // over its contexts. duet sim interpolates between batch sizes, which
  // follows the bends two linear regimes cannot (the GEMV of one sequence,
  // the dot kernel of a few, the packed GEMM of many).
  std::vector<std::array<double, 3>> by_batch;
  for (int64_t n : batches) {
    std::vector<Point> pts;
    for (const Point& p : decode) {
      if (p.x[2] == static_cast<double>(n)) pts.push_back(p);
    }
    if (pts.empty()) continue;
    const std::vector<double> c = fit(pts, {true, pts.size() > 1, false});
    if (c == zero) continue;
    by_batch.push_back({static_cast<double>(n), c[0], c[1]});
  }
  if (pc == zero || !std::isfinite(best)) {
    return absl::InternalError("the shapes do not determine the coefficients (singular fit)");
  }
  auto report = [&](const char* what, const std::vector<Point>& pts, const std::vector<double>& c) {
    double worst = 0;
    std::vector<double> errs;
    for (const Point& p : pts) {
      const double e = std::fabs(predict(p, c) - p.ms) / p.ms;
      errs.push_back(e);
      worst = std::max(worst, e);
    }
    std::sort(errs.begin(), errs.end());
    std::printf("%s: [%.6g, %.6g, %.6g]; over %zu shapes: median error %.1f%%, worst %.1f%%\n", what, c[0], c[1], c[2],
                pts.size(), errs[errs.size() / 2] * 100, worst * 100);
  };
  const std::string name = std::filesystem::path(dir).filename().string();
  std::printf("duet profile: %s on this machine's CPU backend, %lld thread(s), ms per batch\n", name.c_str(),
              static_cast<long long>(f.GetInt("threads")));
  report("prefill ms = a + b sum(l) + c sum(l^2)", prefill, pc);
  if (threshold >= (int64_t{1} << 30)) {
    report("decode  ms = a + b sum(context) + c batch", decode, dc_small);
  } else {
    const auto [small, large] = split(threshold);
    const std::string s = absl::StrCat("decode  ms = a + b sum(context) + c batch, batch < ", threshold);
    const std::string l = absl::StrCat("decode  ms = a + b sum(context) + c batch, batch >= ", threshold);
    report(s.c_str(), small, dc_small);
    report(l.c_str(), large, dc_large);
  }
  if (!by_batch.empty()) {
    std::vector<double> errs;
    for (const Point& p : decode) {
      for (const auto& row : by_batch) {
        if (row[0] == p.x[2]) errs.push_back(std::fabs(row[1] + row[2] * p.x[1] - p.ms) / p.ms);
      }
    }
    std::sort(errs.begin(), errs.end());
    std::printf("decode  ms = a + b sum(context) for each of %zu batch sizes (duet sim's table): over %zu shapes: "
                "median error %.1f%%, worst %.1f%%\n",
                by_batch.size(), errs.size(), errs[errs.size() / 2] * 100, errs.back() * 100);
  }
  nlohmann::ordered_json entry;
  entry["decoding_large_small_bs_threshold"] = threshold;  // batches below it: decoding_smallbs
  entry["prefill"] = pc;
  entry["decoding_smallbs"] = dc_small;
  entry["decoding_largebs"] = dc_large;
  // duet's extension: [[batch, a, b], ...]; duet sim prefers it.
  if (!by_batch.empty()) entry["decoding_by_batch"] = by_batch;
  if (!idle_penalty.empty()) {
    std::string line = "idle penalty, extra ms of the first step after:";
    for (const auto& [gap, ms] : idle_penalty) absl::StrAppend(&line, " ", gap, " s: ", absl::StrFormat("%.1f", ms), ";");
    std::printf("%s\n", line.c_str());
  }
  nlohmann::ordered_json out;
  out[name]["1"] = entry;
  // duet's extension, beside the TP entries: [[idle seconds, extra ms], ...].
  if (!idle_penalty.empty()) out[name]["idle_penalty_ms"] = idle_penalty;
  const std::string path = f.GetString("out").empty() ? absl::StrCat(name, "-profile.json") : f.GetString("out");
  std::ofstream(path) << out.dump(2) << "\n";
  std::printf("wrote %s (duet sim --model %s --latency %s)\n", path.c_str(), dir.c_str(), path.c_str());
  return absl::OkStatus();
}

}  // namespace

int RunProfile(int argc, char** argv) {
  FlagSet f("duet profile",
            "Times the duet engine over a grid of prefill batches and decode steps on this machine and fits the "
            "latency coefficients (DistServe's format, TP 1) that duet sim --latency reads.");
  f.String("model", "", "model directory (default: the embedded tiny model)");
  f.Int("threads", 1, "engine threads, as the workers will run");
  f.Int("block-size", 16, "KV block size in tokens");
  f.Int("max-context", 1024, "longest prompt and context profiled");
  f.Int("max-batch", 16, "largest decode batch profiled");
  f.Int("reps", 3, "passes over the grid, each timing every shape once (each shape keeps its median)");
  f.String("idle-gaps", "0.5,1,2,4,8",
           "idle spells (seconds, rising) after which a decode step is timed against a hot one; the extra "
           "time is written as idle_penalty_ms, which duet sim charges to a batch that starts after the whole "
           "cluster sat idle that long "
           "(empty: skip)");
  f.String("out", "", "where to write the JSON (default <model>-profile.json)");
  return RunWithFlags(f, argc, argv, Run);
}

}  // namespace duet::tools
