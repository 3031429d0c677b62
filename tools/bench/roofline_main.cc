// Prints this machine's measured limits (tools/bench/roofline.h), the
// references duet's CPU benchmarks divide by.
//
//   bazel run -c opt //tools/bench:roofline_main -- --threads 2
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "base/thread_pool.h"
#include "tools/bench/roofline.h"

namespace {

constexpr char kUsage[] =
    "usage: roofline [--threads N] [--help]\n"
    "  --threads N  threads for STREAM and OpenBLAS (default: all available "
    "cores)\n";

void PrintRow(const char* measure, double value, const char* unit,
              const std::string& note) {
  std::printf("%-26s %10.1f  %-8s %s\n", measure, value, unit, note.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  int threads = duet::AvailableCores();
  for (int i = 1; i < argc; ++i) {
    const char* arg = argv[i];
    const char* value = nullptr;
    if (std::strcmp(arg, "--help") == 0 || std::strcmp(arg, "-h") == 0) {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (std::strcmp(arg, "--threads") == 0 && i + 1 < argc) {
      value = argv[++i];
    } else if (std::strncmp(arg, "--threads=", 10) == 0) {
      value = arg + 10;
    } else {
      std::fprintf(stderr, "unknown or incomplete flag: %s\n%s", arg, kUsage);
      return 2;
    }
    char* end = nullptr;
    long parsed = std::strtol(value, &end, 10);
    if (end == value || *end != '\0' || parsed < 1 || parsed > 4096) {
      std::fprintf(stderr, "--threads wants a positive integer, got '%s'\n", value);
      return 2;
    }
    threads = static_cast<int>(parsed);
  }

  using namespace duet::bench;
  const StreamResult stream = RunStreamTriad(threads);
  const MbwResult mbw = RunMbw();

  std::printf("duet roofline: %d threads, last-level cache %.1f MiB, STREAM "
              "arrays 3 x %.0f MiB\n",
              threads, LastLevelCacheBytes() / 1048576.0,
              stream.array_bytes / 1048576.0);
  std::printf("%-26s %10s  %-8s %s\n", "measure", "value", "unit", "note");
  PrintRow("STREAM copy", stream.copy_gb_per_s, "GB/s", "read+write bytes");
  PrintRow("STREAM triad", stream.triad_gb_per_s, "GB/s", "2 reads + 1 write");
  if (mbw.ok) {
    const double as_copy = MbwAsStreamCopyGbPerS(mbw);
    char note[64];
    std::snprintf(note, sizeof(note), "1 thread; %.2fx STREAM copy",
                  as_copy / stream.copy_gb_per_s);
    PrintRow("mbw memcpy", mbw.memcpy_mib_per_s, "MiB/s", "1 thread, MiB copied");
    PrintRow("mbw as STREAM copy", as_copy, "GB/s", note);
  } else {
    std::printf("%-26s %10s  %-8s %s\n", "mbw memcpy", "n/a", "", mbw.error.c_str());
  }
  struct Shape {
    int m, n, k;
  };
  for (Shape s : {Shape{512, 768, 768}, Shape{512, 2048, 768}, Shape{512, 768, 2048}}) {
    char name[64];
    std::snprintf(name, sizeof(name), "SGEMM %dx%dx%d", s.m, s.n, s.k);
    PrintRow(name, MeasureSgemmGflops(s.m, s.n, s.k, threads), "GFLOP/s",
             "C[m,n] = A[m,k] W[n,k]^T");
  }
  const double gemv = MeasureSgemvGbPerS(2048, 768, threads);
  char note[64];
  std::snprintf(note, sizeof(note), "W bytes (6 MiB, hot); %.2fx triad",
                gemv / stream.triad_gb_per_s);
  PrintRow("SGEMV 2048x768", gemv, "GB/s", note);
  return 0;
}
