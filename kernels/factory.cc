#include "kernels/factory.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace duet::kernels {
namespace {

struct Registry {
  absl::Mutex mu;
  std::map<std::string, BackendMaker> makers ABSL_GUARDED_BY(mu);
};

Registry& Makers() {
  static Registry* const registry = new Registry;  // never destroyed: makers outlive static teardown
  return *registry;
}

}  // namespace

bool RegisterBackend(const std::string& kind, BackendMaker make) {
  Registry& r = Makers();
  absl::MutexLock lock(&r.mu);
  r.makers[kind] = std::move(make);
  return true;
}

absl::StatusOr<KernelBackendPtr> NewBackend(const BackendOptions& options) {
  if (options.kind == "cpu") {
    if (options.activation_dtype.has_value() && *options.activation_dtype != DType::kF32) {
      return absl::InvalidArgumentError(absl::StrCat("the CPU backend computes in f32, not ",
                                                     DTypeName(*options.activation_dtype), " activations"));
    }
    return NewCpuBackend(options.threads, options.cpu_kernels);
  }
  BackendMaker make;
  {
    Registry& r = Makers();
    absl::MutexLock lock(&r.mu);
    if (auto it = r.makers.find(options.kind); it != r.makers.end()) make = it->second;
  }
  if (make) return make(options);
  if (options.kind == "cuda") {
    return absl::UnimplementedError("this binary has no CUDA backend: build it with --config=cuda");
  }
  if (options.kind == "cuda-emulated") {
    return absl::UnimplementedError(
        "this binary has no emulated CUDA device: a --config=cuda build runs the CUDA backend on the GPU (cuda)");
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown kernel backend \"", options.kind, "\" (cpu | cuda | cuda-emulated)"));
}

}  // namespace duet::kernels
