// Little-endian byte writer and bounds-checked reader for the small versioned
// records transports exchange over the control plane (addresses, region
// descriptors). Internal to kvtransfer.
//
//   ByteWriter w; w.U32(kMagic); w.Blob(rkey); std::string bytes = w.Take();
//   ByteReader r(bytes); uint32_t magic; if (!r.U32(&magic)) return Malformed();
//
// A reader never reads past its input: every getter returns false instead,
// so a malformed record is an error, never a crash (STYLE rule 10).
//
// RecordFormat is the header the GPU transports' records share (magic, kind,
// version) and the errors naming them:
//
//   constexpr RecordFormat kFormat{"nccl", "an nccl record", 0x434e4b44, 1};
//   ByteWriter w = kFormat.Start(kKindRegion);
//   RETURN_IF_ERROR(kFormat.ReadHeader(r, "region descriptor", kKindRegion));
#ifndef DUET_KVTRANSFER_WIRE_H_
#define DUET_KVTRANSFER_WIRE_H_

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace duet::kvtransfer {

class ByteWriter {
 public:
  void U16(uint16_t v) { Int(v, 2); }
  void U32(uint32_t v) { Int(v, 4); }
  void U64(uint64_t v) { Int(v, 8); }
  // A u32 length, then the bytes.
  void Blob(absl::string_view bytes) {
    U32(static_cast<uint32_t>(bytes.size()));
    out_.append(bytes.data(), bytes.size());
  }
  std::string Take() { return std::move(out_); }

 private:
  void Int(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  std::string out_;
};

class ByteReader {
 public:
  explicit ByteReader(absl::string_view in) : in_(in) {}
  bool U16(uint16_t* v) { return Int(v, 2); }
  bool U32(uint32_t* v) { return Int(v, 4); }
  bool U64(uint64_t* v) { return Int(v, 8); }
  // At most max_bytes, so a corrupt length cannot ask for a huge allocation.
  bool Blob(std::string* bytes, uint32_t max_bytes) {
    uint32_t n;
    if (!U32(&n) || n > max_bytes || n > in_.size()) return false;
    bytes->assign(in_.data(), n);
    in_.remove_prefix(n);
    return true;
  }
  bool done() const { return in_.empty(); }

 private:
  template <typename T>
  bool Int(T* v, int n) {
    if (in_.size() < static_cast<size_t>(n)) return false;
    uint64_t x = 0;
    for (int i = 0; i < n; ++i) x |= static_cast<uint64_t>(static_cast<uint8_t>(in_[i])) << (8 * i);
    *v = static_cast<T>(x);
    in_.remove_prefix(n);
    return true;
  }
  absl::string_view in_;
};

// A record is u32 magic, u16 kind, u16 version, then its fields.
struct RecordFormat {
  const char* transport;  // "cuda_ipc": errors start "cuda_ipc <what>: ".
  const char* record;     // "a cuda_ipc record": what a bad magic is not.
  uint32_t magic = 0;
  uint16_t version = 0;

  ByteWriter Start(uint16_t kind) const {
    ByteWriter w;
    w.U32(magic);
    w.U16(kind);
    w.U16(version);
    return w;
  }
  // InvalidArgument "<transport> <what>: <why>".
  absl::Status Malformed(absl::string_view what, absl::string_view why) const {
    return absl::InvalidArgumentError(absl::StrCat(transport, " ", what, ": ", why));
  }
  // Checks magic and version; the kind through *kind.
  absl::Status ReadHeader(ByteReader& r, absl::string_view what, uint16_t* kind) const {
    uint32_t m = 0;
    uint16_t v = 0;
    if (!r.U32(&m) || m != magic) return Malformed(what, absl::StrCat("not ", record, " (bad magic)"));
    if (!r.U16(kind) || !r.U16(&v)) return Malformed(what, "truncated header");
    if (v != version) return Malformed(what, absl::StrCat("unsupported version ", v, ", want ", version));
    return absl::OkStatus();
  }
  // ReadHeader of a record that must be of kind `want`.
  absl::Status ReadHeader(ByteReader& r, absl::string_view what, uint16_t want) const {
    uint16_t kind = 0;
    absl::Status s = ReadHeader(r, what, &kind);
    if (s.ok() && kind != want) return Malformed(what, absl::StrCat("record of kind ", kind, ", want ", want));
    return s;
  }
};

}  // namespace duet::kvtransfer

#endif  // DUET_KVTRANSFER_WIRE_H_
