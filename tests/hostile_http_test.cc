// Malformed and hostile requests against a real router (with --api-key) and
// a colocated worker, over raw sockets: each gets its status and an
// OpenAI-shaped error body, nothing ever answers 500, and a client running
// ordinary requests beside them is served throughout.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/cluster.h"
#include "engine/testing/tiny_model.h"

namespace duet::testing {
namespace {

using nlohmann::json;

constexpr char kKey[] = "sk-hostile";
const std::string kAuth = absl::StrCat("Authorization: Bearer ", kKey, "\r\n");

int Connect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  timeval tv{.tv_sec = 30, .tv_usec = 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

void SendAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n <= 0) return;  // The server may close early (413): fine.
    data.remove_prefix(static_cast<size_t>(n));
  }
}

struct Reply {
  int status = 0;  // 0: the connection closed without a response.
  std::string headers;
  std::string body;
};

// Reads one response (Content-Length or close-delimited); status 0 if the
// server closed without answering.
Reply ReadReply(int fd) {
  std::string buf;
  char tmp[65536];
  size_t head_end = std::string::npos;
  Reply r;
  for (;;) {
    if (head_end == std::string::npos) {
      head_end = buf.find("\r\n\r\n");
      if (head_end != std::string::npos) {
        r.headers = buf.substr(0, head_end);
        REQUIRE(absl::SimpleAtoi(buf.substr(9, 3), &r.status));
      }
    }
    if (head_end != std::string::npos) {
      std::string lower = r.headers;
      for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      size_t cl = lower.find("content-length: ");
      if (cl != std::string::npos) {
        size_t len = std::stoul(lower.substr(cl + 16));
        if (buf.size() >= head_end + 4 + len) {
          r.body = buf.substr(head_end + 4, len);
          return r;
        }
      }
    }
    ssize_t n = ::recv(fd, tmp, sizeof(tmp), 0);
    if (n <= 0) break;
    buf.append(tmp, static_cast<size_t>(n));
  }
  if (head_end != std::string::npos) r.body = buf.substr(head_end + 4);
  return r;
}

Reply Exchange(int port, const std::string& raw, bool half_close = false) {
  int fd = Connect(port);
  SendAll(fd, raw);
  if (half_close) ::shutdown(fd, SHUT_WR);
  Reply r = ReadReply(fd);
  ::close(fd);
  return r;
}

std::string Post(const std::string& path, const std::string& body, const std::string& headers = kAuth) {
  return absl::StrCat("POST ", path, " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n", headers,
                      "Content-Length: ", body.size(), "\r\n\r\n", body);
}

std::string Completion(const std::string& fields) {
  return Post("/v1/completions", absl::StrCat(R"({"model": "tiny-llama")", fields, "}"));
}
std::string Chat(const std::string& fields) {
  return Post("/v1/chat/completions", absl::StrCat(R"({"model": "tiny-llama")", fields, "}"));
}

struct Case {
  std::string name;
  std::string raw;
  int status;        // Expected status; 0: closed without a response.
  std::string param;  // Expected error.param ("" = any).
  bool half_close = false;
};

TEST_CASE("hostile requests: the right status and error body each, never a 500, others served throughout") {
  Cluster c;
  REQUIRE(c.StartRouter(TinyModelDir("llama"), {"--api-key", kKey, "--header-timeout-s", "1",
                                                 "--max-connections", "48"})
              .ok());
  REQUIRE(c.StartWorker("colocated", "colocated-0", {"--kv-blocks", "256"}).ok());
  REQUIRE(c.WaitForWorkers(1).ok());
  const int port = c.http_port();

  const std::string big_body(10 << 20, 'x');
  std::string deep_array = R"({"model": "tiny-llama", "prompt": )" + std::string(200000, '[') +
                           std::string(200000, ']') + "}";
  std::string deep_object = R"({"model": "tiny-llama", "prompt": "hi", "max_tokens": 2, "x": )";
  for (int i = 0; i < 100000; ++i) deep_object += R"({"a":)";
  deep_object += "1" + std::string(100000, '}') + "}";
  std::string header_flood = "GET /health HTTP/1.1\r\nHost: x\r\n";
  for (int i = 0; i < 3000; ++i) absl::StrAppend(&header_flood, "X-Flood-", i, ": yes\r\n");
  header_flood += "\r\n";
  const std::string long_header = "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(40000, 'a') + "\r\n\r\n";
  const std::string long_prompt = R"(, "prompt": ")" + std::string(20000, 'a') + R"(")";
  std::string ids_over = ", \"prompt\": [";
  for (int i = 0; i < 1100; ++i) ids_over += (i ? ",5" : "5");
  ids_over += "]";

  const std::vector<Case> cases = {
      // HTTP itself.
      {"garbage request line", "HELLO THERE\r\n\r\n", 400, ""},
      {"no HTTP version", "GET /health\r\n\r\n", 400, ""},
      {"bad header line", "GET /health HTTP/1.1\r\nHost x\r\n\r\n", 400, ""},
      {"non-numeric Content-Length", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", 400, ""},
      {"bad chunked body", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\nxx\r\n0\r\n\r\n",
       400, ""},
      {"10 MB body", Post("/v1/completions", big_body), 413, ""},
      {"10 MB chunked body",
       "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" +
           [&] {
             std::string s;
             for (int i = 0; i < 10; ++i) s += "100000\r\n" + std::string(0x100000, 'y') + "\r\n";
             return s + "0\r\n\r\n";
           }(),
       413, ""},
      {"header flood", header_flood, 431, ""},
      {"one huge header", long_header, 431, ""},
      {"body cut short, then EOF",
       absl::StrCat("POST /v1/completions HTTP/1.1\r\nHost: x\r\n", kAuth, "Content-Length: 100\r\n\r\n{\"model\""), 0,
       "", true},
      {"slowloris: half the headers, then nothing", "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Ty", 0, ""},
      // Routes and methods.
      {"GET on a POST route", absl::StrCat("GET /v1/completions HTTP/1.1\r\nHost: x\r\n", kAuth, "\r\n"), 405, ""},
      {"unknown path", Post("/v1/nope", "{}"), 404, ""},
      {"root", "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 404, ""},
      // Access.
      {"no key", Post("/v1/completions", R"({"model": "tiny-llama", "prompt": "hi"})", ""), 401, ""},
      {"wrong key", Post("/v1/completions", R"({"model": "tiny-llama", "prompt": "hi"})",
                         "Authorization: Bearer sk-nope\r\n"), 401, ""},
      {"empty bearer", Post("/v1/completions", "{}", "Authorization: Bearer \r\n"), 401, ""},
      {"basic auth", Post("/v1/completions", "{}", "Authorization: Basic c2staG9zdGlsZQ==\r\n"), 401, ""},
      {"key in the wrong case", Post("/v1/completions", "{}", "Authorization: bearer sk-hostile\r\n"), 401, ""},
      {"models without a key", "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n", 401, ""},
      {"a cache reset without a key", Post("/reset_prefix_cache", "", ""), 401, ""},
      // JSON.
      {"empty body", Post("/v1/completions", ""), 400, ""},
      {"not JSON", Post("/v1/completions", "hello"), 400, ""},
      {"truncated JSON", Post("/v1/completions", R"({"model": "tiny-llama", "prompt": "hi")"), 400, ""},
      {"JSON array", Post("/v1/completions", "[1, 2, 3]"), 400, ""},
      {"JSON string", Post("/v1/completions", "\"prompt\""), 400, ""},
      {"JSON null", Post("/v1/completions", "null"), 400, ""},
      {"invalid UTF-8 in a string", Post("/v1/completions", "{\"model\": \"tiny-llama\", \"prompt\": \"a\xff\xfe\"}"), 400, ""},
      {"overlong UTF-8", Post("/v1/completions", "{\"model\": \"tiny-llama\", \"prompt\": \"\xc0\xaf\"}"), 400, ""},
      {"lone surrogate escape", Completion(R"(, "prompt": "\ud800")"), 400, ""},
      {"NaN literal", Completion(R"(, "prompt": "hi", "temperature": NaN)"), 400, ""},
      {"Infinity literal", Completion(R"(, "prompt": "hi", "temperature": Infinity)"), 400, ""},
      {"200000-deep arrays", Post("/v1/completions", deep_array), 400, "prompt"},
      {"100000-deep objects in an unknown field", Post("/v1/completions", deep_object), 200, ""},
      {"control characters", Post("/v1/completions", "{\"model\": \"tiny-llama\", \"prompt\": \"a\x01b\"}"), 400, ""},
      // Fields.
      {"no model", Post("/v1/completions", R"({"prompt": "hi"})"), 400, "model"},
      {"unknown model", Post("/v1/completions", R"({"model": "gpt-5", "prompt": "hi"})"), 404, "model"},
      {"model is a number", Post("/v1/completions", R"({"model": 7, "prompt": "hi"})"), 400, "model"},
      {"no prompt", Completion(""), 400, "prompt"},
      {"prompt is a number", Completion(R"(, "prompt": 12)"), 400, "prompt"},
      {"prompt is an object", Completion(R"(, "prompt": {"a": 1})"), 400, "prompt"},
      {"empty token list", Completion(R"(, "prompt": [])"), 400, "prompt"},
      {"negative token id", Completion(R"(, "prompt": [1, -2])"), 400, "prompt"},
      {"huge token id", Completion(R"(, "prompt": [1e30])"), 400, "prompt"},
      {"token id past the vocabulary", Completion(R"(, "prompt": [99999999])"), 400, "prompt"},
      {"prompt past the context", Completion(ids_over), 400, "prompt"},
      {"long text prompt past the context", Completion(long_prompt), 400, "prompt"},
      {"max_tokens 0", Completion(R"(, "prompt": "hi", "max_tokens": 0)"), 400, "max_tokens"},
      {"max_tokens negative", Completion(R"(, "prompt": "hi", "max_tokens": -1)"), 400, "max_tokens"},
      {"max_tokens huge", Completion(R"(, "prompt": "hi", "max_tokens": 100000000000000000000)"), 400, "max_tokens"},
      {"max_tokens a string", Completion(R"(, "prompt": "hi", "max_tokens": "5")"), 400, "max_tokens"},
      {"max_tokens fractional", Completion(R"(, "prompt": "hi", "max_tokens": 1.5)"), 400, "max_tokens"},
      {"temperature negative", Completion(R"(, "prompt": "hi", "temperature": -1)"), 400, "temperature"},
      {"temperature overflows a double", Completion(R"(, "prompt": "hi", "temperature": 1e309)"), 400, ""},
      {"temperature huge", Completion(R"(, "prompt": "hi", "temperature": 1e300)"), 400, "temperature"},
      {"temperature a string", Completion(R"(, "prompt": "hi", "temperature": "NaN")"), 400, "temperature"},
      {"top_p 0", Completion(R"(, "prompt": "hi", "top_p": 0)"), 400, "top_p"},
      {"top_p over 1", Completion(R"(, "prompt": "hi", "top_p": 1.5)"), 400, "top_p"},
      {"top_k negative", Completion(R"(, "prompt": "hi", "top_k": -5)"), 400, "top_k"},
      {"logprobs 100", Completion(R"(, "prompt": "hi", "logprobs": 100)"), 400, "logprobs"},
      {"logprobs true", Completion(R"(, "prompt": "hi", "logprobs": true)"), 400, "logprobs"},
      {"n 0", Completion(R"(, "prompt": "hi", "n": 0)"), 400, "n"},
      {"n 1000", Completion(R"(, "prompt": "hi", "n": 1000)"), 400, "n"},
      {"n a string", Completion(R"(, "prompt": "hi", "n": "2")"), 400, "n"},
      {"five stop strings", Completion(R"(, "prompt": "hi", "stop": ["a", "b", "c", "d", "e"])"), 400, "stop"},
      {"stop a number", Completion(R"(, "prompt": "hi", "stop": 3)"), 400, "stop"},
      {"empty stop string", Completion(R"(, "prompt": "hi", "stop": [""])"), 400, "stop"},
      {"seed a string", Completion(R"(, "prompt": "hi", "seed": "x")"), 400, "seed"},
      {"seed a float", Completion(R"(, "prompt": "hi", "seed": 1e40)"), 400, "seed"},
      {"stream a string", Completion(R"(, "prompt": "hi", "stream": "yes")"), 400, "stream"},
      {"stream_options a string", Completion(R"(, "prompt": "hi", "stream_options": "x")"), 400, "stream_options"},
      {"presence_penalty 5", Completion(R"(, "prompt": "hi", "presence_penalty": 5)"), 400, "presence_penalty"},
      {"frequency_penalty -3", Completion(R"(, "prompt": "hi", "frequency_penalty": -3)"), 400, "frequency_penalty"},
      {"min_tokens over max_tokens", Completion(R"(, "prompt": "hi", "max_tokens": 2, "min_tokens": 5)"), 400,
       "min_tokens"},
      {"echo with logprobs", Completion(R"(, "prompt": "hi", "echo": true, "logprobs": 1)"), 400, "echo"},
      {"stop_token_ids negative", Completion(R"(, "prompt": "hi", "stop_token_ids": [-1])"), 400, "stop_token_ids"},
      {"ignore_eos a string", Completion(R"(, "prompt": "hi", "ignore_eos": "true")"), 400, "ignore_eos"},
      {"user a number", Completion(R"(, "prompt": "hi", "user": 5)"), 400, "user"},
      {"chat without messages", Chat(""), 400, "messages"},
      {"chat with empty messages", Chat(R"(, "messages": [])"), 400, "messages"},
      {"chat with an unknown role", Chat(R"(, "messages": [{"role": "root", "content": "x"}])"), 400, "messages"},
      {"chat content a number", Chat(R"(, "messages": [{"role": "user", "content": 5}])"), 400, "messages"},
      {"chat image part", Chat(R"(, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])"),
       400, "messages"},
      {"chat top_logprobs without logprobs", Chat(R"(, "messages": [{"role": "user", "content": "x"}], "top_logprobs": 3)"),
       400, "top_logprobs"},
      {"chat with tools", Chat(R"(, "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}])"),
       400, "tools"},
      {"chat max_completion_tokens negative",
       Chat(R"(, "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -4)"), 400,
       "max_completion_tokens"},
  };
  REQUIRE(cases.size() >= 60);

  // Ordinary traffic beside the hostile cases, the whole time.
  std::atomic<bool> stop{false};
  std::atomic<int> served{0}, failed{0};
  std::thread normal([&] {
    while (!stop.load()) {
      Reply r = Exchange(port, Completion(R"(, "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0)"));
      (r.status == 200 ? served : failed)++;
    }
  });

  for (const Case& k : cases) {
    INFO(k.name);
    Reply r = Exchange(port, k.raw, k.half_close);
    CHECK(r.status == k.status);
    CHECK(r.status != 500);
    if (k.status >= 400) {
      json err = json::parse(r.body, nullptr, false);
      REQUIRE(err.is_object());
      REQUIRE(err.contains("error"));
      CHECK(err["error"]["message"].is_string());
      CHECK_FALSE(err["error"]["message"].get<std::string>().empty());
      CHECK(err["error"]["type"].is_string());
      if (!k.param.empty()) CHECK(err["error"]["param"] == k.param);
      if (k.status == 401) CHECK(err["error"]["code"] == "invalid_api_key");
    }
  }

  // The ordinary client was served through every case above. (It stops here:
  // at the connection limit below, new clients are meant to get 503.)
  stop.store(true);
  normal.join();
  CHECK(failed.load() == 0);
  CHECK(served.load() > 0);

  // More connections than --max-connections: the extra ones get 503, the
  // router recovers when they close.
  {
    std::vector<int> held;
    for (int i = 0; i < 48; ++i) held.push_back(Connect(port));
    Reply over = Exchange(port, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    CHECK(over.status == 503);
    for (int fd : held) ::close(fd);
  }
  // A client that sends a request and vanishes: cancelled, no harm.
  {
    int fd = Connect(port);
    SendAll(fd, Completion(R"(, "prompt": "bye", "max_tokens": 500, "ignore_eos": true, "stream": true)"));
    ::close(fd);
  }

  // Everyone still alive and answering.
  Reply after = Exchange(port, Completion(R"(, "prompt": "still there?", "max_tokens": 3)"));
  CHECK(after.status == 200);
  auto stats = c.Stats();
  REQUIRE(stats.ok());
  CHECK((*stats)["workers"]["colocated-0"]["fresh"] == true);  // the worker answered just now
}

}  // namespace
}  // namespace duet::testing
