#include "autoscale/actuator.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace duet::autoscale {

namespace {

using Json = nlohmann::json;

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* what) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read the ", what, " at ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return std::string(absl::StripAsciiWhitespace(ss.str()));
}

std::string Change(const char* pool, int from, int to) {
  return from == to ? "" : absl::StrCat(" ", pool, " ", from, " -> ", to);
}

}  // namespace

absl::Status DryRunActuator::Apply(const placement::ScaleDecision& d, const placement::LoadFigures& f) {
  const std::string change = absl::StrCat(Change("prefill", f.prefill.planned(), d.prefill),
                                          Change("decode", f.decode.planned(), d.decode));
  log_(change.empty() ? "dry run: no change" : absl::StrCat("dry run: would scale", change));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<KubernetesActuator>> KubernetesActuator::Create(KubernetesOptions o) {
  std::string api = o.api;
  if (api.empty()) {
    const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
    const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
    if (host == nullptr || port == nullptr) {
      return absl::InvalidArgumentError(
          "no API server: give its URL, or run in a pod ($KUBERNETES_SERVICE_HOST and _PORT are unset)");
    }
    // An IPv6 service address needs brackets in a URL.
    const std::string h = std::string(host).find(':') != std::string::npos ? absl::StrCat("[", host, "]") : host;
    api = absl::StrCat("https://", h, ":", port);
  }
  ASSIGN_OR_RETURN(http::Endpoint ep, http::ParseEndpoint(api));
  const std::string token_file = o.service_account_dir + "/token";
  RETURN_IF_ERROR(ReadFile(token_file, "service account token").status());
  if (ep.tls) ep.ca_file = o.service_account_dir + "/ca.crt";
  if (o.namespace_name.empty()) {
    ASSIGN_OR_RETURN(o.namespace_name, ReadFile(o.service_account_dir + "/namespace", "service account namespace"));
  }
  return std::unique_ptr<KubernetesActuator>(new KubernetesActuator(std::move(o), std::move(ep), token_file));
}

std::string KubernetesActuator::ScalePath(const std::string& deployment) const {
  return absl::StrCat("/apis/apps/v1/namespaces/", o_.namespace_name, "/deployments/", deployment, "/scale");
}

absl::StatusOr<Json> KubernetesActuator::Call(const std::string& method, const std::string& deployment,
                                             const std::string& body) {
  // Read each time: a projected token is rotated under the running pod.
  ASSIGN_OR_RETURN(std::string token, ReadFile(token_file_, "service account token"));
  std::map<std::string, std::string> headers = {{"Authorization", "Bearer " + token},
                                                {"Accept", "application/json"}};
  if (!body.empty()) headers["Content-Type"] = "application/merge-patch+json";
  const std::string path = ScalePath(deployment);
  ASSIGN_OR_RETURN(http::HttpResult r, http::HttpCall(api_, method, path, body, o_.timeout, headers));
  if (r.status != 200) {
    // The API server's Status object says why (Forbidden: the RBAC; NotFound: the name).
    std::string why = r.body;
    try {
      why = Json::parse(r.body).value("message", r.body);
    } catch (const Json::exception&) {
    }
    return absl::FailedPreconditionError(absl::StrCat(method, " ", path, ": HTTP ", r.status, ": ", why));
  }
  try {
    return Json::parse(r.body);
  } catch (const Json::exception& e) {
    return absl::DataLossError(absl::StrCat(method, " ", path, ": not JSON: ", e.what()));
  }
}

absl::StatusOr<int> KubernetesActuator::Replicas(const std::string& deployment) {
  ASSIGN_OR_RETURN(Json scale, Call("GET", deployment, ""));
  const Json* n = scale.contains("spec") ? &scale["spec"] : nullptr;
  if (n == nullptr || !n->is_object()) return absl::DataLossError(absl::StrCat(deployment, "'s scale has no spec"));
  // An unset count is 0 (the API server omits zero values).
  const int replicas = n->value("replicas", 0);
  if (replicas < 0) return absl::DataLossError(absl::StrCat(deployment, "'s scale has negative replicas"));
  return replicas;
}

absl::Status KubernetesActuator::Observe(placement::LoadFigures& f) {
  ASSIGN_OR_RETURN(prefill_replicas_, Replicas(o_.prefill_deployment));
  ASSIGN_OR_RETURN(decode_replicas_, Replicas(o_.decode_deployment));
  f.prefill.starting = std::max(0, prefill_replicas_ - f.prefill.ready);
  f.decode.starting = std::max(0, decode_replicas_ - f.decode.ready);
  return absl::OkStatus();
}

absl::Status KubernetesActuator::Apply(const placement::ScaleDecision& d, const placement::LoadFigures&) {
  for (auto [deployment, have, want] : {std::tuple<const std::string&, int*, int>{o_.prefill_deployment,
                                                                                  &prefill_replicas_, d.prefill},
                                        {o_.decode_deployment, &decode_replicas_, d.decode}}) {
    if (*have == want) continue;
    ASSIGN_OR_RETURN(Json scale, Call("PATCH", deployment, Json{{"spec", {{"replicas", want}}}}.dump()));
    *have = scale.contains("spec") ? scale["spec"].value("replicas", want) : want;
  }
  return absl::OkStatus();
}

}  // namespace duet::autoscale
