// The router end to end in one process: a real Router, fake workers speaking
// the real control protocol, and a raw HTTP client on a socket.
#include "router/router.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "base/clock.h"
#include "placement/autoscale.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "router/fake_worker.h"
#include "spec/model_config.h"
#include "engine/testing/tiny_model.h"
#include "base/io_thread.h"
#include "proto/frame.h"

namespace duet::router {
namespace {

using Json = nlohmann::ordered_json;
using testing::FakeWorker;
using testing::FinishFrame;
using testing::FirstTokenFrame;
using testing::TokenFrame;

// A blocking HTTP/1.1 client; reads give up after 20 s so a broken router
// fails the test instead of hanging it.
class Client {
 public:
  struct Head {
    int status = 0;
    std::map<std::string, std::string> headers;  // Lower-case names.
  };

  explicit Client(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd_ >= 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    timeval tv{.tv_sec = 20, .tv_usec = 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  ~Client() { Close(); }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  void Request(const std::string& method, const std::string& path, const std::string& body = "",
               const std::string& extra_headers = "") {
    std::string req = absl::StrCat(method, " ", path, " HTTP/1.1\r\nHost: localhost\r\n", extra_headers);
    if (!body.empty() || method == "POST") {
      absl::StrAppend(&req, "Content-Type: application/json\r\nContent-Length: ", body.size(), "\r\n");
    }
    absl::StrAppend(&req, "\r\n", body);
    std::string_view rest = req;
    while (!rest.empty()) {
      ssize_t n = ::send(fd_, rest.data(), rest.size(), MSG_NOSIGNAL);
      REQUIRE(n > 0);
      rest.remove_prefix(static_cast<size_t>(n));
    }
  }

  Head ReadHead() {
    Head h;
    std::string line = ReadLine();
    REQUIRE(line.size() >= 12);
    REQUIRE(absl::SimpleAtoi(line.substr(9, 3), &h.status));
    while (true) {
      line = ReadLine();
      if (line.empty()) break;
      size_t colon = line.find(':');
      REQUIRE(colon != std::string::npos);
      std::string name = line.substr(0, colon);
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      size_t v = line.find_first_not_of(' ', colon + 1);
      h.headers[name] = v == std::string::npos ? "" : line.substr(v);
    }
    head_ = h;
    return h;
  }

  // The whole body (Content-Length or chunked).
  std::string ReadBody() {
    if (head_.headers.count("content-length")) {
      size_t n = std::stoul(head_.headers["content-length"]);
      return ReadN(n);
    }
    std::string body;
    while (auto chunk = NextChunk()) body += *chunk;
    return body;
  }

  // One chunk of a chunked body; nullopt at its end.
  std::optional<std::string> NextChunk() {
    std::string size_line = ReadLine();
    size_t n = std::stoul(size_line, nullptr, 16);
    std::string data = ReadN(n);
    REQUIRE(ReadLine().empty());
    if (n == 0) return std::nullopt;
    return data;
  }

  // The next SSE event's data (the server sends one event per chunk).
  std::optional<std::string> NextEvent() {
    auto chunk = NextChunk();
    if (!chunk) return std::nullopt;
    REQUIRE(absl::StartsWith(*chunk, "data: "));
    REQUIRE(absl::EndsWith(*chunk, "\n\n"));
    return chunk->substr(6, chunk->size() - 8);
  }

  std::vector<std::string> AllEvents() {
    std::vector<std::string> out;
    while (auto e = NextEvent()) out.push_back(*e);
    return out;
  }

 private:
  void Fill() {
    char tmp[4096];
    ssize_t n = ::recv(fd_, tmp, sizeof(tmp), 0);
    REQUIRE(n > 0);
    buf_.append(tmp, static_cast<size_t>(n));
  }
  std::string ReadLine() {
    size_t pos;
    while ((pos = buf_.find("\r\n")) == std::string::npos) Fill();
    std::string line = buf_.substr(0, pos);
    buf_.erase(0, pos + 2);
    return line;
  }
  std::string ReadN(size_t n) {
    while (buf_.size() < n) Fill();
    std::string out = buf_.substr(0, n);
    buf_.erase(0, n);
    return out;
  }

  int fd_ = -1;
  std::string buf_;
  Head head_;
};

struct Response {
  int status;
  std::map<std::string, std::string> headers;
  std::string body;
};

Response Call(int port, const std::string& method, const std::string& path, const std::string& body = "") {
  Client c(port);
  c.Request(method, path, body);
  Client::Head h = c.ReadHead();
  return {h.status, h.headers, c.ReadBody()};
}

// A worker that answers every PrefillRequest with `tokens` (FirstToken, one
// TokenBatch per further token, then Finish) and every StatsRequest with
// `stats`. With `hold_after` = n it stops after n tokens.
struct Scripted {
  std::vector<int32_t> tokens;
  proto::FinishReason reason = proto::FINISH_LENGTH;
  int hold_after = -1;
  proto::WorkerStats stats;
  bool answer_stats = true;
};

void Script(FakeWorker& w, Scripted s, const std::string& id) {
  w.on_frame = [s, id](FakeWorker& w, const proto::Frame& f) {
    if (f.has_prefill()) {
      // The request and its sibling choices, each answered in full.
      std::vector<uint64_t> rids = {f.prefill().request_id()};
      rids.insert(rids.end(), f.prefill().sibling_request_ids().begin(), f.prefill().sibling_request_ids().end());
      for (uint64_t rid : rids) {
        const int n = s.hold_after >= 0 ? s.hold_after : static_cast<int>(s.tokens.size());
        for (int i = 0; i < n; ++i) {
          w.Send(i == 0 ? FirstTokenFrame(rid, s.tokens[i], id) : TokenFrame(rid, s.tokens[i]));
        }
        if (s.hold_after < 0) w.Send(FinishFrame(rid, s.reason));
      }
      return false;  // Also queued, so tests can inspect it.
    }
    if (f.has_stats_request()) {
      if (!s.answer_stats) return true;
      proto::Frame r = proto::NewFrame();
      *r.mutable_stats() = s.stats;
      r.mutable_stats()->set_worker_id(id);
      w.Send(r);
      return true;
    }
    return false;
  };
}

struct Fixture {
  explicit Fixture(std::function<void(RouterOptions&)> adjust = nullptr) {
    dir = duet::testing::TinyModelDir("llama");
    tok = std::move(text::Tokenizer::Load(dir)).value();
    format = std::move(text::PromptFormat::Load(dir)).value();
    RouterOptions o{.model_dir = dir,
                    .served_model_name = "tiny",
                    .stats_timeout = absl::Milliseconds(300),
                    .clock = &clock};
    if (adjust) adjust(o);
    REQUIRE(router.Start(o).ok());
  }
  ~Fixture() { router.Stop(); }

  std::unique_ptr<FakeWorker> AddWorker(const std::string& id, proto::Role role, Scripted s) {
    auto w = std::make_unique<FakeWorker>(io, testing::FakeWorkerOptions{.id = id, .role = role, .model = "tiny"});
    Script(*w, std::move(s), id);
    auto reply = w->Register(router.control_address());
    REQUIRE(reply.ok());
    REQUIRE(reply->ok());
    REQUIRE(w->WaitGreeting());
    return w;
  }

  std::vector<int32_t> Encode(const std::string& text) {
    return tok->Encode(text).value();
  }
  std::vector<int32_t> PromptIds(const std::string& prompt) { return Encode(format.CompletionPrefix() + prompt); }

  // The text the client must see for `ids`.
  std::string Text(const std::vector<int32_t>& ids) { return tok->Decode(ids, /*skip_special=*/true).value(); }

  Json Stats() {
    Response r = Call(router.http_port(), "GET", "/stats");
    REQUIRE(r.status == 200);
    return Json::parse(r.body);
  }

  std::string dir;
  std::unique_ptr<text::Tokenizer> tok;
  text::PromptFormat format;
  FakeClock clock;  // Heartbeats never expire unless a test says so.
  IoThread io;  // The fake workers' io thread.
  Router router;
};

std::vector<int32_t> Ids(const proto::PrefillRequest& p) {
  return {p.spec().prompt_ids().begin(), p.spec().prompt_ids().end()};
}
std::vector<int32_t> Resume(const proto::PrefillRequest& p) { return {p.resume_ids().begin(), p.resume_ids().end()}; }

// got[key] == value for each of `want`'s fields.
void CheckFields(const Json& got, const Json& want) {
  for (const auto& field : want.items()) {
    INFO(field.key());
    CHECK(got.at(field.key()) == field.value());
  }
}

TEST_CASE("non-stream completion: dispatch, then the body exactly") {
  Fixture fx;
  std::vector<int32_t> out = fx.Encode(" there was a tiny model");
  const int32_t eot = fx.tok->TokenToId("<|eot_id|>");
  out.push_back(eot);  // A special token: in token_ids, not in the text.
  auto w = fx.AddWorker("c0", proto::ROLE_COLOCATED, {.tokens = out, .reason = proto::FINISH_STOP});

  Response r = Call(fx.router.http_port(), "POST", "/v1/completions",
                    absl::StrCat(R"({"model": "tiny", "prompt": "Once upon a time", "max_tokens": )",
                                 out.size() + 4, R"(, "temperature": 0, "seed": 5})"));
  REQUIRE(r.status == 200);
  CHECK(r.headers["content-type"] == "application/json");

  auto pf = w->NextFrame();
  REQUIRE(pf.ok());
  REQUIRE(pf->has_prefill());
  const proto::PrefillRequest& p = pf->prefill();
  CHECK(Ids(p) == fx.PromptIds("Once upon a time"));
  CHECK(p.spec().prompt_ids(0) == fx.tok->TokenToId(fx.format.bos_token()));
  CHECK(p.spec().max_tokens() == static_cast<int>(out.size()) + 4);
  CHECK(p.spec().sampling().temperature() == 0.0f);
  CHECK(p.spec().sampling().top_p() == 1.0f);
  CHECK(p.spec().sampling().seed() == 5);
  CHECK(p.resume_ids().empty());
  CHECK(p.decode_worker_id() == "c0");
  CHECK(p.decode_address() == w->control_address());

  Json got = Json::parse(r.body);
  REQUIRE(got["id"].is_string());
  CHECK(absl::StartsWith(got["id"].get<std::string>(), "cmpl-"));
  Json want;
  want["id"] = got["id"];
  want["object"] = "text_completion";
  want["created"] = got["created"];
  want["model"] = "tiny";
  REQUIRE(got["system_fingerprint"].is_string());
  CHECK(absl::StartsWith(got["system_fingerprint"].get<std::string>(), "fp_"));
  want["system_fingerprint"] = got["system_fingerprint"];
  Json choice;
  choice["index"] = 0;
  choice["text"] = fx.Text(out);
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = "stop";
  choice["token_ids"] = out;
  want["choices"] = Json::array({choice});
  want["usage"] = {{"prompt_tokens", p.spec().prompt_ids_size()},
                   {"completion_tokens", out.size()},
                   {"total_tokens", p.spec().prompt_ids_size() + out.size()},
                   {"prompt_tokens_details", {{"cached_tokens", 0}}}};
  CHECK(r.body == want.dump());
  CHECK(fx.Text(out) == " there was a tiny model");

  Json stats = fx.Stats();
  CHECK(stats["router"]["requests_in_flight"] == 0);
  CHECK(stats["router"]["requests_ok"] == 1);
}

TEST_CASE("stream completion: one chunk per token, a final chunk, then [DONE]") {
  Fixture fx;
  std::vector<int32_t> out = fx.Encode(" héllo wörld");
  auto w = fx.AddWorker("c0", proto::ROLE_COLOCATED, {.tokens = out, .reason = proto::FINISH_LENGTH});
  Client c(fx.router.http_port());
  c.Request("POST", "/v1/completions",
            absl::StrCat(R"({"model": "tiny", "prompt": [5, 6, 7], "stream": true, "logprobs": 0, "max_tokens": )",
                         out.size(), R"(, "stream_options": {"include_usage": true}})"));
  Client::Head h = c.ReadHead();
  REQUIRE(h.status == 200);
  CHECK(absl::StartsWith(h.headers["content-type"], "text/event-stream"));
  std::vector<std::string> events = c.AllEvents();
  REQUIRE(events.size() == out.size() + 3);  // Tokens, final, usage, [DONE].
  CHECK(events.back() == "[DONE]");

  auto pf = w->NextFrame();
  REQUIRE(pf.ok());
  CHECK(Ids(pf->prefill()) == std::vector<int32_t>{5, 6, 7});  // Token prompts get no BOS.

  Json first = Json::parse(events[0]);
  const Json id = first["id"];
  const Json created = first["created"];
  auto chunk = [&](const std::string& text, std::vector<int32_t> ids, Json logprobs, Json finish) {
    Json choice;
    choice["index"] = 0;
    choice["text"] = text;
    choice["logprobs"] = std::move(logprobs);
    choice["finish_reason"] = std::move(finish);
    choice["token_ids"] = std::move(ids);
    Json j;
    j["id"] = id;
    j["object"] = "text_completion";
    j["created"] = created;
    j["model"] = "tiny";
    j["system_fingerprint"] = first["system_fingerprint"];
    j["choices"] = Json::array({std::move(choice)});
    return j.dump();
  };
  // Expected deltas from the same incremental detokenizer the router must use.
  text::IncrementalDetokenizer detok(fx.tok.get(), true);
  std::string text;
  int64_t chars = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    std::string delta = detok.Push(out[i]).value();
    Json lp;
    const std::string raw = fx.tok->DecodeBytes({out[i]}).value();
    std::string shown = raw;
    if (!text::IsValidUtf8(raw)) {
      shown = "bytes:";
      for (unsigned char ch : raw) shown += absl::StrFormat("\\x%02x", ch);
    }
    lp["tokens"] = Json::array({shown});
    lp["token_logprobs"] = Json::array({i == 0 ? -0.25 : -0.5});
    lp["top_logprobs"] = Json::array({Json::object()});
    lp["text_offset"] = Json::array({chars});
    CHECK(events[i] == chunk(delta, {out[i]}, lp, nullptr));
    for (unsigned char ch : delta) chars += (ch & 0xC0) != 0x80;
    text += delta;
  }
  std::string rest = detok.Finish();
  CHECK(events[out.size()] == chunk(rest, {}, nullptr, "length"));
  CHECK(text + rest == " héllo wörld");
  Json usage = Json::parse(events[out.size() + 1]);
  CHECK(usage["choices"] == Json::array());
  CHECK(usage["usage"]["prompt_tokens"] == 3);
  CHECK(usage["usage"]["completion_tokens"] == out.size());
}

TEST_CASE("client disconnect cancels the attempt on the worker") {
  Fixture fx;
  std::vector<int32_t> out = fx.Encode(" a b c d e");
  auto w = fx.AddWorker("c0", proto::ROLE_COLOCATED, {.tokens = out, .hold_after = 2});
  uint64_t rid;
  {
    Client c(fx.router.http_port());
    c.Request("POST", "/v1/completions", R"({"model": "tiny", "prompt": "x", "stream": true, "max_tokens": 50})");
    REQUIRE(c.ReadHead().status == 200);
    REQUIRE(c.NextEvent().has_value());
    REQUIRE(c.NextEvent().has_value());
    auto pf = w->NextFrame();
    REQUIRE(pf.ok());
    rid = pf->prefill().request_id();
  }  // The client goes away mid-stream.
  auto cancel = w->WaitFor([&](const proto::Frame& f) { return f.has_cancel() && f.cancel().request_id() == rid; });
  REQUIRE(cancel.ok());
  // Late events for the cancelled attempt are dropped, and nothing leaks.
  w->Send(TokenFrame(rid, out[2]));
  w->Send(FinishFrame(rid, proto::FINISH_LENGTH));
  Json stats = fx.Stats();
  CHECK(stats["router"]["requests_in_flight"] == 0);
  CHECK(stats["router"]["attempts_in_flight"] == 0);
  CHECK(stats["router"]["requests_cancelled"] == 1);
}

TEST_CASE("a worker dying mid-stream ends the stream with an error, then [DONE]") {
  Fixture fx;
  std::vector<int32_t> out = fx.Encode(" one two three");
  auto w = fx.AddWorker("c0", proto::ROLE_COLOCATED, {.tokens = out, .hold_after = 1});
  Client c(fx.router.http_port());
  c.Request("POST", "/v1/completions", R"({"model": "tiny", "prompt": "x", "stream": true, "max_tokens": 50})");
  REQUIRE(c.ReadHead().status == 200);
  auto e0 = c.NextEvent();
  REQUIRE(e0.has_value());
  CHECK(Json::parse(*e0)["choices"][0]["token_ids"] == Json::array({out[0]}));
  w->Kill();
  auto e1 = c.NextEvent();
  REQUIRE(e1.has_value());
  Json err = Json::parse(*e1);
  REQUIRE(err.contains("error"));
  CHECK(absl::StrContains(err["error"]["message"].get<std::string>(), "decode worker c0 was lost"));
  CHECK(err["error"]["type"] == "server_error");
  CHECK(c.NextEvent() == std::optional<std::string>("[DONE]"));
  CHECK_FALSE(c.NextEvent().has_value());
}

TEST_CASE("decode lost mid-stream: its request migrates (prefilled again with the tokens the client has, decoded "
          "elsewhere) as one stream; others are unaffected") {
  Fixture fx;
  std::vector<int32_t> out = fx.Encode(" ok then we go");
  REQUIRE(out.size() >= 4);
  auto p0 = fx.AddWorker("p0", proto::ROLE_PREFILL, {});
  // The prefill's first token continues after whatever was resumed.
  p0->on_frame = [out](FakeWorker& w, const proto::Frame& f) {
    if (f.has_prefill()) w.Send(FirstTokenFrame(f.prefill().request_id(), out[f.prefill().resume_ids_size()], "p0"));
    return false;
  };
  auto d0 = fx.AddWorker("d0", proto::ROLE_DECODE, {});
  auto d1 = fx.AddWorker("d1", proto::ROLE_DECODE, {});
  const std::string body =
      absl::StrCat(R"({"model": "tiny", "prompt": "x", "stream": true, "max_tokens": )", out.size(), "}");
  // Least-loaded: the first request goes to d0 (tie, id order), the second to
  // d1 (d0 now has a request charged).
  Client a(fx.router.http_port()), b(fx.router.http_port());
  a.Request("POST", "/v1/completions", body);
  auto pa = p0->NextFrame();
  REQUIRE(pa.ok());
  b.Request("POST", "/v1/completions", body);
  auto pb = p0->NextFrame();
  REQUIRE(pb.ok());
  REQUIRE(pa->prefill().decode_worker_id() == "d0");
  REQUIRE(pb->prefill().decode_worker_id() == "d1");
  const uint64_t id1 = pa->prefill().request_id();
  REQUIRE(a.ReadHead().status == 200);
  REQUIRE(a.NextEvent().has_value());  // Token 1, from the prefill.
  d0->Send(TokenFrame(id1, out[1]));  // Token 2 from d0, which then dies.
  REQUIRE(a.NextEvent().has_value());
  d0->Kill();
  // The prefill hears Cancel for the lost attempt, then the migrated one:
  // the prompt plus both tokens, to d1.
  auto cancel = p0->WaitFor([&](const proto::Frame& f) { return f.has_cancel() && f.cancel().request_id() == id1; });
  CHECK(cancel.ok());
  auto moved = p0->WaitFor([&](const proto::Frame& f) { return f.has_prefill() && f.prefill().request_id() > id1 + 1; });
  REQUIRE(moved.ok());
  const proto::PrefillRequest& p = moved->prefill();
  CHECK(Resume(p) == std::vector<int32_t>{out[0], out[1]});
  CHECK(Ids(p) == Ids(pa->prefill()));
  CHECK(p.decode_worker_id() == "d1");
  for (size_t i = 3; i < out.size(); ++i) d1->Send(TokenFrame(p.request_id(), out[i]));
  d1->Send(FinishFrame(p.request_id(), proto::FINISH_LENGTH));
  std::vector<std::string> events = a.AllEvents();
  REQUIRE(!events.empty());
  CHECK(events.back() == "[DONE]");
  std::vector<int32_t> rest;
  for (const std::string& e : events) {
    if (e == "[DONE]") continue;
    Json j = Json::parse(e);
    for (const auto& t : j["choices"][0]["token_ids"]) rest.push_back(t.get<int32_t>());
  }
  CHECK(rest == std::vector<int32_t>(out.begin() + 2, out.end()));  // Each token once, in order.

  // b carries on on d1.
  const uint64_t idb = pb->prefill().request_id();
  for (size_t i = 1; i < out.size(); ++i) d1->Send(TokenFrame(idb, out[i]));
  d1->Send(FinishFrame(idb, proto::FINISH_LENGTH));
  REQUIRE(b.ReadHead().status == 200);
  CHECK(b.AllEvents().back() == "[DONE]");
}

TEST_CASE("decode lost with the migration limit at 0: its request fails with 503, the prefill gets Cancel") {
  Fixture fx([](RouterOptions& o) { o.max_migrations = 0; });
  std::vector<int32_t> out = fx.Encode(" ok then");
  auto p0 = fx.AddWorker("p0", proto::ROLE_PREFILL, {.tokens = out, .hold_after = 1});
  auto d0 = fx.AddWorker("d0", proto::ROLE_DECODE, {});
  Client a(fx.router.http_port());
  a.Request("POST", "/v1/completions", R"({"model": "tiny", "prompt": "x", "max_tokens": 9})");
  auto pf = p0->NextFrame();
  REQUIRE(pf.ok());
  d0->Kill();
  Client::Head ha = a.ReadHead();
  CHECK(ha.status == 503);
  Json err = Json::parse(a.ReadBody());
  const std::string msg = err["error"]["message"].get<std::string>();
  CHECK(absl::StrContains(msg, "decode worker d0 was lost"));
  CHECK(absl::StrContains(msg, "--max-migrations"));
  CHECK(err["error"]["type"] == "server_error");
  CHECK(p0->WaitFor([&](const proto::Frame& f) {
              return f.has_cancel() && f.cancel().request_id() == pf->prefill().request_id();
            }).ok());
}

TEST_CASE("prefill lost before its first token: re-dispatched elsewhere under a new id") {
  Fixture fx;
  std::vector<int32_t> out = fx.Encode(" fine");
  auto p0 = fx.AddWorker("p0", proto::ROLE_PREFILL, {.tokens = out, .hold_after = 0});  // Never answers.
  auto d0 = fx.AddWorker("d0", proto::ROLE_DECODE, {});
  Client c(fx.router.http_port());
  c.Request("POST", "/v1/completions", R"({"model": "tiny", "prompt": "x", "max_tokens": 9})");
  auto first = p0->NextFrame();
  REQUIRE(first.ok());
  // A second prefill joins; then p0 dies with the attempt.
  auto p1 = fx.AddWorker("p1", proto::ROLE_PREFILL, {.tokens = {out[0]}, .hold_after = 1});
  p0->Kill();
  auto second = p1->NextFrame();
  REQUIRE(second.ok());
  const proto::PrefillRequest& p = second->prefill();
  CHECK(p.request_id() != first->prefill().request_id());
  CHECK(Ids(p) == Ids(first->prefill()));
  CHECK(p.resume_ids().empty());
  CHECK(p.decode_worker_id() == "d0");
  // d0 got a Cancel for the lost attempt (it may hold an offer for it).
  CHECK(d0->WaitFor([&](const proto::Frame& f) {
              return f.has_cancel() && f.cancel().request_id() == first->prefill().request_id();
            }).ok());
  for (size_t i = 1; i < out.size(); ++i) d0->Send(TokenFrame(p.request_id(), out[i]));
  d0->Send(FinishFrame(p.request_id(), proto::FINISH_STOP));
  REQUIRE(c.ReadHead().status == 200);
  Json body = Json::parse(c.ReadBody());
  CHECK(body["choices"][0]["token_ids"] == Json(out));
  CHECK(fx.Stats()["router"]["redispatches"] == 1);
}

TEST_CASE("a failed KV pull resumes on a new attempt with the tokens already sent") {
  Fixture fx;
  std::vector<int32_t> out = fx.Encode(" the quick brown fox jumps");
  REQUIRE(out.size() >= 5);
  auto p0 = fx.AddWorker("p0", proto::ROLE_PREFILL, {});
  auto d0 = fx.AddWorker("d0", proto::ROLE_DECODE, {});
  // The prefill's first token continues after whatever was resumed.
  p0->on_frame = [out](FakeWorker& w, const proto::Frame& f) {
    if (f.has_prefill()) {
      w.Send(FirstTokenFrame(f.prefill().request_id(), out[f.prefill().resume_ids_size()], "p0"));
    }
    return false;
  };
  Client c(fx.router.http_port());
  c.Request("POST", "/v1/completions",
            absl::StrCat(R"({"model": "tiny", "prompt": "x", "stream": true, "max_tokens": )", out.size(), "}"));
  REQUIRE(c.ReadHead().status == 200);
  auto a1 = p0->NextFrame();
  REQUIRE(a1.ok());
  const uint64_t id1 = a1->prefill().request_id();
  // The client has token 1; wait for it so the decode's events come after.
  auto e0 = c.NextEvent();
  REQUIRE(e0.has_value());
  CHECK(Json::parse(*e0)["choices"][0]["token_ids"] == Json::array({out[0]}));
  // The decode streams token 2, then its pull of the rest fails.
  d0->Send(TokenFrame(id1, out[1]));
  d0->Send(FinishFrame(id1, proto::FINISH_ERROR, static_cast<int>(absl::StatusCode::kUnavailable), "lease expired"));
  // The prefill hears Cancel for the failed attempt (its lease is freed), then the new attempt.
  auto cancel = p0->NextFrame();
  REQUIRE(cancel.ok());
  CHECK(cancel->cancel().request_id() == id1);
  auto a2 = p0->NextFrame();
  REQUIRE(a2.ok());
  REQUIRE(a2->has_prefill());
  const proto::PrefillRequest& p = a2->prefill();
  const uint64_t id2 = p.request_id();
  CHECK(id2 != id1);
  CHECK(Resume(p) == std::vector<int32_t>{out[0], out[1]});
  CHECK(Ids(p) == Ids(a1->prefill()));
  CHECK(p.spec().max_tokens() == static_cast<int>(out.size()));  // resume_ids count toward it.
  CHECK(p.decode_worker_id() == "d0");
  // A stale event of the failed attempt is dropped; the new attempt goes on.
  d0->Send(TokenFrame(id1, 3));
  for (size_t i = 3; i < out.size(); ++i) d0->Send(TokenFrame(id2, out[i]));
  d0->Send(FinishFrame(id2, proto::FINISH_LENGTH));
  std::vector<int32_t> ids = {out[0]};
  std::string text = Json::parse(*e0)["choices"][0]["text"];
  std::vector<std::string> events = c.AllEvents();
  REQUIRE(events.size() >= 2);
  CHECK(events.back() == "[DONE]");
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    Json e = Json::parse(events[i]);
    for (int32_t id : e["choices"][0]["token_ids"]) ids.push_back(id);
    text += e["choices"][0]["text"].get<std::string>();
  }
  CHECK(ids == out);  // Seamless: every token once, in order.
  CHECK(text == " the quick brown fox jumps");
  CHECK(Json::parse(events[events.size() - 2])["choices"][0]["finish_reason"] == "length");
}

TEST_CASE("a redispatch whose resumed max_tokens-th token is an EOS ends STOP, with no new attempt") {
  // The decode sent the request's last allowed token, an EOS, then failed
  // before its Finish: the router judges the tokens the client has by the
  // one finish rule (STOP), as a worker given them would.
  Fixture fx;
  auto config = spec::ModelConfig::ServingFromFile(fx.dir + "/config.json");
  REQUIRE(config.ok());
  const int32_t eos = config->eos_token_ids.at(0);
  std::vector<int32_t> out = fx.Encode(" ok");
  auto p0 = fx.AddWorker("p0", proto::ROLE_PREFILL, {});
  auto d0 = fx.AddWorker("d0", proto::ROLE_DECODE, {});
  p0->on_frame = [out](FakeWorker& w, const proto::Frame& f) {
    if (f.has_prefill()) w.Send(FirstTokenFrame(f.prefill().request_id(), out[0], "p0"));
    return false;
  };
  Client c(fx.router.http_port());
  c.Request("POST", "/v1/completions", R"({"model": "tiny", "prompt": "x", "stream": true, "max_tokens": 2})");
  REQUIRE(c.ReadHead().status == 200);
  auto a1 = p0->NextFrame();
  REQUIRE(a1.ok());
  const uint64_t id1 = a1->prefill().request_id();
  REQUIRE(c.NextEvent().has_value());  // Token 1, so the decode's events come after.
  d0->Send(TokenFrame(id1, eos));
  d0->Send(FinishFrame(id1, proto::FINISH_ERROR, static_cast<int>(absl::StatusCode::kUnavailable), "lease expired"));
  std::vector<std::string> events = c.AllEvents();
  REQUIRE(events.size() >= 2);
  CHECK(events.back() == "[DONE]");
  CHECK(Json::parse(events[events.size() - 2])["choices"][0]["finish_reason"] == "stop");
  // No second attempt: the prefill's next PrefillRequest is the next
  // client's, with nothing resumed.
  Client c2(fx.router.http_port());
  c2.Request("POST", "/v1/completions", R"({"model": "tiny", "prompt": "y", "max_tokens": 1})");
  auto next = p0->WaitFor([id1](const proto::Frame& f) { return f.has_prefill() && f.prefill().request_id() != id1; });
  REQUIRE(next.ok());
  CHECK(next->prefill().resume_ids_size() == 0);
  CHECK(next->prefill().spec().max_tokens() == 1);
}

TEST_CASE("at most three attempts, then an error") {
  Fixture fx;
  auto p0 = fx.AddWorker("p0", proto::ROLE_PREFILL, {.tokens = {}, .hold_after = 0});
  auto d0 = fx.AddWorker("d0", proto::ROLE_DECODE, {});
  // Every attempt fails at once with UNAVAILABLE from the prefill.
  p0->on_frame = [](FakeWorker& w, const proto::Frame& f) {
    if (f.has_prefill()) {
      w.Send(FinishFrame(f.prefill().request_id(), proto::FINISH_ERROR,
                         static_cast<int>(absl::StatusCode::kUnavailable), "cannot reach the decode"));
    }
    return false;
  };
  Response r = Call(fx.router.http_port(), "POST", "/v1/completions", R"({"model": "tiny", "prompt": "x"})");
  CHECK(r.status == 503);
  Json err = Json::parse(r.body);
  CHECK(absl::StrContains(err["error"]["message"].get<std::string>(), "failed after 3 attempts"));
  std::set<uint64_t> ids;
  for (int i = 0; i < 3; ++i) {
    auto f = p0->NextFrame();
    REQUIRE(f.ok());
    ids.insert(f->prefill().request_id());
  }
  CHECK(ids.size() == 3);
  // Each failed attempt was cancelled on its decode too.
  for (uint64_t id : ids) {
    CHECK(d0->WaitFor([id](const proto::Frame& f) { return f.has_cancel() && f.cancel().request_id() == id; }).ok());
  }
}

TEST_CASE("errors: unknown model 404, bad params 400, no workers 503") {
  Fixture fx;
  const int port = fx.router.http_port();
  Response r = Call(port, "POST", "/v1/completions", R"({"model": "gpt-4", "prompt": "x"})");
  CHECK(r.status == 404);
  Json e = Json::parse(r.body);
  CHECK(e["error"]["code"] == "model_not_found");
  CHECK(e["error"]["param"] == "model");

  r = Call(port, "POST", "/v1/completions", R"({"model": "tiny", "prompt": "x", "temperature": "hot"})");
  CHECK(r.status == 400);
  CHECK(Json::parse(r.body)["error"]["param"] == "temperature");

  r = Call(port, "POST", "/v1/completions", R"({"model": "tiny", "prompt": "x"})");
  CHECK(r.status == 503);
  CHECK(Json::parse(r.body)["error"]["message"] == "no live worker");

  r = Call(port, "GET", "/v1/completions");
  CHECK(r.status == 405);
  r = Call(port, "GET", "/nope");
  CHECK(r.status == 404);
  CHECK(fx.Stats()["router"]["requests_rejected"] == 3);
}

TEST_CASE("a chat template duet cannot render: completions are served, chat is a 400 that says why") {
  // The tiny model with a template that includes another file.
  namespace fs = std::filesystem;
  const char* tmp = std::getenv("TEST_TMPDIR");
  const fs::path dir = fs::path(tmp != nullptr ? tmp : "/tmp") / "include_template";
  fs::remove_all(dir);
  fs::copy(duet::testing::TinyModelDir("llama"), dir, fs::copy_options::recursive);
  {
    std::ifstream in(dir / "tokenizer_config.json");
    Json config = Json::parse(in);
    config["chat_template"] = "{% include 'system.jinja' %}{{ messages }}";
    std::ofstream(dir / "tokenizer_config.json", std::ios::trunc) << config.dump();
  }
  Fixture fx([&](RouterOptions& o) { o.model_dir = dir.string(); });
  const int port = fx.router.http_port();
  Response r = Call(port, "POST", "/v1/chat/completions",
                    R"({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})");
  CHECK(r.status == 400);
  const std::string message = Json::parse(r.body)["error"]["message"];
  CHECK(absl::StrContains(message, "cannot chat"));
  CHECK(absl::StrContains(message, "line 1: unknown or unsupported statement 'include'"));
  r = Call(port, "POST", "/v1/completions", R"({"model": "tiny", "prompt": "x"})");
  CHECK(r.status == 503);  // accepted, and no worker to run it
  CHECK(Json::parse(r.body)["error"]["message"] == "no live worker");
}

TEST_CASE("health, models, metrics") {
  Fixture fx;
  const int port = fx.router.http_port();
  Response r = Call(port, "GET", "/health");
  CHECK(r.status == 503);
  CHECK(Json::parse(r.body)["status"] == "unavailable");

  auto p0 = fx.AddWorker("p0", proto::ROLE_PREFILL, {});
  r = Call(port, "GET", "/health");
  CHECK(r.status == 503);
  CHECK(Json::parse(r.body)["error"] == "no live decode worker");
  auto d0 = fx.AddWorker("d0", proto::ROLE_DECODE, {});
  r = Call(port, "GET", "/health");
  CHECK(r.status == 200);
  CHECK(r.body == R"({"status":"ok"})");
  {
    // HEAD: the status and length, no body (the next response follows at once).
    Client c(port);
    c.Request("HEAD", "/health");
    Client::Head h = c.ReadHead();
    CHECK(h.status == 200);
    CHECK(h.headers["content-length"] == std::to_string(std::string(R"({"status":"ok"})").size()));
    c.Request("GET", "/health");
    CHECK(c.ReadHead().status == 200);
    CHECK(c.ReadBody() == R"({"status":"ok"})");
  }

  // One model (the SDK's models.retrieve), its id percent-decoded; an
  // absolute-form target (RFC 9112) reaches the same route.
  r = Call(port, "GET", "/v1/models/tiny");
  REQUIRE(r.status == 200);
  CHECK(Json::parse(r.body)["id"] == "tiny");
  CHECK(Json::parse(r.body)["object"] == "model");
  CHECK(Call(port, "GET", "/v1/models/t%69ny").status == 200);
  r = Call(port, "GET", "/v1/models/org%2Fother");
  CHECK(r.status == 404);
  CHECK(Json::parse(r.body)["error"]["code"] == "model_not_found");
  CHECK(Json::parse(r.body)["error"]["message"] == "The model `org/other` does not exist");
  r = Call(port, "GET", absl::StrCat("http://127.0.0.1:", port, "/v1/models/tiny?x=1"));
  CHECK(r.status == 200);
  CHECK(Json::parse(r.body)["id"] == "tiny");

  r = Call(port, "GET", "/v1/models");
  REQUIRE(r.status == 200);
  Json m = Json::parse(r.body);
  CHECK(m["object"] == "list");
  REQUIRE(m["data"].size() == 1);
  CHECK(m["data"][0]["id"] == "tiny");
  CHECK(m["data"][0]["object"] == "model");
  CHECK(m["data"][0]["owned_by"] == "duet");
  CHECK(m["data"][0]["created"].is_number_integer());

  r = Call(port, "GET", "/metrics");
  REQUIRE(r.status == 200);
  CHECK(absl::StartsWith(r.headers["content-type"], "text/plain; version=0.0.4"));
  CHECK(absl::StrContains(r.body, "duet_requests_total{status=\"rejected\"}"));
  CHECK(absl::StrContains(r.body, "duet_time_to_first_token_seconds_bucket{model=\"tiny\""));
  CHECK(absl::StrContains(r.body, "duet_e2e_request_latency_seconds_count{model=\"tiny\"}"));
}

TEST_CASE("/stats asks each worker fresh, and falls back to its heartbeat when it is silent") {
  Fixture fx;
  proto::WorkerStats fresh;
  fresh.set_role(proto::ROLE_DECODE);
  fresh.set_kv_blocks_total(100);
  fresh.set_kv_blocks_free(93);
  fresh.set_running_requests(2);
  fresh.set_kv_bytes_moved(4096);
  fresh.set_leased_blocks(0);
  auto d0 = fx.AddWorker("d0", proto::ROLE_DECODE, {.stats = fresh});
  auto p0 = fx.AddWorker("p0", proto::ROLE_PREFILL, {.answer_stats = false});
  proto::WorkerStats hb;
  hb.set_kv_blocks_total(100);
  hb.set_kv_blocks_free(60);
  hb.set_leased_blocks(40);
  hb.set_prompt_tokens_computed(1234);
  p0->Heartbeat(hb);
  // The heartbeat and /stats travel on different connections: ask until the
  // heartbeat shows (each ask waits for the silent worker's timeout).
  Json s;
  for (int i = 0; i < 50; ++i) {
    s = fx.Stats();
    if (s["workers"]["p0"]["prompt_tokens_computed"] == 1234) break;
  }
  CheckFields(s["workers"]["d0"], {{"role", "decode"},
                                   {"fresh", true},
                                   {"kv_blocks_free", 93},
                                   {"running_requests", 2},
                                   {"kv_bytes_moved", 4096}});
  CheckFields(s["workers"]["p0"], {{"role", "prefill"},
                                   {"fresh", false},
                                   {"kv_blocks_free", 60},
                                   {"leased_blocks", 40},
                                   {"prompt_tokens_computed", 1234}});
  CHECK(s["router"]["live_workers"] == 2);
}

TEST_CASE("/figures: the load of the last window_s seconds and the pools from the workers' heartbeats") {
  Fixture fx;
  std::vector<int32_t> out = fx.Encode(" a b c");
  REQUIRE(out.size() == 3);
  auto c0 = fx.AddWorker("c0", proto::ROLE_COLOCATED, {.tokens = out});
  const std::string body = R"({"model": "tiny", "prompt": "Once upon a time", "max_tokens": 3})";
  REQUIRE(Call(fx.router.http_port(), "POST", "/v1/completions", body).status == 200);
  fx.clock.Advance(absl::Seconds(20));
  REQUIRE(Call(fx.router.http_port(), "POST", "/v1/completions", body).status == 200);
  REQUIRE(Call(fx.router.http_port(), "POST", "/v1/completions", body).status == 200);
  fx.clock.Advance(absl::Seconds(5));
  auto figures = [&](const std::string& query) {
    Response r = Call(fx.router.http_port(), "GET", "/figures" + query);
    REQUIRE(r.status == 200);
    absl::StatusOr<placement::LoadFigures> f = placement::FiguresFromJson(Json::parse(r.body));
    REQUIRE(f.ok());
    return *f;
  };
  // The default window (30 s) holds all three; ten seconds only the last two.
  placement::LoadFigures all = figures("");
  CHECK(all.interval_s == Approx(25));  // the router is 25 s old
  CHECK(all.arrivals == 3);
  CHECK(all.finished == 3);
  CHECK(all.prompt_lens == std::vector<int64_t>(3, static_cast<int64_t>(fx.PromptIds("Once upon a time").size())));
  CHECK(all.output_lens == std::vector<int64_t>{3, 3, 3});
  CHECK(all.ttft_p50 == 0);  // the fake clock stood still while each was served
  placement::LoadFigures recent = figures("?window_s=10");
  CHECK(recent.interval_s == Approx(10));
  CHECK(recent.arrivals == 2);
  CHECK(recent.arrival_rate() == Approx(0.2));
  CHECK(Call(fx.router.http_port(), "GET", "/figures?window_s=-3").status == 400);
  CHECK(Call(fx.router.http_port(), "GET", "/figures?window_s=x").status == 400);

  // Pools: colocated workers are in neither; a draining one is not ready.
  auto p0 = fx.AddWorker("p0", proto::ROLE_PREFILL, {});
  auto d0 = fx.AddWorker("d0", proto::ROLE_DECODE, {});
  auto d1 = fx.AddWorker("d1", proto::ROLE_DECODE, {});
  proto::WorkerStats ps;
  ps.set_queued_requests(4);
  p0->Heartbeat(ps);
  proto::WorkerStats ds;
  ds.set_kv_blocks_total(100);
  ds.set_kv_blocks_free(75);
  ds.set_running_requests(6);
  d0->Heartbeat(ds);
  ds.set_draining(true);
  d1->Heartbeat(ds);
  placement::LoadFigures f;
  for (int i = 0; i < 200; ++i) {  // heartbeats travel on their own connections
    f = figures("");
    if (f.prefill.waiting == 4 && f.decode.draining == 1 && f.decode.running == 12) break;
  }
  CHECK(f.prefill.ready == 1);
  CHECK(f.prefill.waiting == 4);
  CHECK(f.decode.ready == 1);
  CHECK(f.decode.draining == 1);
  CHECK(f.decode.running == 12);
  CHECK(f.decode.kv_used == 2 * 25 * 16);
  CHECK(f.decode.kv_capacity == 2 * 100 * 16);
}

TEST_CASE("n choices: one PrefillRequest naming the other choices' ids, one body with every choice") {
  Fixture fx;
  std::vector<int32_t> out = fx.Encode(" two ways");
  auto w = fx.AddWorker("c0", proto::ROLE_COLOCATED, {.tokens = out, .reason = proto::FINISH_STOP});
  Response r = Call(fx.router.http_port(), "POST", "/v1/completions",
                    R"({"model": "tiny", "prompt": "x", "n": 2, "seed": 9, "max_tokens": 10})");
  REQUIRE(r.status == 200);
  auto pf = w->NextFrame();
  REQUIRE(pf.ok());
  REQUIRE(pf->has_prefill());
  CHECK(pf->prefill().spec().choice_index() == 0);
  CHECK(pf->prefill().spec().sampling().seed() == 9);
  REQUIRE(pf->prefill().sibling_request_ids_size() == 1);
  CHECK(pf->prefill().sibling_request_ids(0) != pf->prefill().request_id());
  Json body = Json::parse(r.body);
  REQUIRE(body["choices"].size() == 2);
  for (int i = 0; i < 2; ++i) {
    CHECK(body["choices"][i]["index"] == i);
    CHECK(body["choices"][i]["text"] == fx.Text(out));
    CHECK(body["choices"][i]["finish_reason"] == "stop");
  }
  CHECK(body["usage"]["completion_tokens"] == 2 * out.size());
}

TEST_CASE("a stop string ends the choice early and cancels it on the worker") {
  Fixture fx;
  std::vector<int32_t> out = fx.Encode(" one two three four");
  // The worker never finishes by itself.
  auto w = fx.AddWorker("c0", proto::ROLE_COLOCATED, {.tokens = out, .hold_after = static_cast<int>(out.size())});
  Client c(fx.router.http_port());
  c.Request("POST", "/v1/chat/completions",
            R"({"model": "tiny", "messages": [{"role": "user", "content": "count"}], "stop": ["three"],
                "stream": true, "max_tokens": 50})");
  REQUIRE(c.ReadHead().status == 200);
  std::vector<std::string> events = c.AllEvents();
  REQUIRE(events.size() >= 2);
  CHECK(events.back() == "[DONE]");
  std::string text;
  Json last;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    Json e = Json::parse(events[i]);
    CHECK(e["object"] == "chat.completion.chunk");
    if (e["choices"][0]["delta"].contains("content")) text += e["choices"][0]["delta"]["content"].get<std::string>();
    last = e;
  }
  CHECK(text == " one two ");
  CHECK(last["choices"][0]["finish_reason"] == "stop");
  auto pf = w->NextFrame();
  REQUIRE(pf.ok());
  const uint64_t id = pf->prefill().request_id();
  auto cancel = w->WaitFor([&](const proto::Frame& f) { return f.has_cancel() && f.cancel().request_id() == id; });
  CHECK(cancel.ok());
}

TEST_CASE("--api-key: /v1/ needs the bearer key (401 in OpenAI's shape); /health stays open") {
  Fixture fx([](RouterOptions& o) { o.api_key = "sk-test-123"; });
  auto w = fx.AddWorker("c0", proto::ROLE_COLOCATED, {.tokens = fx.Encode(" ok"), .reason = proto::FINISH_STOP});
  const std::string body = R"({"model": "tiny", "prompt": "x", "max_tokens": 3})";
  for (const std::string& header : {std::string(""), std::string("Authorization: Bearer sk-wrong\r\n"),
                                    std::string("Authorization: sk-test-123\r\n"),
                                    std::string("Authorization: Bearer sk-test-12\r\n")}) {
    INFO(header);
    Client c(fx.router.http_port());
    c.Request("POST", "/v1/completions", body, header);
    Client::Head h = c.ReadHead();
    CHECK(h.status == 401);
    Json err = Json::parse(c.ReadBody());
    CHECK(err["error"]["code"] == "invalid_api_key");
    CHECK(err["error"]["type"] == "invalid_request_error");
  }
  Client ok(fx.router.http_port());
  ok.Request("POST", "/v1/completions", body, "Authorization: Bearer sk-test-123\r\n");
  CHECK(ok.ReadHead().status == 200);
  Client models(fx.router.http_port());
  models.Request("GET", "/v1/models");
  CHECK(models.ReadHead().status == 401);
  CHECK(Call(fx.router.http_port(), "GET", "/health").status == 200);
  CHECK(fx.Stats()["router"]["requests_unauthorized"] == 5);
}

TEST_CASE("--max-requests: one more request in flight gets 429 with Retry-After") {
  Fixture fx([](RouterOptions& o) { o.max_requests = 1; });
  std::vector<int32_t> out = fx.Encode(" wait");
  auto w = fx.AddWorker("c0", proto::ROLE_COLOCATED, {.tokens = out, .hold_after = 1});
  Client first(fx.router.http_port());
  first.Request("POST", "/v1/completions", R"({"model": "tiny", "prompt": "x", "stream": true, "max_tokens": 9})");
  REQUIRE(first.ReadHead().status == 200);
  Response r = Call(fx.router.http_port(), "POST", "/v1/completions",
                    R"({"model": "tiny", "prompt": "y", "max_tokens": 9})");
  CHECK(r.status == 429);
  CHECK(r.headers["retry-after"] == "1");
  Json err = Json::parse(r.body);
  CHECK(err["error"]["code"] == "queue_full");
  first.Close();  // The first request is cancelled; the slot frees up.
  auto pf = w->NextFrame();
  REQUIRE(pf.ok());
  auto cancel = w->WaitFor([&](const proto::Frame& f) { return f.has_cancel(); });
  REQUIRE(cancel.ok());
  Json stats = fx.Stats();
  CHECK(stats["router"]["requests_in_flight"] == 0);
}

}  // namespace
}  // namespace duet::router
