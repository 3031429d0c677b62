// HugeBuffer: a large, zero-filled, page-aligned buffer backed by anonymous
// memory that asks the kernel for transparent huge pages (MADV_HUGEPAGE).
// KV pools live in one: 2 MiB pages cut TLB misses in attention and the
// per-page work of process_vm_readv and memory registration for transfers.
//
//   HugeBuffer pool(bytes);   // CHECK-fails only if the kernel has no memory
//   float* kv = pool.As<float>();
//
// Where transparent huge pages are off ("never") the buffer is ordinary
// 4 KiB pages; nothing else changes.
#ifndef DUET_BASE_HUGE_BUFFER_H_
#define DUET_BASE_HUGE_BUFFER_H_

#include <cstddef>
#include <cstdint>

namespace duet {

class HugeBuffer {
 public:
  HugeBuffer() = default;
  // Maps `bytes` (rounded up to 2 MiB); touch = fault every page in now.
  explicit HugeBuffer(size_t bytes, bool touch = false);
  ~HugeBuffer();
  HugeBuffer(HugeBuffer&& other) noexcept;
  HugeBuffer& operator=(HugeBuffer&& other) noexcept;
  HugeBuffer(const HugeBuffer&) = delete;
  HugeBuffer& operator=(const HugeBuffer&) = delete;

  void* data() const { return data_; }
  template <typename T>
  T* As() const {
    return static_cast<T*>(data_);
  }
  size_t size() const { return size_; }  // as asked for

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
  size_t mapped_ = 0;
};

}  // namespace duet

#endif  // DUET_BASE_HUGE_BUFFER_H_
