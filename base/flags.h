// Command-line flags for duet's subcommands: declared in one place, so that
// parsing, validation and `--help` always agree.
//
//   FlagSet f("duet generate", "Generates tokens from a prompt.");
//   f.Int("max-tokens", 16, "tokens to generate");
//   RETURN_IF_ERROR(f.Parse(argc, argv));  // InvalidArgument naming the flag
//
// Accepts `--name value`, `--name=value` and, for bools, `--name` alone.
// Unknown flags, missing values and ill-typed values are errors.
#ifndef DUET_BASE_FLAGS_H_
#define DUET_BASE_FLAGS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace duet {

class FlagSet {
 public:
  FlagSet(std::string command, std::string summary);

  void String(const std::string& name, const std::string& def, const std::string& help);
  void Int(const std::string& name, int64_t def, const std::string& help);
  void Double(const std::string& name, double def, const std::string& help);
  void Bool(const std::string& name, const std::string& help);

  // Parses argv[first..argc). `--help` sets help_requested().
  absl::Status Parse(int argc, char** argv, int first = 1);

  bool help_requested() const { return help_; }
  const std::string& command() const { return command_; }
  std::string Usage() const;

  std::string GetString(const std::string& name) const;
  int64_t GetInt(const std::string& name) const;
  double GetDouble(const std::string& name) const;
  bool GetBool(const std::string& name) const;
  bool IsSet(const std::string& name) const;  // Given on the command line.
  // InvalidArgument naming the first of `names` given on the command line
  // when it has no effect (`applies` false): "--name has no effect <why>".
  // A flag the chosen mode ignores is an error, never silently dropped.
  absl::Status RefuseUnless(bool applies, std::initializer_list<const char*> names, const std::string& why) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  enum class Kind { kString, kInt, kDouble, kBool };
  struct Flag {
    Kind kind;
    std::string value;
    std::string def;
    std::string help;
    bool set = false;
  };
  absl::Status Set(const std::string& name, Flag& flag, const std::string& value);

  std::string command_, summary_;
  std::vector<std::string> order_;
  std::map<std::string, Flag> flags_;
  std::vector<std::string> positional_;
  bool help_ = false;
};

// The first half of a command's main: parses argv into `flags` (an error:
// printed on stderr, exit code 2) and answers --help (usage on stdout, exit
// code 0). An exit code when main should return it; nullopt: go on.
std::optional<int> ParseFlagsOrExit(FlagSet& flags, int argc, char** argv);

// The common frame of a command's main: ParseFlagsOrExit, then runs
// `run` (an error: "<error_prefix or the command>: <status>" on stderr, exit
// 1; else exit 0).
int RunWithFlags(FlagSet& flags, int argc, char** argv, absl::FunctionRef<absl::Status(const FlagSet&)> run,
                 absl::string_view error_prefix = "");

}  // namespace duet

#endif  // DUET_BASE_FLAGS_H_
