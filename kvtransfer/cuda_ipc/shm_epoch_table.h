// SharedEpochTable: a block-epoch table (kvtransfer/transport.h, "Leases and
// epochs") in a POSIX shared-memory segment, so that importers on the same
// host read the exporter's epochs directly, before and after their copies,
// with no message to the exporter.
//
//   auto table = SharedEpochTable::Create("/duet-kv-123-ab-1", num_blocks).value();  // exporter
//   auto view = SharedEpochTable::Open("/duet-kv-123-ab-1", num_blocks).value();     // importer
//   table->Bump(7);  assert(view->Load(7) == 1);
//
// The creator owns the name and unlinks it on destruction; an importer's
// mapping stays valid after that (POSIX semantics) and reads the last
// epochs. A crashed exporter leaves /dev/shm/<name> behind: names carry the
// pid so operators can tell whose it was. Segments are created mode 0600, so
// importer and exporter must run as the same user.
//
// Thread-safe: the words are a kvtransfer::EpochTable over the mapping.
#ifndef DUET_KVTRANSFER_CUDA_IPC_SHM_EPOCH_TABLE_H_
#define DUET_KVTRANSFER_CUDA_IPC_SHM_EPOCH_TABLE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kvtransfer/epoch_table.h"

namespace duet::kvtransfer::cuda_ipc {

class SharedEpochTable {
 public:
  // Creates `name` (it must not exist: AlreadyExists) with num_blocks epochs at 0.
  static absl::StatusOr<std::unique_ptr<SharedEpochTable>> Create(const std::string& name,
                                                                  int64_t num_blocks);
  // Maps an existing table read-only. NotFound if it does not exist;
  // InvalidArgument if it is not a table of num_blocks blocks.
  static absl::StatusOr<std::unique_ptr<SharedEpochTable>> Open(const std::string& name,
                                                                int64_t num_blocks);
  ~SharedEpochTable();
  SharedEpochTable(const SharedEpochTable&) = delete;
  SharedEpochTable& operator=(const SharedEpochTable&) = delete;

  // CHECK-fails on a block outside [0, num_blocks) (callers validate first).
  uint64_t Load(int64_t block) const { return table_.Load(block); }
  // Owner only (CHECK): ends every lease on `block`.
  void Bump(int64_t block);
  // The words, for checking a pull's promises (EpochTable::Broken).
  const EpochTable& table() const { return table_; }

  const std::string& name() const { return name_; }
  int64_t num_blocks() const { return num_blocks_; }
  bool owner() const { return owner_; }

 private:
  SharedEpochTable(std::string name, int64_t num_blocks, bool owner, void* mapping,
                   size_t mapping_bytes);
  std::string name_;
  int64_t num_blocks_;
  bool owner_;
  void* mapping_;
  size_t mapping_bytes_;
  EpochTable table_;
};

}  // namespace duet::kvtransfer::cuda_ipc

#endif  // DUET_KVTRANSFER_CUDA_IPC_SHM_EPOCH_TABLE_H_
