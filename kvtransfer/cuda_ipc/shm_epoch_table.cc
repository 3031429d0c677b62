#include "kvtransfer/cuda_ipc/shm_epoch_table.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/logging.h"
#include "kvtransfer/cuda_ipc/ipc_wire.h"

namespace duet::kvtransfer::cuda_ipc {
namespace {

// The segment: a header that lets an importer check it mapped a table of the
// size it was promised, then one uint64 epoch per block.
struct TableHeader {
  uint64_t magic;
  uint64_t num_blocks;
};
constexpr uint64_t kTableMagic = 0x314843'4f5045'4b44ULL;  // "DKEPOCH1"-ish.
constexpr int64_t kMaxBlocks = int64_t{1} << 28;

size_t TableBytes(int64_t num_blocks) {
  return sizeof(TableHeader) + static_cast<size_t>(num_blocks) * sizeof(uint64_t);
}

absl::Status Errno(absl::string_view what, const std::string& name, int err) {
  std::string message = absl::StrCat(what, "(", name, "): ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(message);
  if (err == EEXIST) return absl::AlreadyExistsError(message);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(message);
  if (err == ENOSPC || err == ENOMEM || err == EMFILE || err == ENFILE) {
    return absl::ResourceExhaustedError(message);
  }
  return absl::InternalError(message);
}

absl::Status CheckArgs(const std::string& name, int64_t num_blocks) {
  absl::Status status = ValidateShmName(name);
  if (!status.ok()) return status;
  if (num_blocks <= 0 || num_blocks > kMaxBlocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("epoch table needs 1..", kMaxBlocks, " blocks, got ", num_blocks));
  }
  return absl::OkStatus();
}

}  // namespace

SharedEpochTable::SharedEpochTable(std::string name, int64_t num_blocks, bool owner, void* mapping,
                                   size_t mapping_bytes)
    : name_(std::move(name)),
      num_blocks_(num_blocks),
      owner_(owner),
      mapping_(mapping),
      mapping_bytes_(mapping_bytes),
      table_(reinterpret_cast<uint64_t*>(static_cast<char*>(mapping) + sizeof(TableHeader)), num_blocks) {}

absl::StatusOr<std::unique_ptr<SharedEpochTable>> SharedEpochTable::Create(const std::string& name,
                                                                           int64_t num_blocks) {
  absl::Status args = CheckArgs(name, num_blocks);
  if (!args.ok()) return args;
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return Errno("shm_open", name, errno);
  size_t bytes = TableBytes(num_blocks);
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int err = errno;
    close(fd);
    shm_unlink(name.c_str());
    return Errno("ftruncate", name, err);
  }
  void* mapping = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);
  if (mapping == MAP_FAILED) {
    shm_unlink(name.c_str());
    return Errno("mmap", name, err);
  }
  // ftruncate zero-fills: every epoch starts at 0. The magic goes last so a
  // racing Open never accepts a half-initialised header.
  auto* header = static_cast<TableHeader*>(mapping);
  header->num_blocks = static_cast<uint64_t>(num_blocks);
  std::atomic_ref<uint64_t>(header->magic).store(kTableMagic, std::memory_order_release);
  return std::unique_ptr<SharedEpochTable>(
      new SharedEpochTable(name, num_blocks, /*owner=*/true, mapping, bytes));
}

absl::StatusOr<std::unique_ptr<SharedEpochTable>> SharedEpochTable::Open(const std::string& name,
                                                                         int64_t num_blocks) {
  absl::Status args = CheckArgs(name, num_blocks);
  if (!args.ok()) return args;
  int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return Errno("shm_open", name, errno);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return Errno("fstat", name, err);
  }
  size_t bytes = TableBytes(num_blocks);
  if (static_cast<uint64_t>(st.st_size) != bytes) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("epoch table ", name, " is ", st.st_size,
                                                   " bytes, want ", bytes, " for ", num_blocks,
                                                   " blocks"));
  }
  void* mapping = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);
  if (mapping == MAP_FAILED) return Errno("mmap", name, err);
  auto* header = static_cast<TableHeader*>(mapping);
  if (std::atomic_ref<uint64_t>(header->magic).load(std::memory_order_acquire) != kTableMagic ||
      header->num_blocks != static_cast<uint64_t>(num_blocks)) {
    munmap(mapping, bytes);
    return absl::InvalidArgumentError(
        absl::StrCat("shm segment ", name, " is not an epoch table of ", num_blocks, " blocks"));
  }
  return std::unique_ptr<SharedEpochTable>(
      new SharedEpochTable(name, num_blocks, /*owner=*/false, mapping, bytes));
}

SharedEpochTable::~SharedEpochTable() {
  munmap(mapping_, mapping_bytes_);
  if (owner_) shm_unlink(name_.c_str());
}

void SharedEpochTable::Bump(int64_t block) {
  CHECK(owner_) << "only the exporter bumps epochs of " << name_;
  table_.Bump(block);
}

}  // namespace duet::kvtransfer::cuda_ipc
