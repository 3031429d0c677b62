// Status propagation macros (Debian's abseil predates abseil's own).
//
//   RETURN_IF_ERROR(file.Read(buf));
//   ASSIGN_OR_RETURN(auto model, Model::Load(dir));
#ifndef DUET_BASE_STATUS_MACROS_H_
#define DUET_BASE_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define DUET_CONCAT_INNER_(a, b) a##b
#define DUET_CONCAT_(a, b) DUET_CONCAT_INNER_(a, b)

#define RETURN_IF_ERROR(expr)                  \
  do {                                         \
    ::absl::Status duet_status_ = (expr);      \
    if (!duet_status_.ok()) return duet_status_; \
  } while (0)

#define ASSIGN_OR_RETURN(lhs, expr) \
  DUET_ASSIGN_OR_RETURN_IMPL_(DUET_CONCAT_(duet_statusor_, __LINE__), lhs, expr)

#define DUET_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                \
  if (!statusor.ok()) return statusor.status();          \
  lhs = std::move(statusor).value()

#endif  // DUET_BASE_STATUS_MACROS_H_
