// Measured machine limits (the roofline) that duet's CPU benchmarks compare
// against: memory bandwidth (STREAM, cross-checked with Debian's mbw) and what
// OpenBLAS reaches on linear-layer shapes.
//
//   StreamResult s = RunStreamTriad(AvailableCores());
//   double ratio = my_kernel_gb_per_s / s.triad_gb_per_s;
//
// Benchmarks call these in the same run as the figure they report (STYLE rule
// 9), so the ratio reflects the machine as loaded at that moment. Every call
// is heavy (hundreds of MiB, all cores, seconds): call once per run, never on
// a serving path. Not thread-safe with each other: they all want every core,
// and the OpenBLAS ones change OpenBLAS's process-wide thread count.
#ifndef DUET_TOOLS_BENCH_ROOFLINE_H_
#define DUET_TOOLS_BENCH_ROOFLINE_H_

#include <cstddef>
#include <string>

namespace duet::bench {

struct StreamResult {
  double triad_gb_per_s;  // 1e9 bytes/s, STREAM's byte count (see below).
  double copy_gb_per_s;
  int threads;
  size_t array_bytes;  // Per array; three arrays are allocated.
};

// All-core STREAM: copy c[i] = a[i] and triad a[i] = b[i] + s * c[i] on
// float64 arrays, each thread owning one contiguous slice that it also
// first-touches (so pages land on its NUMA node). Best of `repeats`. Bytes are
// counted as STREAM does: copy 2 x 8, triad 3 x 8 per element (write-allocate
// traffic is not counted). Plain stores, not non-temporal ones: this is the
// bandwidth an ordinary kernel sees. array_bytes_each = 0 picks STREAM's rule,
// 4x the last-level cache per array, with at least 256 MiB over all three and
// at most a quarter of physical memory. threads must be >= 1.
StreamResult RunStreamTriad(int threads, size_t array_bytes_each = 0,
                            int repeats = 10);

struct MbwResult {
  bool ok;
  double memcpy_mib_per_s;  // mbw's "AVG ... Copy:" figure.
  std::string error;        // Why not ok (mbw missing, failed, unparsable).
};

// Runs Debian's `/usr/bin/mbw -q -n iterations -t0 mib` (single-threaded
// memcpy) as a child process: an independent check on RunStreamTriad, from a
// tool people already trust. Never crashes on a missing or odd mbw; ok=false.
MbwResult RunMbw(size_t mib = 256, int iterations = 5);

// mbw counts MiB copied (each byte read once and written once); STREAM copy
// counts bytes read plus bytes written. So the STREAM-copy equivalent is
// 2 x mbw, converted from MiB to 1e9 bytes. 0 when !r.ok.
double MbwAsStreamCopyGbPerS(const MbwResult& r);

// GFLOP/s of cblas_sgemm for C[m,n] = A[m,k] * W[n,k]^T (row-major, W
// transposed: a linear layer with weights [out, in]), with OpenBLAS set to
// `threads`. One warm-up, then repeats until min_seconds; best time counts.
double MeasureSgemmGflops(int m, int n, int k, int threads,
                          double min_seconds = 0.3);

// Weight bytes per second (n * k * 4 / time) of cblas_sgemv y = W[n,k] x, the
// decode-step (batch 1) shape. The same W is reused, so a W that fits in the
// last-level cache gives the cache-resident rate, not DRAM's.
double MeasureSgemvGbPerS(int n, int k, int threads, double min_seconds = 0.3);

// The largest data/unified cache of cpu0 in bytes, from
// /sys/devices/system/cpu/cpu0/cache/index*/size; 0 when sysfs lacks it. In a
// VM this is what the hypervisor reports, often the whole host socket's L3.
int LastLevelCacheBytes();

}  // namespace duet::bench

#endif  // DUET_TOOLS_BENCH_ROOFLINE_H_
