// Latency models: how long one prefill batch or one decode step takes on an
// instance of a given tensor- and pipeline-parallel degree.
//
//   ASSIGN_OR_RETURN(auto lm, LoadLatencyModel("distserve-a100-80g.json", model));
//   double s = lm->Prefill({.tp = 2}, {512, 1024});   // seconds
//
// Kinds:
//   - roofline: max(FLOPs / (tp x peak x compute_eff), bytes read / (tp x
//     bandwidth x memory_eff)) per batch (weights once, in the bytes of the
//     model's weight dtype, every sequence's KV; a quantized model's
//     dequantization counted as FLOPs, RooflineCoefficients),
//     plus two all-reduces per layer when tp > 1 (ring: 2(tp-1)/tp of the
//     activations over the node link, plus a latency each), plus a fixed
//     overhead; with pp stages, each hand-off sends the activations over
//     the node link and pays a fixed cost (PipelineSeconds).
//   - distserve: DistServe's fitted format (per model and TP):
//     prefill ms = a + b * sum(l) + c * sum(l^2); decode ms = a + b *
//     sum(context) + c * batch size, small and large batch sets split at a
//     threshold. No PP entries: the TP time through pp stages with a fixed
//     hand-off cost each (PipelineSeconds).
//
// Pipeline parallelism adds throughput, not speed: every model's time for
// (tp, pp) is one batch's latency through all pp stages, each running 1/pp
// of the layers one after another, so it is the pp = 1 time plus the
// hand-offs. The simulator keeps up to pp batches of an instance in flight,
// one per stage: stage 1 takes the next batch time / pp after the last.
//   - constant (seconds per prefill batch and per decode step) and
//     exponential (each batch's time drawn with that mean, seeded): for
//     checking the simulator against queueing theory.
// A JSON file picks the kind: {"kind": "roofline", "gpu": ..., coefficients}
// or a DistServe profile (model ids at the top level). Shorthands:
// "constant:P,D", "exponential:P,D", "roofline:GPU".
#ifndef DUET_PLACEMENT_LATENCY_H_
#define DUET_PLACEMENT_LATENCY_H_

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "placement/hardware.h"
#include "placement/model.h"

namespace duet::placement {

struct Parallel {
  int tp = 1;
  int pp = 1;
  int gpus() const { return tp * pp; }
};

class LatencyModel {
 public:
  virtual ~LatencyModel() = default;
  // Seconds for one prefill batch of these prompt lengths.
  virtual double Prefill(const Parallel& p, absl::Span<const int64_t> prompt_lens) = 0;
  // Seconds for one decode step over these context lengths (one token each).
  virtual double Decode(const Parallel& p, absl::Span<const int64_t> context_lens) = 0;
  // Whether this model knows (tp, pp) (DistServe fits cover some TP only).
  virtual bool Supports(const Parallel& p) const { return true; }
  // Extra seconds the first batch or step pays after the instance has been
  // idle this long (a machine whose memory goes cold when untouched; 0 on
  // GPUs and in every model but a measured profile that says otherwise).
  virtual double IdlePenalty(double idle_s) const { return 0; }
  virtual std::string Describe() const = 0;
};

struct RooflineCoefficients {
  double compute_efficiency = 0.6;
  double memory_efficiency = 0.8;
  double overhead_s = 0.002;           // per batch or step (launches, scheduling)
  double allreduce_latency_s = 10e-6;  // per all-reduce
  double pp_stage_overhead_s = 0.5e-3;
  // A quantized linear weight (ModelSpec::QuantizedWeights) is unpacked to
  // BF16 (zero point, scale: 2 operations) once per forward pass, on the
  // CUDA cores, which run about 1/16 of the tensor cores' dense BF16 rate on
  // A100 and H100 (19.5 of 312, 67 of 989 TFLOP/s): 32 FLOPs of the
  // roofline's rate per weight. Against a batch of T tokens' 2T per weight,
  // that is what W4A16 kernels lose at large batches (16/T); decode, bound
  // by reading the weights, hides it.
  double dequant_flops_per_weight = 32;
};

// One forward pass that batches prompt chunks with decode rows, as a
// colocated engine with chunked prefill runs them: each row rides in the
// prompts' matrix products as one more token (a prefill of the prompts and
// one-token sequences), and adds its attention over its context (the rows'
// decode step less the same rows at no context). Charging the rows a decode
// step's per-row cost instead put the duet engine's mixed passes of 2-4
// rows 6-14% over what they took (two runs of the serve bench's colocated
// cluster); this way the medians land within 5%. Either span may be empty:
// then it is the other phase's own cost.
// A batch's latency through pp stages: the one-stage (pp = 1) time plus a
// hand-off (the activations' send and the next stage's launch) at each of
// the pp - 1 stage boundaries.
double PipelineSeconds(double one_stage_s, int pp, double handoff_s);

// `base` plus a fixed cost on every prefill batch and decode step:
// fixed_s + per_context_token_s x the tokens of its prompts or contexts
// (DistServe's simulator adds 2 ms + 0.0001 ms per context token for its
// Ray calls; duet sim --batch-overhead-ms).
std::unique_ptr<LatencyModel> NewOverheadLatency(std::unique_ptr<LatencyModel> base, double fixed_s,
                                                 double per_context_token_s);

double ForwardPassSeconds(LatencyModel& m, const Parallel& p, absl::Span<const int64_t> prompt_lens,
                          absl::Span<const int64_t> context_lens);

// `inner` with prefill free: a decode pool measured alone (its requests'
// prompts computed instantly). `inner` is not owned.
class DecodeOnlyLatency : public LatencyModel {
 public:
  explicit DecodeOnlyLatency(LatencyModel& inner) : inner_(inner) {}
  double Prefill(const Parallel&, absl::Span<const int64_t>) override { return 0; }
  double Decode(const Parallel& p, absl::Span<const int64_t> c) override { return inner_.Decode(p, c); }
  bool Supports(const Parallel& p) const override { return inner_.Supports(p); }
  std::string Describe() const override { return inner_.Describe(); }

 private:
  LatencyModel& inner_;
};

// `base` as one instance measured it: each batch or step takes a factor
// times as long as `base` says (an instance slower or faster than the
// profile: a straggler, a machine whose speed drifts, or what serving adds
// beyond the forward pass a profile times). `factor_by_rows` gives the
// factor by the decode rows in a step ([rows, factor], rising rows): linear
// between them, the nearest outside; a prefill batch has 0 rows. The idle
// penalty stays as is. `base` is not owned.
std::unique_ptr<LatencyModel> NewScaledLatency(LatencyModel* base,
                                               std::vector<std::pair<int64_t, double>> factor_by_rows);
// The factor of `table` (as above) at `rows`; 1 for an empty table.
double FactorAtRows(const std::vector<std::pair<int64_t, double>>& table, int64_t rows);

std::unique_ptr<LatencyModel> NewConstantLatency(double prefill_s, double decode_s);
std::unique_ptr<LatencyModel> NewExponentialLatency(double mean_prefill_s, double mean_decode_s, uint64_t seed);
std::unique_ptr<LatencyModel> NewRooflineLatency(ModelSpec model, GpuSpec gpu, RooflineCoefficients c = {});

// DistServe's fitted coefficients for one model, by TP.
struct DistServeFit {
  struct Coefficients {
    double prefill[3];
    double decode_small[3];
    double decode_large[3];
    int64_t threshold = 95;
    // duet profile's extension, "decoding_by_batch": [[batch, a, b], ...]
    // with rising batches, a decode step of that batch costing a + b
    // sum(context) ms. When present it replaces the two regimes: linear
    // between the listed batches, the first below them, and past the last
    // the last one's, each further row adding the last two's slope of `a`
    // (never falling).
    std::vector<std::array<double, 3>> decode_by_batch;
  };
  std::map<int, Coefficients> by_tp;
  double pp_stage_overhead_s = 0.5e-3;
  // duet profile's extension (DistServe's files have none): (idle seconds,
  // extra ms) points, increasing; linear between them, flat past the last.
  std::vector<std::pair<double, double>> idle_penalty_ms;
};
std::unique_ptr<LatencyModel> NewDistServeLatency(DistServeFit fit, std::string name);
// Reads a DistServe profile file and picks the entry for `model` (matched by
// the preset's Hugging Face id or name, e.g. "facebook/opt-13b").
absl::StatusOr<DistServeFit> LoadDistServeFit(const std::string& path, const ModelSpec& model);

// The prefill seconds that caching `tokens` tokens after a prefix of
// `prefix` saves, by `model`: one prompt of prefix + tokens less the prefix
// alone (the batch's fixed cost is paid either way), at least 1 ns. PGDSF's
// cost of a cached run, in the workers' prefix caches and the simulator's.
double PrefillSavedSeconds(LatencyModel& model, const Parallel& par, int64_t prefix, int64_t tokens);

// A spec string ("constant:P,D", "exponential:P,D", "roofline:GPU") or a
// JSON file; `seed` feeds the exponential model.
absl::StatusOr<std::unique_ptr<LatencyModel>> LoadLatencyModel(const std::string& spec, const ModelSpec& model,
                                                               uint64_t seed = 1);

}  // namespace duet::placement

#endif  // DUET_PLACEMENT_LATENCY_H_
