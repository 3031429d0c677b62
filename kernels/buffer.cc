#include "kernels/buffer.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/huge_buffer.h"
#include "base/status_macros.h"

namespace duet::kernels {

absl::Status CheckRange(const Buffer& buffer, int64_t offset, int64_t bytes) {
  int64_t end = 0;
  if (offset < 0 || bytes < 0 || __builtin_add_overflow(offset, bytes, &end) || end > buffer.bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("bytes [", offset, ", ", offset, " + ", bytes, ") are outside ",
                                                   buffer.name(), " (", buffer.bytes(), " bytes)"));
  }
  return absl::OkStatus();
}

absl::Status HostAddressedBuffer::Write(int64_t offset, const void* host, int64_t bytes) {
  RETURN_IF_ERROR(CheckRange(*this, offset, bytes));
  Access([&] { std::memcpy(At(offset), host, static_cast<size_t>(bytes)); });
  return absl::OkStatus();
}

absl::Status HostAddressedBuffer::Read(int64_t offset, void* host, int64_t bytes) const {
  RETURN_IF_ERROR(CheckRange(*this, offset, bytes));
  Access([&] { std::memcpy(host, At(offset), static_cast<size_t>(bytes)); });
  return absl::OkStatus();
}

absl::Status HostAddressedBuffer::Fill(int64_t offset, int64_t bytes, uint8_t value) {
  RETURN_IF_ERROR(CheckRange(*this, offset, bytes));
  Access([&] { std::memset(At(offset), value, static_cast<size_t>(bytes)); });
  return absl::OkStatus();
}

absl::Status HostAddressedBuffer::CopyFrom(const Buffer& src, int64_t src_offset, int64_t dst_offset,
                                           int64_t bytes) {
  if (!src.type().IsHost()) {
    return absl::UnimplementedError(
        absl::StrCat(name(), ": cannot copy from ", src.name(), " (", src.type().Name(), " memory)"));
  }
  RETURN_IF_ERROR(CheckRange(src, src_offset, bytes));
  RETURN_IF_ERROR(CheckRange(*this, dst_offset, bytes));
  Access([&] {
    std::memcpy(At(dst_offset), static_cast<const uint8_t*>(src.base()) + src_offset, static_cast<size_t>(bytes));
  });
  return absl::OkStatus();
}

namespace {

class HostBuffer final : public HostAddressedBuffer {
 public:
  HostBuffer(const BufferType* type, int64_t bytes, std::string name)
      : type_(type), memory_(static_cast<size_t>(bytes)), bytes_(bytes), name_(std::move(name)) {}

  const BufferType& type() const override { return *type_; }
  int64_t bytes() const override { return bytes_; }
  const std::string& name() const override { return name_; }
  void* base() const override { return memory_.data(); }

 private:
  const BufferType* const type_;
  HugeBuffer memory_;  // zero-filled
  const int64_t bytes_;
  const std::string name_;
};

class HostType final : public BufferType {
 public:
  std::string Name() const override { return "host"; }
  bool IsHost() const override { return true; }
  absl::StatusOr<BufferPtr> Allocate(int64_t bytes, const std::string& name) override {
    if (bytes <= 0) return absl::InvalidArgumentError(absl::StrCat(name, ": a buffer of ", bytes, " bytes"));
    return std::make_unique<HostBuffer>(this, bytes, name);
  }
};

}  // namespace

BufferType& HostMemoryType() {
  static HostType* type = new HostType();
  return *type;
}

}  // namespace duet::kernels
