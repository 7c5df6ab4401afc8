// The webhook server under a flood of silent connections (H10; docs/benchmarks.md, "The
// webhooks under a connection flood"). The admission webhooks' server (controller/webhook/
// server.h) runs in this process with the controller's defaults and a client CA, serving a
// handler that answers every review at once (the server is what is measured, not the model).
// Reviews come from a client presenting a certificate of that CA, as the API server's admission
// kubeconfig makes it do, one at a time: R on a new connection each (a TCP and TLS handshake
// per review, as the API server pays when it has no idle connection) and R on one kept
// connection (keep-alive). Then the same while F flooding processes (6, then 64) each hold as
// many bare TCP connections as the server lets them from an address of their own (127.0.0.2,
// 127.0.0.3, ...), sending nothing and connecting again as soon as one is closed. Printed for
// each: the share of reviews answered, p50/p99/max of their time against the same reviews with
// no flood, the server's connection outcomes, and whether readiness held.
//
//   bench_webhook_flood [reviews=1000] [floods=6,64] [hold=256]
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <httplib.h>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "controller/webhook/server.h"
#include "test/support/fixture_host.h"

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;
namespace fs = std::filesystem;
using namespace cozy;

// A flooding process: holds up to `hold` connections from `source` to 127.0.0.1:port, sends
// nothing, and connects again whenever the server closes one. Runs until killed.
[[noreturn]] void Flood(const std::string& source, int port, int hold) {
  sockaddr_in local{};
  local.sin_family = AF_INET;
  ::inet_pton(AF_INET, source.c_str(), &local.sin_addr);
  sockaddr_in target{};
  target.sin_family = AF_INET;
  target.sin_port = htons(static_cast<uint16_t>(port));
  target.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::vector<pollfd> held;
  const auto connectOne = [&]() -> int {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof local) != 0 ||
        (::connect(fd, reinterpret_cast<sockaddr*>(&target), sizeof target) != 0 &&
         errno != EINPROGRESS)) {
      ::close(fd);
      return -1;
    }
    return fd;
  };
  for (;;) {
    while (static_cast<int>(held.size()) < hold) {
      const int fd = connectOne();
      if (fd < 0) break;
      held.push_back({fd, POLLIN | POLLRDHUP, 0});
    }
    if (held.empty()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    if (::poll(held.data(), held.size(), 100) <= 0) continue;
    for (auto it = held.begin(); it != held.end();) {
      if (it->revents != 0) {
        ::close(it->fd);
        it = held.erase(it);
      } else {
        ++it;
      }
    }
  }
}

struct Figures {
  int reviews = 0;
  int answered = 0;
  double p50 = 0;
  double p99 = 0;
  double max = 0;
};

Figures Summarize(std::vector<double> times, int reviews) {
  Figures figures;
  figures.reviews = reviews;
  figures.answered = static_cast<int>(times.size());
  if (times.empty()) return figures;
  std::sort(times.begin(), times.end());
  const auto at = [&](double q) {
    return times[std::min(times.size() - 1,
                          static_cast<size_t>(q * static_cast<double>(times.size())))];
  };
  figures.p50 = at(0.50);
  figures.p99 = at(0.99);
  figures.max = times.back();
  return figures;
}

class Bench {
 public:
  explicit Bench(const fs::path& dir) : dir_(dir) {}

  void MakeCertificates() {
    const std::string d = testing::ShellQuote(dir_.string());
    const auto made = testing::RunCommand(
        "cd " + d +
        " && openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 1"
        " -subj /CN=webhook-ca 2>/dev/null"
        " && printf 'subjectAltName=IP:127.0.0.1\\n' > san.ext"
        " && openssl req -newkey rsa:2048 -nodes -keyout tls.key -out tls.csr -subj /CN=webhook"
        " 2>/dev/null"
        " && openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial"
        " -out tls.crt -days 1 -extfile san.ext 2>/dev/null"
        " && openssl req -x509 -newkey rsa:2048 -nodes -keyout callers-ca.key"
        " -out callers-ca.crt -days 1 -subj /CN=callers-ca 2>/dev/null"
        " && printf 'extendedKeyUsage=clientAuth\\n' > client.ext"
        " && openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr"
        " -subj /CN=kube-apiserver 2>/dev/null"
        " && openssl x509 -req -in apiserver.csr -CA callers-ca.crt -CAkey callers-ca.key"
        " -CAcreateserial -out apiserver.crt -days 1 -extfile client.ext 2>/dev/null");
    if (made.exitCode != 0) throw std::runtime_error("openssl: " + made.err);
  }

  std::unique_ptr<httplib::SSLClient> Caller(int port, bool keep) const {
    auto client = std::make_unique<httplib::SSLClient>(
        "127.0.0.1", port, (dir_ / "apiserver.crt").string(), (dir_ / "apiserver.key").string());
    client->set_ca_cert_path((dir_ / "ca.crt").c_str());
    client->enable_server_certificate_verification(true);
    client->set_keep_alive(keep);
    client->set_tcp_nodelay(true);  // as Go's net/http, the API server's client, does
    client->set_connection_timeout(std::chrono::seconds(10));
    client->set_read_timeout(std::chrono::seconds(10));  // the API server's default timeout
    client->set_write_timeout(std::chrono::seconds(10));
    return client;
  }

  // `reviews` reviews, one at a time, each on a new connection or all on one kept connection;
  // the times of those answered with their own uid.
  Figures Run(int port, int reviews, bool keep) {
    std::vector<double> times;
    std::unique_ptr<httplib::SSLClient> kept = keep ? Caller(port, true) : nullptr;
    for (int i = 0; i < reviews; ++i) {
      const std::string uid = "r-" + std::to_string(++uid_);
      const std::string body =
          R"({"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":")" +
          uid + R"("}})";
      const auto start = Clock::now();
      std::unique_ptr<httplib::SSLClient> fresh = keep ? nullptr : Caller(port, false);
      httplib::SSLClient& client = keep ? *kept : *fresh;
      auto answer = client.Post("/validate/gpudevices", body, "application/json");
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
      if (answer && answer->status == 200) {
        const json decoded = json::parse(answer->body, nullptr, false);
        if (decoded.is_object() && decoded.value("/response/uid"_json_pointer, "") == uid) {
          times.push_back(ms);
        }
      }
    }
    return Summarize(std::move(times), reviews);
  }

 private:
  fs::path dir_;
  int uid_ = 0;
};

std::vector<int> ParseList(const std::string& text) {
  std::vector<int> values;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) values.push_back(std::stoi(item));
  return values;
}

void Print(const char* label, const Figures& figures, const Figures& peer) {
  std::printf("  %-30s answered %5d/%-5d (%6.2f%%)  p50 %8.3f ms  p99 %8.3f ms  max %9.3f ms",
              label, figures.answered, figures.reviews,
              100.0 * figures.answered / std::max(1, figures.reviews), figures.p50, figures.p99,
              figures.max);
  if (&figures != &peer && peer.p99 > 0) {
    std::printf("  p99 / no flood %.2fx", figures.p99 / peer.p99);
  }
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 5 && std::string(argv[1]) == "--flood") {
    Flood(argv[2], std::atoi(argv[3]), std::atoi(argv[4]));
  }
  const int reviews = argc > 1 ? std::atoi(argv[1]) : 1000;
  const std::vector<int> floods = ParseList(argc > 2 ? argv[2] : "6,64");
  const int hold = argc > 3 ? std::atoi(argv[3]) : 256;
  std::signal(SIGPIPE, SIG_IGN);
  try {
    testing::TempDir dir;
    Bench bench(dir.path());
    bench.MakeCertificates();
    fs::create_directories(dir.path() / "secret");
    fs::copy_file(dir.path() / "tls.crt", dir.path() / "secret" / "tls.crt");
    fs::copy_file(dir.path() / "tls.key", dir.path() / "secret" / "tls.key");
    controller::webhook::ServerOptions options;  // the controller's defaults
    options.address = "127.0.0.1:0";
    options.certDir = dir.path() / "secret";
    options.clientCaFile = dir.path() / "callers-ca.crt";
    controller::webhook::Server server(options);
    server.Handle(
        "/validate/gpudevices", [](const json& review, const controller::webhook::RequestContext&) {
          return json{{"apiVersion", "admission.k8s.io/v1"},
                      {"kind", "AdmissionReview"},
                      {"response", {{"uid", review["request"]["uid"]}, {"allowed", true}}}};
        });
    server.Start();
    const int port = server.port();
    std::printf(
        "webhook server on 127.0.0.1:%d: %zu connections, %zu per unauthenticated "
        "address, handshake deadline %lld ms, %zu reviews per kept connection; "
        "%d reviews each way, flooding processes holding up to %d connections each\n",
        port, options.maxConnections, options.maxConnectionsPerPeer,
        static_cast<long long>(options.handshakeDeadline.count()), options.requestsPerConnection,
        reviews, hold);
    (void)bench.Run(port, 50, false);  // warm-up
    (void)bench.Run(port, 50, true);
    const Figures quietFresh = bench.Run(port, reviews, false);
    const Figures quietKept = bench.Run(port, reviews, true);
    std::printf("no flood\n");
    Print("new connection per review", quietFresh, quietFresh);
    Print("one kept connection", quietKept, quietKept);
    std::printf("  kept / new connection, p50 %.2fx\n", quietKept.p50 / quietFresh.p50);
    const std::string self = fs::read_symlink("/proc/self/exe");
    for (const int flooders : floods) {
      std::vector<pid_t> children;
      for (int i = 0; i < flooders; ++i) {
        const std::string source =
            "127.0." + std::to_string(2 + i / 250) + "." + std::to_string(2 + i % 250);
        const pid_t child = ::fork();
        if (child == 0) {
          const std::string portText = std::to_string(port);
          const std::string holdText = std::to_string(hold);
          ::execl(self.c_str(), self.c_str(), "--flood", source.c_str(), portText.c_str(),
                  holdText.c_str(), static_cast<char*>(nullptr));
          std::_Exit(127);
        }
        children.push_back(child);
      }
      std::this_thread::sleep_for(std::chrono::seconds(2));  // the flood fills every slot
      const auto before = server.stats().http;
      std::atomic<bool> sampling{true};
      std::atomic<int> samples{0};
      std::atomic<int> notReady{0};
      std::thread readiness([&] {
        while (sampling) {
          ++samples;
          if (server.Saturated()) ++notReady;
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
      });
      const Figures fresh = bench.Run(port, reviews, false);
      const Figures kept = bench.Run(port, reviews, true);
      sampling = false;
      readiness.join();
      const auto after = server.stats().http;
      for (const pid_t child : children) ::kill(child, SIGKILL);
      for (const pid_t child : children) ::waitpid(child, nullptr, 0);
      std::printf("%d flooding processes (127.0.0.2 and up)\n", flooders);
      Print("new connection per review", fresh, quietFresh);
      Print("one kept connection", kept, quietKept);
      std::printf(
          "  connections meanwhile: %lld accepted, %lld closed for newer ones, %lld past "
          "their address's cap, %lld timed out, %lld turned away; readiness not ready in "
          "%d of %d samples\n",
          static_cast<long long>(after.accepted - before.accepted),
          static_cast<long long>(after.overflowed - before.overflowed),
          static_cast<long long>(after.peerCapped - before.peerCapped),
          static_cast<long long>(after.timedOut - before.timedOut),
          static_cast<long long>(after.turnedAway - before.turnedAway), notReady.load(),
          samples.load());
      std::this_thread::sleep_for(options.handshakeDeadline + std::chrono::seconds(1));
    }
    server.Stop();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "bench_webhook_flood: %s\n", error.what());
    return 1;
  }
  return 0;
}
