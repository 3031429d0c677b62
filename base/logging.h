// Minimal logging and invariant checks (Debian's abseil has no absl/log).
//
//   LOG(INFO) << "loaded " << n << " tensors";
//   CHECK(block < num_blocks_) << "block id out of range: " << block;
//
// LOG writes one line to stderr with a timestamp and the source location.
// CHECK is for invariants whose failure means a bug: it logs and aborts.
// Recoverable errors are absl::Status, never CHECK. Thread-safe.
#ifndef DUET_BASE_LOGGING_H_
#define DUET_BASE_LOGGING_H_

#include <sstream>

namespace duet {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kFatal = 4 };

// Lines below this level are dropped. Default kInfo; DUET_LOG_LEVEL=debug|info|
// warning|error in the environment overrides it at start-up.
void SetMinLogLevel(LogLevel level);
LogLevel MinLogLevel();

namespace logging_internal {

class LogMessage {
 public:
  LogMessage(const char* file, int line, LogLevel level);
  ~LogMessage();  // Writes the line; aborts for kFatal.
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

// Swallows the stream when a level is disabled, so arguments are not built.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace logging_internal
}  // namespace duet

#define DUET_LOG_LEVEL_DEBUG ::duet::LogLevel::kDebug
#define DUET_LOG_LEVEL_INFO ::duet::LogLevel::kInfo
#define DUET_LOG_LEVEL_WARNING ::duet::LogLevel::kWarning
#define DUET_LOG_LEVEL_ERROR ::duet::LogLevel::kError
#define DUET_LOG_LEVEL_FATAL ::duet::LogLevel::kFatal

#define LOG(level)                                                  \
  (DUET_LOG_LEVEL_##level < ::duet::MinLogLevel())                  \
      ? (void)0                                                     \
      : ::duet::logging_internal::Voidify() &                       \
            ::duet::logging_internal::LogMessage(__FILE__, __LINE__, \
                                                 DUET_LOG_LEVEL_##level) \
                .stream()

#define CHECK(cond)                                                        \
  (cond) ? (void)0                                                         \
         : ::duet::logging_internal::Voidify() &                           \
               ::duet::logging_internal::LogMessage(__FILE__, __LINE__,    \
                                                    ::duet::LogLevel::kFatal) \
                       .stream()                                           \
                   << "Check failed: " #cond " "

#define CHECK_EQ(a, b) CHECK((a) == (b))
#define CHECK_NE(a, b) CHECK((a) != (b))
#define CHECK_LT(a, b) CHECK((a) < (b))
#define CHECK_LE(a, b) CHECK((a) <= (b))
#define CHECK_GT(a, b) CHECK((a) > (b))
#define CHECK_GE(a, b) CHECK((a) >= (b))

#endif  // DUET_BASE_LOGGING_H_
