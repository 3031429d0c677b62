#include "tools/bench/roofline.h"

#include <cblas.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <barrier>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/logging.h"
#include "base/subprocess.h"
#include "tools/bench/timing.h"

// Debian's OpenBLAS cblas.h declares it, but the cblas.h alternative may point
// at another implementation's header; the symbol is always in libopenblas.
extern "C" void openblas_set_num_threads(int);


namespace duet::bench {
namespace {

// Compilers turn a copy loop into a memcpy call, and glibc's memcpy switches
// to non-temporal stores for large copies: that would measure a different
// (faster) path than the one our kernels use, so keep it a plain loop.
#if defined(__clang__)
#define DUET_PLAIN_COPY_LOOP __attribute__((no_builtin("memcpy")))
#elif defined(__GNUC__)
#define DUET_PLAIN_COPY_LOOP \
  __attribute__((optimize("no-tree-loop-distribute-patterns")))
#else
#define DUET_PLAIN_COPY_LOOP
#endif

using CopyFn = void (*)(const double*, double*, size_t);
using TriadFn = void (*)(double*, const double*, const double*, double, size_t);

DUET_PLAIN_COPY_LOOP void CopyBaseline(const double* __restrict a,
                                       double* __restrict c, size_t n) {
  for (size_t i = 0; i < n; ++i) c[i] = a[i];
}

void TriadBaseline(double* __restrict a, const double* __restrict b,
                   const double* __restrict c, double s, size_t n) {
  for (size_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}

#if defined(__x86_64__)
// Same loops, vectorised for AVX2 and picked at run time, so the binary still
// runs on CPUs without it (no -march=native).
__attribute__((target("avx2,fma"))) DUET_PLAIN_COPY_LOOP void CopyAvx2(
    const double* __restrict a, double* __restrict c, size_t n) {
  for (size_t i = 0; i < n; ++i) c[i] = a[i];
}

__attribute__((target("avx2,fma"))) void TriadAvx2(double* __restrict a,
                                                   const double* __restrict b,
                                                   const double* __restrict c,
                                                   double s, size_t n) {
  for (size_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}
#endif

struct StreamKernels {
  CopyFn copy;
  TriadFn triad;
};

StreamKernels PickStreamKernels() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    return {CopyAvx2, TriadAvx2};
  }
#endif
  return {CopyBaseline, TriadBaseline};
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using DoubleArray = std::unique_ptr<double[], FreeDeleter>;

// Untouched: glibc serves large blocks with mmap, so pages are placed on first
// write, by the thread that owns the slice.
DoubleArray AllocateUntouched(size_t count) {
  size_t bytes = (count * sizeof(double) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, bytes);
  CHECK(p != nullptr) << "cannot allocate " << bytes << " bytes for STREAM";
  return DoubleArray(static_cast<double*>(p));
}

size_t AutoArrayBytes() {
  constexpr size_t kMinTotalBytes = size_t{256} << 20;
  size_t each = size_t{4} * static_cast<size_t>(LastLevelCacheBytes());
  each = std::max(each, kMinTotalBytes / 3);
  // A VM may report the host's whole L3; never take more than a quarter of RAM.
  long pages = sysconf(_SC_PHYS_PAGES);
  long page_bytes = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page_bytes > 0) {
    size_t cap = static_cast<size_t>(pages) * static_cast<size_t>(page_bytes) / 12;
    each = std::min(each, cap);
  }
  return each;
}

std::string ReadFirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// "491520K" -> bytes; 0 if unparsable.
size_t ParseCacheSize(const std::string& text) {
  char* end = nullptr;
  unsigned long long value = std::strtoull(text.c_str(), &end, 10);
  if (end == text.c_str()) return 0;
  switch (*end) {
    case 'K': return value << 10;
    case 'M': return value << 20;
    case 'G': return value << 30;
    default: return value;
  }
}

}  // namespace

int LastLevelCacheBytes() {
  int best_level = -1;
  size_t best_bytes = 0;
  for (int i = 0; i < 16; ++i) {
    std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i);
    std::string level_text = ReadFirstLine(dir + "/level");
    if (level_text.empty()) continue;  // Indices need not be dense; keep looking.
    if (ReadFirstLine(dir + "/type") == "Instruction") continue;
    int level = std::atoi(level_text.c_str());
    size_t bytes = ParseCacheSize(ReadFirstLine(dir + "/size"));
    if (level > best_level || (level == best_level && bytes > best_bytes)) {
      best_level = level;
      best_bytes = bytes;
    }
  }
  return static_cast<int>(std::min<size_t>(best_bytes, INT_MAX));
}

StreamResult RunStreamTriad(int threads, size_t array_bytes_each, int repeats) {
  CHECK_GE(threads, 1);
  CHECK_GE(repeats, 1);
  if (array_bytes_each == 0) array_bytes_each = AutoArrayBytes();
  const size_t n = std::max<size_t>(array_bytes_each / sizeof(double), threads);
  DoubleArray a = AllocateUntouched(n), b = AllocateUntouched(n),
              c = AllocateUntouched(n);
  const StreamKernels kernels = PickStreamKernels();
  constexpr double kScalar = 3.0;

  std::barrier sync(threads);
  double best_copy_s = 1e30, best_triad_s = 1e30;  // Written by thread 0 only.

  auto body = [&](int t) {
    const size_t begin = n * t / threads, end = n * (t + 1) / threads;
    const size_t len = end - begin;
    double* pa = a.get() + begin;
    double* pb = b.get() + begin;
    double* pc = c.get() + begin;
    for (size_t i = 0; i < len; ++i) {  // First touch, STREAM's initial values.
      pa[i] = 1.0;
      pb[i] = 2.0;
      pc[i] = 0.0;
    }
    for (int r = 0; r < repeats; ++r) {
      sync.arrive_and_wait();
      Clock::time_point start = Clock::now();
      kernels.copy(pa, pc, len);
      sync.arrive_and_wait();
      if (t == 0) best_copy_s = std::min(best_copy_s, SecondsSince(start));
      start = Clock::now();
      kernels.triad(pa, pb, pc, kScalar, len);
      sync.arrive_and_wait();
      if (t == 0) best_triad_s = std::min(best_triad_s, SecondsSince(start));
    }
  };
  std::vector<std::thread> workers;
  for (int t = 1; t < threads; ++t) workers.emplace_back(body, t);
  body(0);
  for (std::thread& w : workers) w.join();

  // Checks that every slice ran every repeat (a skipped or half-done slice
  // would inflate the figure): a follows 1 -> 2 + 3a, exact in float64.
  double expected = 1.0;
  for (int r = 0; r < repeats; ++r) expected = 2.0 + kScalar * expected;
  for (int t = 0; t < threads; ++t) {
    size_t last = n * (t + 1) / threads - 1;
    CHECK(a[last] == expected) << "STREAM result wrong at " << last << ": "
                               << a[last] << " != " << expected;
  }

  const double elems = static_cast<double>(n);
  StreamResult result;
  result.copy_gb_per_s = 2.0 * sizeof(double) * elems / best_copy_s / 1e9;
  result.triad_gb_per_s = 3.0 * sizeof(double) * elems / best_triad_s / 1e9;
  result.threads = threads;
  result.array_bytes = n * sizeof(double);
  return result;
}

MbwResult RunMbw(size_t mib, int iterations) {
  static constexpr char kMbwPath[] = "/usr/bin/mbw";
  MbwResult result{false, 0.0, ""};
  if (access(kMbwPath, X_OK) != 0) {
    result.error = std::string(kMbwPath) + " not found or not executable (" +
                   std::strerror(errno) + "); install Debian's mbw package";
    return result;
  }
  absl::StatusOr<std::unique_ptr<Subprocess>> mbw = Subprocess::StartWithPipes(
      {kMbwPath, "-q", "-n", std::to_string(iterations), "-t0", std::to_string(mib)}, {}, /*merge_stderr=*/true);
  if (!mbw.ok()) {
    result.error = std::string(mbw.status().message());
    return result;
  }
  (*mbw)->CloseStdin();
  absl::StatusOr<std::string> out = (*mbw)->ReadToEnd(absl::Minutes(10));
  const int status = (*mbw)->Wait();
  const std::string output = out.ok() ? *out : std::string(out.status().message());
  if (!out.ok() || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    result.error = "mbw failed (" + DescribeExit(status) + "): " + output;
    return result;
  }
  // Wanted: "AVG\tMethod: MEMCPY\tElapsed: 0.02\tMiB: 256.0\tCopy: 9876.5 MiB/s"
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("AVG", 0) != 0) continue;
    size_t at = line.find("Copy:");
    if (at == std::string::npos) break;
    const char* start = line.c_str() + at + 5;
    char* end = nullptr;
    double value = std::strtod(start, &end);
    if (end == start || !(value > 0)) break;
    result.ok = true;
    result.memcpy_mib_per_s = value;
    return result;
  }
  result.error = "no \"AVG ... Copy: N MiB/s\" line in mbw output: " + output;
  return result;
}

double MbwAsStreamCopyGbPerS(const MbwResult& r) {
  if (!r.ok) return 0.0;
  return 2.0 * r.memcpy_mib_per_s * 1048576.0 / 1e9;
}

namespace {

// Small values of mixed sign, so neither denormals nor overflow slow BLAS.
std::vector<float> FilledMatrix(size_t count, int seed) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) {
    v[i] = static_cast<float>(static_cast<int>((i * 7 + seed) % 23) - 11) / 64.0f;
  }
  return v;
}

// One warm-up call, then calls until min_seconds have passed; best time.
template <typename Fn>
double BestSeconds(double min_seconds, Fn&& fn) {
  fn();
  double best = 1e30;
  Clock::time_point begin = Clock::now();
  do {
    Clock::time_point start = Clock::now();
    fn();
    best = std::min(best, SecondsSince(start));
  } while (SecondsSince(begin) < min_seconds);
  return best;
}

}  // namespace

double MeasureSgemmGflops(int m, int n, int k, int threads, double min_seconds) {
  CHECK(m > 0 && n > 0 && k > 0 && threads > 0);
  openblas_set_num_threads(threads);
  std::vector<float> a = FilledMatrix(size_t{1} * m * k, 1);
  std::vector<float> w = FilledMatrix(size_t{1} * n * k, 2);
  std::vector<float> c(size_t{1} * m * n);
  double seconds = BestSeconds(min_seconds, [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f,
                a.data(), k, w.data(), k, 0.0f, c.data(), n);
  });
  return 2.0 * m * n * k / seconds / 1e9;
}

double MeasureSgemvGbPerS(int n, int k, int threads, double min_seconds) {
  CHECK(n > 0 && k > 0 && threads > 0);
  openblas_set_num_threads(threads);
  std::vector<float> w = FilledMatrix(size_t{1} * n * k, 3);
  std::vector<float> x = FilledMatrix(k, 4);
  std::vector<float> y(n);
  double seconds = BestSeconds(min_seconds, [&] {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, n, k, 1.0f, w.data(), k, x.data(),
                1, 0.0f, y.data(), 1);
  });
  return 1.0 * n * k * sizeof(float) / seconds / 1e9;
}

}  // namespace duet::bench
