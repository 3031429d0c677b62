#include "base/huge_buffer.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "base/logging.h"

namespace duet {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

}  // namespace

HugeBuffer::HugeBuffer(size_t bytes, bool touch) : size_(bytes) {
  if (bytes == 0) return;
  // Over-map by one huge page so the buffer can start on a 2 MiB boundary,
  // then give back the slack on both sides.
  const size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  const size_t span = rounded + kHugePage;
  void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(raw != MAP_FAILED) << "HugeBuffer: mmap of " << span << " bytes: " << std::strerror(errno);
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kHugePage - 1) / kHugePage * kHugePage;
  if (aligned > start) munmap(raw, aligned - start);
  const uintptr_t end = start + span;
  if (end > aligned + rounded) munmap(reinterpret_cast<void*>(aligned + rounded), end - aligned - rounded);
  data_ = reinterpret_cast<void*>(aligned);
  mapped_ = rounded;
  // Advice only: EINVAL where THP is compiled out is fine.
  (void)madvise(data_, mapped_, MADV_HUGEPAGE);
  if (touch) {
    auto* p = static_cast<volatile char*>(data_);
    for (size_t i = 0; i < mapped_; i += 4096) p[i] = 0;
  }
}

HugeBuffer::~HugeBuffer() {
  if (data_ != nullptr) munmap(data_, mapped_);
}

HugeBuffer::HugeBuffer(HugeBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      mapped_(std::exchange(other.mapped_, 0)) {}

HugeBuffer& HugeBuffer::operator=(HugeBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) munmap(data_, mapped_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
  }
  return *this;
}

}  // namespace duet
