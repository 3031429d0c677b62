// The Kubernetes actuator, driven by the SLA planner through the live loop,
// against a stand-in for the API server (the real one cannot run here): it
// serves the apps/v1 `scale` subresource of two Deployments in one
// namespace and refuses what the real one would (a missing or stale bearer
// token 401, another namespace 403 as the namespaced Role does, an unknown
// Deployment 404, a patch that is not a merge patch 415, a body that is not
// a scale 422). The planner must scale the right Deployment, only within
// its minimum and maximum, read a rotated token, change nothing on an
// error, and pick up the replicas when restarted.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "autoscale/actuator.h"
#include "autoscale/live_planner.h"
#include "base/io_thread.h"
#include "http/server.h"
#include "placement/hardware.h"
#include "placement/latency.h"
#include "placement/model.h"
#include "placement/place.h"
#include "placement/planner.h"

namespace duet::autoscale {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

// The API server's answer for one namespace's Deployments.
class ApiStandIn {
 public:
  ApiStandIn(std::string ns, std::map<std::string, int> replicas) : ns_(std::move(ns)), replicas_(std::move(replicas)) {
    auto s = http::HttpServer::Start(io_.context(), "127.0.0.1:0",
                                     [this](http::HttpRequest req, http::HttpExchangePtr ex) {
                                       ex->Reply(Handle(req));
                                     });
    REQUIRE(s.ok());
    server_ = std::move(*s);
  }
  ~ApiStandIn() { server_->Stop(); }
  std::string url() const { return absl::StrCat("http://127.0.0.1:", server_->port()); }
  void set_token(std::string t) {
    absl::MutexLock l(&mu_);
    token_ = std::move(t);
  }
  int replicas(const std::string& d) {
    absl::MutexLock l(&mu_);
    return replicas_.at(d);
  }
  // "PATCH duet-prefill 3", "GET duet-decode", and refusals as "401 GET ...".
  std::vector<std::string> log() {
    absl::MutexLock l(&mu_);
    return log_;
  }
  void clear_log() {
    absl::MutexLock l(&mu_);
    log_.clear();
  }

 private:
  static http::HttpResponse Status(int code, const std::string& reason, const std::string& message) {
    return {.status = code,
            .body = Json{{"kind", "Status"}, {"apiVersion", "v1"}, {"status", "Failure"}, {"message", message},
                         {"reason", reason}, {"code", code}}
                        .dump()};
  }

  http::HttpResponse Handle(const http::HttpRequest& req) {
    absl::MutexLock l(&mu_);
    auto refuse = [&](int code, const std::string& reason, const std::string& message) {
      log_.push_back(absl::StrCat(code, " ", req.method, " ", req.path));
      return Status(code, reason, message);
    };
    auto auth = req.headers.find("authorization");
    if (auth == req.headers.end() || auth->second != "Bearer " + token_) {
      return refuse(401, "Unauthorized", "Unauthorized");
    }
    // /apis/apps/v1/namespaces/NS/deployments/NAME/scale
    std::vector<std::string> p = absl::StrSplit(req.path, '/');
    if (p.size() != 9 || p[1] != "apis" || p[2] != "apps" || p[3] != "v1" || p[4] != "namespaces" ||
        p[6] != "deployments" || p[8] != "scale") {
      return refuse(404, "NotFound", "the server could not find the requested resource");
    }
    if (p[5] != ns_) {
      return refuse(403, "Forbidden",
                    absl::StrCat("deployments.apps \"", p[7], "\" is forbidden: cannot get resource "
                                 "\"deployments/scale\" in the namespace \"", p[5], "\""));
    }
    auto it = replicas_.find(p[7]);
    if (it == replicas_.end()) return refuse(404, "NotFound", absl::StrCat("deployments.apps \"", p[7], "\" not found"));
    if (req.method == "PATCH") {
      auto ct = req.headers.find("content-type");
      if (ct == req.headers.end() || ct->second != "application/merge-patch+json") {
        return refuse(415, "UnsupportedMediaType", "the body of the request was in an unknown format");
      }
      Json body = Json::parse(req.body, nullptr, false);
      if (body.is_discarded() || !body.is_object() || body.size() != 1 || !body.contains("spec") ||
          !body["spec"].is_object() || body["spec"].size() != 1 || !body["spec"]["replicas"].is_number_integer() ||
          body["spec"]["replicas"].get<int>() < 0) {
        return refuse(422, "Invalid", "Scale.autoscaling \"x\" is invalid");
      }
      it->second = body["spec"]["replicas"].get<int>();
      log_.push_back(absl::StrCat("PATCH ", p[7], " ", it->second));
    } else if (req.method == "GET") {
      log_.push_back(absl::StrCat("GET ", p[7]));
    } else {
      return refuse(405, "MethodNotAllowed", "method not allowed");
    }
    return {.body = Json{{"kind", "Scale"},
                         {"apiVersion", "autoscaling/v1"},
                         {"metadata", {{"name", p[7]}, {"namespace", ns_}}},
                         {"spec", {{"replicas", it->second}}},
                         {"status", {{"replicas", it->second}, {"selector", "app.kubernetes.io/component=x"}}}}
                        .dump()};
  }

  IoThread io_;
  std::unique_ptr<http::HttpServer> server_;
  const std::string ns_;
  absl::Mutex mu_;
  std::map<std::string, int> replicas_ ABSL_GUARDED_BY(mu_);
  std::string token_ ABSL_GUARDED_BY(mu_) = "token-1";
  std::vector<std::string> log_ ABSL_GUARDED_BY(mu_);
};

// A pod's service account mount: token, namespace (and ca.crt, unused over http).
std::string ServiceAccountDir(const std::string& ns, const std::string& token) {
  const fs::path dir = fs::path(std::getenv("TEST_TMPDIR")) / absl::StrCat("sa-", ns);
  fs::create_directories(dir);
  std::ofstream(dir / "token") << token << "\n";
  std::ofstream(dir / "namespace") << ns;
  return dir.string();
}

// OPT-13B on DistServe's A100 fit, as planner_test has it; pools of 1..3.
struct PlannerSetup {
  placement::ModelSpec model = placement::ModelPreset("opt-13b").value();
  std::unique_ptr<placement::LatencyModel> latency =
      placement::LoadLatencyModel("placement/testdata/distserve-a100-80g.json", model).value();
  placement::PlannerOptions Options() const {
    placement::PlannerOptions o{.slo = {.ttft = 0.5, .tpot = 0.1},
                                .min_prefill = 1,
                                .max_prefill = 3,
                                .min_decode = 1,
                                .max_decode = 3,
                                .cooldown_s = 60,
                                .max_window_requests = 400};
    const placement::GpuSpec gpu = placement::LoadGpu("a100-80g").value();
    for (placement::InstanceSpec* s : {&o.prefill, &o.decode}) {
      s->kv_capacity_tokens = placement::KvCapacity(model, gpu, s->par);
    }
    return o;
  }
};

// The router's figures for a load: `rate` requests/s of `prompt` and
// `output` tokens at time `now`, the pods that registered (`ready`).
placement::LoadFigures Load(double now, double rate, int64_t prompt, int64_t output, int ready_prefill,
                            int ready_decode) {
  placement::LoadFigures f;
  f.now = now;
  f.interval_s = 30;
  f.arrivals = static_cast<int64_t>(rate * 30);
  f.prompt_lens.assign(static_cast<size_t>(std::max<int64_t>(f.arrivals, 1)), prompt);
  f.output_lens.assign(f.prompt_lens.size(), output);
  f.prefill.ready = ready_prefill;
  f.decode.ready = ready_decode;
  return f;
}

TEST_CASE("the planner scales the right Deployments within their bounds, through the scale subresource") {
  ApiStandIn api("serving", {{"duet-prefill", 2}, {"duet-decode", 2}, {"other", 7}});
  auto k8s = KubernetesActuator::Create({.api = api.url(), .service_account_dir = ServiceAccountDir("serving", "token-1")});
  REQUIRE(k8s.ok());
  PlannerSetup setup;
  placement::Planner planner(setup.model, *setup.latency, setup.Options());
  double now = 0, rate = 40;
  int64_t prompt = 1024, output = 16;
  bool registered = true;  // pods register as soon as they are asked for
  std::vector<std::string> lines;
  LivePlanner live(planner, **k8s,
                   {.figures = [&]() -> absl::StatusOr<placement::LoadFigures> {
                      return Load(now, rate, prompt, output, registered ? api.replicas("duet-prefill") : 1,
                                  registered ? api.replicas("duet-decode") : 1);
                    },
                    .log = [&](const std::string& l) { lines.push_back(l); }});

  // A prefill-heavy load past what three prefill pods serve: prefill to its
  // maximum at once, not beyond.
  REQUIRE(live.Step().ok());
  CHECK(api.replicas("duet-prefill") == 3);
  {  // Unbounded, the same planner would have asked for more.
    placement::PlannerOptions wide = setup.Options();
    wide.max_prefill = 16;
    placement::Planner unbounded(setup.model, *setup.latency, wide);
    CHECK(unbounded.Decide(Load(0, 40, 1024, 16, 2, 2)).prefill > 3);
  }
  CHECK(api.log() == std::vector<std::string>{"GET duet-prefill", "GET duet-decode", "PATCH duet-prefill 3"});
  CHECK(api.replicas("other") == 7);
  CHECK(absl::StrContains(lines.back(), "prefill 2 -> 3"));

  // Pods not registered yet count as starting: nothing is asked twice.
  api.clear_log();
  registered = false;
  now += 30;
  REQUIRE(live.Step().ok());
  CHECK(live.figures().prefill.starting == 2);
  CHECK(live.figures().prefill.planned() == 3);
  for (const std::string& l : api.log()) CHECK_FALSE(absl::StartsWith(l, "PATCH duet-prefill"));
  registered = true;

  // The token is rotated under the pod: the next call reads the new one.
  std::ofstream(ServiceAccountDir("serving", "token-2") + "/token") << "token-2";
  api.set_token("token-2");
  // Quiet: after the cool-down, both pools down to their minimum, not below.
  rate = 0.1;
  prompt = 64;
  for (int i = 0; i < 8; ++i) {
    now += 30;
    REQUIRE(live.Step().ok());
    CHECK(api.replicas("duet-prefill") >= 1);
    CHECK(api.replicas("duet-decode") >= 1);
  }
  CHECK(api.replicas("duet-prefill") == 1);
  CHECK(api.replicas("duet-decode") == 1);
  for (const std::string& l : api.log()) {
    INFO(l);
    CHECK((absl::StartsWith(l, "GET duet-") || absl::StartsWith(l, "PATCH duet-")));  // nothing refused
  }

  // A decode-heavy load: decode grows, within its maximum.
  api.clear_log();
  rate = 30;
  prompt = 32;
  output = 1024;
  now += 30;
  REQUIRE(live.Step().ok());
  CHECK(api.replicas("duet-decode") > 1);
  CHECK(api.replicas("duet-decode") <= 3);
  CHECK(api.replicas("duet-prefill") >= 1);

  // A planner restarted mid-run reads the replicas as they are, and asks
  // for nothing it does not need.
  placement::Planner restarted(setup.model, *setup.latency, setup.Options());
  LivePlanner again(restarted, **k8s, {.figures = [&]() -> absl::StatusOr<placement::LoadFigures> {
                                         return Load(now, rate, prompt, output, api.replicas("duet-prefill"),
                                                     api.replicas("duet-decode"));
                                       }});
  const int decode_before = api.replicas("duet-decode");
  REQUIRE(again.Step().ok());
  CHECK(restarted.last().decode_before == decode_before);
  CHECK(api.replicas("duet-decode") >= decode_before);
  CHECK(api.replicas("other") == 7);
}

TEST_CASE("errors change nothing and say why: RBAC, a wrong name, a stale token, no token") {
  ApiStandIn api("serving", {{"duet-prefill", 2}, {"duet-decode", 2}});
  PlannerSetup setup;
  placement::Planner planner(setup.model, *setup.latency, setup.Options());
  auto figures = [&]() -> absl::StatusOr<placement::LoadFigures> { return Load(0, 40, 1024, 16, 2, 2); };

  // A namespace the service account's Role does not cover.
  auto other_ns = KubernetesActuator::Create(
      {.api = api.url(), .service_account_dir = ServiceAccountDir("serving", "token-1"), .namespace_name = "prod"});
  REQUIRE(other_ns.ok());
  LivePlanner a(planner, **other_ns, {.figures = figures});
  absl::Status st = a.Step();
  CHECK(absl::StrContains(st.message(), "HTTP 403"));
  CHECK(absl::StrContains(st.message(), "forbidden"));

  // A Deployment that is not there.
  auto wrong = KubernetesActuator::Create({.api = api.url(),
                                           .service_account_dir = ServiceAccountDir("serving", "token-1"),
                                           .prefill_deployment = "duet-prefil"});
  REQUIRE(wrong.ok());
  LivePlanner b(planner, **wrong, {.figures = figures});
  st = b.Step();
  CHECK(absl::StrContains(st.message(), "\"duet-prefil\" not found"));

  // A token the API server no longer takes.
  api.set_token("token-9");
  auto stale = KubernetesActuator::Create({.api = api.url(), .service_account_dir = ServiceAccountDir("serving", "token-1")});
  REQUIRE(stale.ok());
  LivePlanner c(planner, **stale, {.figures = figures});
  CHECK(absl::StrContains(c.Step().message(), "HTTP 401"));
  CHECK(api.replicas("duet-prefill") == 2);
  CHECK(api.replicas("duet-decode") == 2);
  for (const std::string& l : api.log()) CHECK_FALSE(absl::StartsWith(l, "PATCH"));

  // No mounted token, no API address.
  CHECK(KubernetesActuator::Create({.api = api.url(), .service_account_dir = "/nonexistent"}).status().code() ==
        absl::StatusCode::kNotFound);
  CHECK(KubernetesActuator::Create({.api = "ftp://x", .service_account_dir = ServiceAccountDir("serving", "t")})
            .status()
            .code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("the dry run changes nothing and says what it would") {
  std::vector<std::string> lines;
  DryRunActuator dry([&](const std::string& l) { lines.push_back(l); });
  placement::LoadFigures f = Load(0, 1, 10, 10, 2, 3);
  REQUIRE(dry.Apply({.prefill = 4, .decode = 3}, f).ok());
  REQUIRE(dry.Apply({.prefill = 2, .decode = 3}, f).ok());
  CHECK(lines == std::vector<std::string>{"dry run: would scale prefill 2 -> 4", "dry run: no change"});
}

}  // namespace
}  // namespace duet::autoscale
