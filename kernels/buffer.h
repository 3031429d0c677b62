// Memory belongs to the backend: a BufferType allocates Buffers in its
// device's memory (the host's for the CPU backend), and whoever holds a
// Buffer reaches its bytes from the host only by an explicit copy (Write,
// Read, Fill, CopyFrom), so a device backend needs no other path.
//
//   kernels::BufferType& type = backend->DefaultBufferType();
//   ASSIGN_OR_RETURN(kernels::BufferPtr kv, type.Allocate(bytes, "kv pool"));
//   RETURN_IF_ERROR(kv->Write(offset, host_bytes, n));   // host -> buffer
//   RETURN_IF_ERROR(kv->Read(offset, host_bytes, n));    // buffer -> host
//
// base() is the buffer's address in its device's memory: for the backend's
// own ops and for registering the memory with a transport, never for the
// engine to read or write through. Buffers are zero-filled when allocated.
// A Buffer must not outlive its type; calls on one Buffer are made from one
// thread at a time, as the backend's ops are.
#ifndef DUET_KERNELS_BUFFER_H_
#define DUET_KERNELS_BUFFER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace duet::kernels {

class BufferType;

class Buffer {
 public:
  virtual ~Buffer() = default;

  virtual const BufferType& type() const = 0;
  virtual int64_t bytes() const = 0;
  virtual const std::string& name() const = 0;  // "kv pool": said in errors
  virtual void* base() const = 0;

  // InvalidArgument (naming the buffer) for a range outside it; each copy is
  // done when the call returns.
  virtual absl::Status Write(int64_t offset, const void* host, int64_t bytes) = 0;
  virtual absl::Status Read(int64_t offset, void* host, int64_t bytes) const = 0;
  virtual absl::Status Fill(int64_t offset, int64_t bytes, uint8_t value) = 0;
  // this[dst_offset ..) = src[src_offset ..), `bytes` of them (the ranges
  // may be of one buffer but must not overlap); Unimplemented for a source
  // this buffer's type cannot read.
  virtual absl::Status CopyFrom(const Buffer& src, int64_t src_offset, int64_t dst_offset, int64_t bytes) = 0;
};

using BufferPtr = std::unique_ptr<Buffer>;

// A buffer in memory the host addresses (the host type's, a test type's):
// its copies are memcpy and memset over base(), each range checked, each
// run inside Access (which a type that guards its memory overrides).
class HostAddressedBuffer : public Buffer {
 public:
  absl::Status Write(int64_t offset, const void* host, int64_t bytes) override;
  absl::Status Read(int64_t offset, void* host, int64_t bytes) const override;
  absl::Status Fill(int64_t offset, int64_t bytes, uint8_t value) override;
  // From another buffer the host addresses (type().IsHost()).
  absl::Status CopyFrom(const Buffer& src, int64_t src_offset, int64_t dst_offset, int64_t bytes) override;

 protected:
  virtual void Access(absl::FunctionRef<void()> copy) const { copy(); }

 private:
  uint8_t* At(int64_t offset) const { return static_cast<uint8_t*>(base()) + offset; }
};

class BufferType {
 public:
  virtual ~BufferType() = default;
  virtual std::string Name() const = 0;  // "host"
  // Whether the host can address its buffers' memory (inside ops).
  virtual bool IsHost() const = 0;
  // A zero-filled buffer of `bytes` > 0; ResourceExhausted when the memory
  // cannot be had.
  virtual absl::StatusOr<BufferPtr> Allocate(int64_t bytes, const std::string& name) = 0;
};

// Host memory: page-aligned, asking for transparent huge pages (the KV pool
// lives in one), the CPU backend's type. Its Allocate CHECK-fails, as
// base/huge_buffer does, where the kernel refuses the mapping.
BufferType& HostMemoryType();

// InvalidArgument unless [offset, offset + bytes) lies inside `buffer`
// (bytes >= 0, no overflow): the one range check of every Buffer.
absl::Status CheckRange(const Buffer& buffer, int64_t offset, int64_t bytes);

}  // namespace duet::kernels

#endif  // DUET_KERNELS_BUFFER_H_
