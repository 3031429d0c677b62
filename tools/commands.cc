#include "tools/commands.h"

#include <cstdio>
#include <string>

namespace duet::tools {

int RunWithFlags(FlagSet& flags, int argc, char** argv, absl::FunctionRef<absl::Status(const FlagSet&)> run) {
  if (absl::Status s = flags.Parse(argc, argv); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 2;
  }
  if (flags.help_requested()) {
    std::fputs(flags.Usage().c_str(), stdout);
    return 0;
  }
  if (absl::Status s = run(flags); !s.ok()) {
    std::fprintf(stderr, "%s: %s\n", flags.command().c_str(), s.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace duet::tools
