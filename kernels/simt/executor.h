// What the emulated runtime (runtime.cc) asks of the SIMT executor
// (executor.cc): one block of a launch run to its end, and the process's
// fault record and seed. Not for kernels, which see kernels/simt/simt.h.
#ifndef DUET_KERNELS_SIMT_EXECUTOR_H_
#define DUET_KERNELS_SIMT_EXECUTOR_H_

#include <cstdint>
#include <functional>
#include <string>

#include "kernels/simt/simt.h"

namespace duet::simt {

// Runs block `idx` of a launch of `kernel` (`body` is the kernel with its
// arguments) with its threads' order drawn from `block_seed`; returns its
// fault, "" when it ran clean.
std::string RunBlock(const char* kernel, dim3 grid, dim3 block, uint3 idx, uint64_t block_seed,
                     const std::function<void()>& body);

void SetLastFault(const std::string& fault);
uint64_t Seed();

}  // namespace duet::simt

#endif  // DUET_KERNELS_SIMT_EXECUTOR_H_
