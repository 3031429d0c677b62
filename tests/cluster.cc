#include "tests/cluster.h"

#include <poll.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace duet::testing {
namespace fs = std::filesystem;

namespace {
std::string TempRoot() {
  const char* t = std::getenv("TEST_TMPDIR");
  return t != nullptr ? t : fs::temp_directory_path().string();
}
std::string DuetBinary() { return fs::absolute("tools/duet").string(); }
}  // namespace

Cluster::Cluster() {
  static int counter = 0;
  run_dir_ = absl::StrCat(TempRoot(), "/cluster-", getpid(), "-", counter++);
  fs::remove_all(run_dir_);
  fs::create_directories(run_dir_);
}

Cluster::~Cluster() {
  // Workers first, then the router.
  for (auto it = order_.rbegin(); it != order_.rend(); ++it) procs_[*it]->Terminate(absl::Seconds(5));
}

std::string Cluster::LogTail(const std::string& id) const {
  std::ifstream in(run_dir_ + "/" + id + ".log", std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(in)), {});
  return s.size() > 6000 ? s.substr(s.size() - 6000) : s;
}

// Waits for the ready file with inotify on the run folder, so the wait
// wakes when the file appears, not on a timer.
absl::StatusOr<nlohmann::json> Cluster::WaitReady(const std::string& id, absl::Duration timeout) {
  const std::string path = run_dir_ + "/" + id + ".json";
  int fd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  if (fd < 0) return absl::InternalError("inotify_init1 failed");
  inotify_add_watch(fd, run_dir_.c_str(), IN_MOVED_TO | IN_CLOSE_WRITE);
  const absl::Time deadline = absl::Now() + timeout;
  absl::StatusOr<nlohmann::json> result = absl::DeadlineExceededError(absl::StrCat(id, " not ready; log:\n", LogTail(id)));
  while (absl::Now() < deadline) {
    std::ifstream in(path);
    if (in) {
      nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
      if (!j.is_discarded()) {
        result = j;
        break;
      }
    }
    if (auto st = procs_[id]->TryWait()) {
      result = absl::UnavailableError(absl::StrCat(id, " ", DescribeExit(*st), "; log:\n", LogTail(id)));
      break;
    }
    pollfd p{fd, POLLIN, 0};
    poll(&p, 1, 100);  // A dying child wakes nothing: bound each wait.
    char buf[4096];
    while (read(fd, buf, sizeof(buf)) > 0) {
    }
  }
  close(fd);
  return result;
}

absl::Status Cluster::StartRouter(const std::string& model_dir, const std::vector<std::string>& extra) {
  model_dir_ = model_dir;
  std::vector<std::string> args = {DuetBinary(), "router", "--model", model_dir, "--listen", "127.0.0.1:0",
                                   "--control-listen", "127.0.0.1:0", "--ready-file", run_dir_ + "/router.json"};
  args.insert(args.end(), extra.begin(), extra.end());
  auto p = Subprocess::Start(args, {}, run_dir_ + "/router.log");
  if (!p.ok()) return p.status();
  (*p)->set_name("router");
  procs_["router"] = std::move(*p);
  order_.push_back("router");
  auto r = WaitReady("router", absl::Seconds(60));
  if (!r.ok()) return r.status();
  ready_["router"] = *r;
  control_ = (*r)["control"];
  http_port_ = (*r)["http_port"];
  return absl::OkStatus();
}

absl::Status Cluster::StartWorker(const std::string& role, const std::string& id,
                                  const std::vector<std::string>& extra) {
  std::vector<std::string> args = {DuetBinary(), role == "colocated" ? "worker" : role};
  if (role == "colocated") args.push_back("--role=colocated");
  for (const std::string& a : {std::string("--model"), model_dir_, std::string("--router"), control_,
                               std::string("--worker-id"), id, std::string("--threads"), std::string("1"),
                               std::string("--metrics-port"), std::string("0"), std::string("--ready-file"),
                               run_dir_ + "/" + id + ".json", std::string("--heartbeat-ms"), std::string("200")}) {
    args.push_back(a);
  }
  args.insert(args.end(), extra.begin(), extra.end());
  auto p = Subprocess::Start(args, {}, run_dir_ + "/" + id + ".log");
  if (!p.ok()) return p.status();
  (*p)->set_name(id);
  procs_[id] = std::move(*p);
  order_.push_back(id);
  auto r = WaitReady(id, absl::Seconds(60));
  if (!r.ok()) return r.status();
  ready_[id] = *r;
  return absl::OkStatus();
}

absl::Status Cluster::WaitForWorkers(size_t n, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    auto s = Stats();
    if (s.ok() && s->contains("workers") && (*s)["workers"].size() == n) return absl::OkStatus();
    // Registration is a few round trips away; each /stats call is itself a
    // round trip to the router and bounds this loop's rate.
  }
  return absl::DeadlineExceededError(absl::StrCat("the router did not list ", n, " workers"));
}

absl::StatusOr<http::HttpResult> Cluster::Post(const std::string& path, const std::string& body,
                                               absl::Duration timeout) {
  return http::HttpCall("127.0.0.1", http_port_, "POST", path, body, timeout);
}

absl::StatusOr<http::HttpResult> Cluster::Get(const std::string& path) {
  return http::HttpCall("127.0.0.1", http_port_, "GET", path, "", absl::Seconds(30));
}

absl::StatusOr<nlohmann::json> Cluster::Stats() {
  auto r = Get("/stats");
  if (!r.ok()) return r.status();
  if (r->status != 200) return absl::UnavailableError(absl::StrCat("/stats answered ", r->status));
  auto j = nlohmann::json::parse(r->body, nullptr, false);
  if (j.is_discarded()) return absl::InternalError("/stats is not JSON");
  return j;
}

}  // namespace duet::testing
