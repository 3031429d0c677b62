#include "base/flags.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "base/logging.h"

namespace duet {

FlagSet::FlagSet(std::string command, std::string summary)
    : command_(std::move(command)), summary_(std::move(summary)) {}

void FlagSet::String(const std::string& name, const std::string& def, const std::string& help) {
  order_.push_back(name);
  flags_[name] = {Kind::kString, def, def, help};
}
void FlagSet::Int(const std::string& name, int64_t def, const std::string& help) {
  order_.push_back(name);
  flags_[name] = {Kind::kInt, std::to_string(def), std::to_string(def), help};
}
void FlagSet::Double(const std::string& name, double def, const std::string& help) {
  order_.push_back(name);
  std::string d = absl::StrCat(def);
  flags_[name] = {Kind::kDouble, d, d, help};
}
void FlagSet::Bool(const std::string& name, const std::string& help) {
  order_.push_back(name);
  flags_[name] = {Kind::kBool, "false", "false", help};
}

absl::Status FlagSet::Set(const std::string& name, Flag& flag, const std::string& value) {
  switch (flag.kind) {
    case Kind::kInt: {
      errno = 0;
      char* end = nullptr;
      long long v = std::strtoll(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || errno == ERANGE) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " wants an integer, got \"", value, "\""));
      }
      flag.value = std::to_string(v);
      break;
    }
    case Kind::kDouble: {
      char* end = nullptr;
      double v = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || !std::isfinite(v)) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " wants a number, got \"", value, "\""));
      }
      flag.value = value;
      break;
    }
    case Kind::kBool:
      if (value != "true" && value != "false" && value != "1" && value != "0") {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " wants true or false, got \"", value, "\""));
      }
      flag.value = (value == "true" || value == "1") ? "true" : "false";
      break;
    case Kind::kString:
      flag.value = value;
      break;
  }
  flag.set = true;
  return absl::OkStatus();
}

absl::Status FlagSet::Parse(int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      help_ = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0) {
      positional_.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    auto it = flags_.find(name);
    if (it == flags_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name, " (see ", command_, " --help)"));
    }
    if (!has_value) {
      if (it->second.kind == Kind::kBool) {
        value = "true";
      } else {
        if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
        value = argv[++i];
      }
    }
    if (auto s = Set(name, it->second, value); !s.ok()) return s;
  }
  return absl::OkStatus();
}

std::string FlagSet::Usage() const {
  std::string out = absl::StrCat("usage: ", command_, " [flags]\n\n", summary_, "\n\nflags:\n");
  for (const std::string& name : order_) {
    const Flag& f = flags_.at(name);
    std::string left = "  --" + name;
    if (f.kind != Kind::kBool) left += f.kind == Kind::kString ? " STR" : (f.kind == Kind::kInt ? " N" : " X");
    if (left.size() < 26) left.resize(26, ' ');
    else left += "\n" + std::string(26, ' ');
    out += left + f.help;
    if (f.kind != Kind::kBool && !f.def.empty()) out += " (default " + f.def + ")";
    out += "\n";
  }
  out += "  --help                  this text\n";
  return out;
}

std::string FlagSet::GetString(const std::string& name) const {
  auto it = flags_.find(name);
  CHECK(it != flags_.end()) << name;
  return it->second.value;
}
int64_t FlagSet::GetInt(const std::string& name) const { return std::strtoll(GetString(name).c_str(), nullptr, 10); }
double FlagSet::GetDouble(const std::string& name) const { return std::strtod(GetString(name).c_str(), nullptr); }
bool FlagSet::GetBool(const std::string& name) const { return GetString(name) == "true"; }
bool FlagSet::IsSet(const std::string& name) const {
  auto it = flags_.find(name);
  CHECK(it != flags_.end()) << name;
  return it->second.set;
}

absl::Status FlagSet::RefuseUnless(bool applies, std::initializer_list<const char*> names,
                                   const std::string& why) const {
  if (applies) return absl::OkStatus();
  for (const char* n : names) {
    if (IsSet(n)) return absl::InvalidArgumentError(absl::StrCat("--", n, " has no effect ", why));
  }
  return absl::OkStatus();
}

std::optional<int> ParseFlagsOrExit(FlagSet& flags, int argc, char** argv) {
  if (absl::Status s = flags.Parse(argc, argv); !s.ok()) {
    std::fprintf(stderr, "%s: %s\n", flags.command().c_str(), std::string(s.message()).c_str());
    return 2;
  }
  if (flags.help_requested()) {
    std::fputs(flags.Usage().c_str(), stdout);
    return 0;
  }
  return std::nullopt;
}

int RunWithFlags(FlagSet& flags, int argc, char** argv, absl::FunctionRef<absl::Status(const FlagSet&)> run,
                 absl::string_view error_prefix) {
  if (std::optional<int> exit = ParseFlagsOrExit(flags, argc, argv)) return *exit;
  if (absl::Status s = run(flags); !s.ok()) {
    const std::string prefix(error_prefix.empty() ? absl::string_view(flags.command()) : error_prefix);
    std::fprintf(stderr, "%s: %s\n", prefix.c_str(), s.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace duet
