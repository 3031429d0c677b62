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
#include "kernels/factory.h"
#include "placement/profile_fit.h"
#include "tools/commands.h"
#include "tools/load_flags.h"
#include "engine/testing/model_maker.h"

namespace duet::tools {
namespace {

using engine::BatchSeq;
using engine::SequenceKv;

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

using placement::ProfilePoint;

absl::Status Run(const FlagSet& f) {
  for (const char* flag : {"threads", "block-size", "max-context", "max-batch", "reps"}) {
    if (f.GetInt(flag) < 1) return absl::InvalidArgumentError(absl::StrCat("--", flag, " must be at least 1"));
  }
  std::string dir = f.GetString("model");
  if (dir.empty()) {
    ASSIGN_OR_RETURN(dir, testing::EnsureCachedModel("tiny"));
  }
  ASSIGN_OR_RETURN(const engine::LoadOptions load, LoadOptionsFromFlags(f));
  ASSIGN_OR_RETURN(kernels::KernelBackendPtr backend,
                   kernels::NewBackend(load.Backend(static_cast<int>(f.GetInt("threads")))));
  ASSIGN_OR_RETURN(std::unique_ptr<engine::Model> model, engine::Model::Load(dir, backend.get(), load));
  const int64_t bs = f.GetInt("block-size");
  const int64_t max_ctx = std::min<int64_t>(model->config().max_position_embeddings, f.GetInt("max-context"));
  const int64_t max_batch = f.GetInt("max-batch");
  engine::BlockPool pool(model->KvLayoutFor(bs), (max_ctx / bs + 2) * std::max<int64_t>(max_batch, 8),
                         backend->DefaultBufferType());
  const int reps = static_cast<int>(f.GetInt("reps"));
  // A grid of shapes is timed in `reps` passes, each shape once per pass,
  // and each keeps its median: a slow spell of the machine (this VM's speed
  // drifts by 10-20% for tens of seconds at a time) then spoils one of a
  // shape's timings, not all of them.
  struct Shape {
    std::function<absl::Status()> run;
    bool warm = false;  // run once untimed before each timing
    ProfilePoint point;  // ms is the median
    std::string label;
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
      std::fprintf(stderr, "[duet profile] %s %s: %.1f ms\n", what, shape.label.c_str(), shape.point.ms);
    }
    return absl::OkStatus();
  };
  std::vector<int32_t> tokens(static_cast<size_t>(max_ctx * max_batch));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(3 + (i * 7919) % 900);

  // Prefill: single prompts and batches, ms against sum(l) and sum(l^2).
  std::vector<ProfilePoint> prefill;
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
    shape.point = {{1, s1, s2}, 0};
    shape.label = absl::StrCat(lens.size(), " x ", lens[0], " tokens");
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
  std::vector<ProfilePoint> decode;
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
    for (size_t i = 1; i < kv.size(); ++i) {
      for (size_t j = 0; j < kv[0].block_table().size(); ++j) {
        RETURN_IF_ERROR(pool.CopyBlock(kv[0].block_table()[j], kv[i].block_table()[j]));
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
        shape.point = {{1, static_cast<double>(n * ctx), static_cast<double>(n)}, 0};
        shape.label = absl::StrCat(n, " x context ", ctx);
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
  ASSIGN_OR_RETURN(const placement::ProfileFit fit, placement::FitProfile(prefill, decode, batches));
  auto report = [&](const char* what, const std::vector<ProfilePoint>& pts, const std::vector<double>& c) {
    double worst = 0;
    std::vector<double> errs;
    for (const ProfilePoint& p : pts) {
      const double e = std::fabs(placement::Predict(p, c) - p.ms) / p.ms;
      errs.push_back(e);
      worst = std::max(worst, e);
    }
    std::sort(errs.begin(), errs.end());
    std::printf("%s: [%.6g, %.6g, %.6g]; over %zu shapes: median error %.1f%%, worst %.1f%%\n", what, c[0], c[1], c[2],
                pts.size(), errs[errs.size() / 2] * 100, worst * 100);
  };
  const std::string name = std::filesystem::path(dir).filename().string();
  std::printf("duet profile: %s on this machine's %s backend, %lld thread(s), ms per batch\n", name.c_str(),
              load.device.c_str(), static_cast<long long>(f.GetInt("threads")));
  report("prefill ms = a + b sum(l) + c sum(l^2)", prefill, fit.prefill);
  if (fit.threshold == placement::kOneDecodeRegime) {
    report("decode  ms = a + b sum(context) + c batch", decode, fit.decode_small);
  } else {
    const auto [small, large] = placement::SplitDecode(decode, fit.threshold);
    const std::string s = absl::StrCat("decode  ms = a + b sum(context) + c batch, batch < ", fit.threshold);
    const std::string l = absl::StrCat("decode  ms = a + b sum(context) + c batch, batch >= ", fit.threshold);
    report(s.c_str(), small, fit.decode_small);
    report(l.c_str(), large, fit.decode_large);
  }
  if (!fit.by_batch.empty()) {
    std::vector<double> errs;
    for (const ProfilePoint& p : decode) {
      for (const auto& row : fit.by_batch) {
        if (row[0] == p.x[2]) errs.push_back(std::fabs(row[1] + row[2] * p.x[1] - p.ms) / p.ms);
      }
    }
    std::sort(errs.begin(), errs.end());
    std::printf("decode  ms = a + b sum(context) for each of %zu batch sizes (duet sim's table): over %zu shapes: "
                "median error %.1f%%, worst %.1f%%\n",
                fit.by_batch.size(), errs.size(), errs[errs.size() / 2] * 100, errs.back() * 100);
  }
  if (!idle_penalty.empty()) {
    std::string line = "idle penalty, extra ms of the first step after:";
    for (const auto& [gap, ms] : idle_penalty) absl::StrAppend(&line, " ", gap, " s: ", absl::StrFormat("%.1f", ms), ";");
    std::printf("%s\n", line.c_str());
  }
  nlohmann::ordered_json out;
  out[name]["1"] = placement::ProfileEntry(fit);
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
  AddLoadFlags(f);
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
