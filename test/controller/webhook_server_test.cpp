// The admission webhooks' HTTPS server: a real TLS handshake against certificates
// the openssl CLI makes per run, laid out as kubelet mounts a Secret (`..data` a symlink to a
// timestamped directory, `tls.crt` and `tls.key` symlinks through it). A replaced pair is served
// from the next handshake on; a broken one leaves the last good pair in use; the API server's
// `timeout` sets each request's deadline; requests that wait never keep the others waiting.
#include <gtest/gtest.h>
#include <httplib.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <csignal>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <future>
#include <iomanip>
#include <mutex>
#include <sstream>
#include <thread>

#include "api/json_field.h"
#include "controller/webhook/server.h"
#include "test/support/fixture_host.h"

namespace cozy::controller::webhook {
namespace {

namespace fs = std::filesystem;
using cozy::testing::RunCommand;
using cozy::testing::ShellQuote;
using nlohmann::json;

class WebhookServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The server cuts a refused upload short; the client must see an error, not die of it.
    std::signal(SIGPIPE, SIG_IGN);
    // One CA; two serving certificates for the Service's name, told apart by their CN. Made
    // once for every test here (MakeOnce), each copying them into its own directory.
    const std::string script =
        "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 1 "
        "-subj /CN=webhook-ca 2>/dev/null"
        " && printf 'subjectAltName=DNS:gpu-controller-webhook.cozy-system.svc,IP:127.0.0.1\\n'"
        " > san.ext"
        " && for n in first second; do"
        "   openssl req -newkey rsa:2048 -nodes -keyout $n.key -out $n.csr -subj /CN=$n "
        "   2>/dev/null &&"
        "   openssl x509 -req -in $n.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out $n.crt "
        "   -days 1 -extfile san.ext 2>/dev/null || exit 1;"
        " done";
    const auto made = cozy::testing::MakeOnce(script, dir_.path());
    ASSERT_EQ(made.exitCode, 0) << made.err;
    certDir_ = dir_.path() / "secret";
    fs::create_directories(certDir_);
    Publish("first");
    fs::create_symlink("..data/tls.crt", certDir_ / "tls.crt");
    fs::create_symlink("..data/tls.key", certDir_ / "tls.key");
  }

  // As kubelet updates a Secret volume: a new timestamped directory, then `..data` swapped to
  // it by renaming a new symlink over the old one.
  void Publish(const std::string& name, const std::string& keyName = "") {
    const fs::path version = certDir_ / ("..version-" + std::to_string(++versions_));
    fs::create_directories(version);
    fs::copy_file(dir_.path() / (name + ".crt"), version / "tls.crt");
    fs::copy_file(dir_.path() / ((keyName.empty() ? name : keyName) + ".key"), version / "tls.key");
    const fs::path next = certDir_ / "..data_tmp";
    fs::create_symlink(version.filename(), next);
    fs::rename(next, certDir_ / "..data");
  }

  // The subject the server presents on a fresh handshake, as openssl s_client sees it.
  std::string ServedSubject(int port) {
    const auto shown =
        RunCommand("openssl s_client -connect 127.0.0.1:" + std::to_string(port) +
                   " -servername gpu-controller-webhook.cozy-system.svc </dev/null 2>/dev/null"
                   " | openssl x509 -noout -subject");
    return shown.out;
  }

  httplib::Result Post(int port, const std::string& path, const std::string& body) {
    httplib::SSLClient client("127.0.0.1", port);
    client.set_ca_cert_path((dir_.path() / "ca.crt").c_str());
    client.enable_server_certificate_verification(true);
    client.set_read_timeout(std::chrono::seconds(10));
    return client.Post(path.c_str(), body, "application/json");
  }

  // Loopback, a free port, the Secret-like directory.
  ServerOptions Options() const {
    ServerOptions options;
    options.address = "127.0.0.1:0";
    options.certDir = certDir_;
    return options;
  }

  static json Echo(const json& review, const RequestContext&) {
    return {{"apiVersion", "admission.k8s.io/v1"},
            {"kind", "AdmissionReview"},
            {"response", {{"uid", review["request"]["uid"]}, {"allowed", true}}}};
  }

  cozy::testing::TempDir dir_;
  fs::path certDir_;
  int versions_ = 0;
};

TEST_F(WebhookServerTest, AnswersAReviewOverVerifiedTls) {
  ServerOptions options = Options();
  Server server(options);
  server.Handle("/validate/gpudevices", Echo);
  server.Start();
  ASSERT_TRUE(server.serving());
  auto answer = Post(server.port(), "/validate/gpudevices",
                     R"({"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview",)"
                     R"("request":{"uid":"u-1"}})");
  ASSERT_TRUE(answer) << httplib::to_string(answer.error());
  EXPECT_EQ(answer->status, 200);
  EXPECT_EQ(json::parse(answer->body)["response"]["uid"], "u-1");
  // Not JSON: 400, which the API server reads as a failed call (failurePolicy Fail denies).
  auto bad = Post(server.port(), "/validate/gpudevices", "{not json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  // A path nobody serves.
  auto unknown = Post(server.port(), "/mutate/nothing", "{}");
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 404);
  EXPECT_EQ(server.stats().requests, 2);
  EXPECT_EQ(server.stats().failures, 1);
}

// H9: with a client CA only a caller presenting a certificate it signed (the API server's
// admission kubeconfig) completes the handshake; no certificate, or one of another CA, is refused
// before the handler sees anything. A replaced CA file is used from the next handshake on.
TEST_F(WebhookServerTest, OnlyCallersWithACertificateOfTheClientCaGetIn) {
  const std::string d = ShellQuote(dir_.path().string());
  const auto made = RunCommand(
      "cd " + d +
      " && for ca in callers rogue; do"
      "   openssl req -x509 -newkey rsa:2048 -nodes -keyout $ca-ca.key -out $ca-ca.crt -days 1 "
      "   -subj /CN=$ca-ca 2>/dev/null || exit 1;"
      " done"
      " && printf 'extendedKeyUsage=clientAuth\\n' > client.ext"
      " && for pair in apiserver:callers mallory:rogue; do n=${pair%%:*}; ca=${pair#*:};"
      "   openssl req -newkey rsa:2048 -nodes -keyout $n.key -out $n.csr -subj /CN=$n "
      "   2>/dev/null &&"
      "   openssl x509 -req -in $n.csr -CA $ca-ca.crt -CAkey $ca-ca.key -CAcreateserial "
      "   -out $n.crt -days 1 -extfile client.ext 2>/dev/null || exit 1;"
      " done && cp callers-ca.crt client-ca.crt");
  ASSERT_EQ(made.exitCode, 0) << made.err;
  std::atomic<int> handled{0};
  ServerOptions options = Options();
  options.clientCaFile = dir_.path() / "client-ca.crt";
  Server server(options);
  server.Handle("/mutate/virtualmachineinstances",
                [&handled](const json& review, const RequestContext& context) {
                  ++handled;
                  return Echo(review, context);
                });
  server.Start();
  auto call = [&](const std::string& who) {
    std::unique_ptr<httplib::SSLClient> client;
    if (who.empty()) {
      client = std::make_unique<httplib::SSLClient>("127.0.0.1", server.port());
    } else {
      client = std::make_unique<httplib::SSLClient>("127.0.0.1", server.port(),
                                                    (dir_.path() / (who + ".crt")).string(),
                                                    (dir_.path() / (who + ".key")).string());
    }
    client->set_ca_cert_path((dir_.path() / "ca.crt").c_str());
    client->enable_server_certificate_verification(true);
    client->set_read_timeout(std::chrono::seconds(10));
    auto answer =
        client->Post("/mutate/virtualmachineinstances",
                     R"({"request":{"uid":"forged","namespace":"victim"}})", "application/json");
    return answer ? answer->status : -1;
  };
  EXPECT_EQ(call(""), -1) << "no client certificate";
  EXPECT_EQ(call("mallory"), -1) << "a certificate of another CA";
  EXPECT_EQ(handled.load(), 0) << "a refused caller reached the handler";
  EXPECT_EQ(call("apiserver"), 200);
  EXPECT_EQ(handled.load(), 1);
  EXPECT_EQ(server.stats().requests, 1);

  // The CA file replaced (a rotated ConfigMap): the next handshake verifies against the new one.
  fs::copy_file(dir_.path() / "rogue-ca.crt", dir_.path() / "client-ca.next");
  fs::rename(dir_.path() / "client-ca.next", dir_.path() / "client-ca.crt");
  EXPECT_EQ(call("mallory"), 200);
  EXPECT_EQ(call("apiserver"), -1);
  // A broken replacement keeps the last good CA.
  std::ofstream(dir_.path() / "client-ca.next") << "not a certificate\n";
  fs::rename(dir_.path() / "client-ca.next", dir_.path() / "client-ca.crt");
  EXPECT_EQ(call("mallory"), 200);
  EXPECT_EQ(call(""), -1);
}

TEST_F(WebhookServerTest, AClientCaThatDoesNotLoadStopsTheStartNamingTheFile) {
  for (const std::string content : {"", "no PEM here\n"}) {
    const fs::path file = dir_.path() / "bad-ca.crt";
    fs::remove(file);
    if (!content.empty()) std::ofstream(file) << content;
    ServerOptions options;
    options.address = "127.0.0.1:0";
    options.certDir = certDir_;
    options.clientCaFile = file;
    Server server(options);
    try {
      server.Start();
      ADD_FAILURE() << "started with the client CA " << content;
    } catch (const std::exception& error) {
      EXPECT_NE(std::string(error.what()).find(file.string()), std::string::npos) << error.what();
    }
  }
}

// docs/security.md, "Hardening done": one request must not take the process down. A 400 KB body
// nested 200,000 arrays deep (which overflowed the stack of a recursive parse: binder, reconciler
// and webhooks died with it) is a 400; a body over the cap is refused before it is parsed; the
// server answers on.
TEST_F(WebhookServerTest, ADeeplyNestedOrOversizedBodyIsRefusedAndTheServerAnswersOn) {
  ServerOptions options = Options();
  Server server(options);
  server.Handle("/validate/gpudevices", Echo);
  server.Start();
  const std::string deep = std::string(200'000, '[') + std::string(200'000, ']');
  auto nested = Post(server.port(), "/validate/gpudevices", deep);
  ASSERT_TRUE(nested) << httplib::to_string(nested.error());
  EXPECT_EQ(nested->status, 400);
  EXPECT_NE(nested->body.find("deeper than"), std::string::npos) << nested->body;
  const std::string huge =
      R"({"request":{"uid":"big","object":")" + std::string(options.maxBodyBytes, 'x') + R"("}})";
  auto oversized = Post(server.port(), "/validate/gpudevices", huge);
  if (oversized) {  // or the connection is cut mid-send
    EXPECT_EQ(oversized->status, 413);
  }
  EXPECT_EQ(options.maxBodyBytes, size_t{3} << 20);
  auto after = Post(server.port(), "/validate/gpudevices", R"({"request":{"uid":"u-3"}})");
  ASSERT_TRUE(after);
  EXPECT_EQ(after->status, 200);
  EXPECT_EQ(json::parse(after->body)["response"]["uid"], "u-3");
}

// docs/security.md, "Hardening done": TLS as a hoster's scanner expects it. TLS 1.2 offers
// forward-secret AEAD suites only (a SHA-1 CBC suite is refused), no session ticket is issued, and
// the served certificate's expiry is exported (it is a day away here).
TEST_F(WebhookServerTest, ModernCiphersNoSessionTicketsAndTheCertificatesExpiry) {
  ServerOptions options = Options();
  Server server(options);
  server.Handle("/validate/gpudevices", Echo);
  server.Start();
  auto handshake = [&](const std::string& flags) {
    return RunCommand("openssl s_client -connect 127.0.0.1:" + std::to_string(server.port()) + " " +
                      flags + " </dev/null 2>&1");
  };
  const auto cbc = handshake("-tls1_2 -cipher AES128-SHA");
  EXPECT_NE(cbc.exitCode, 0) << cbc.out;
  const auto sha1 = handshake("-tls1_2 -cipher ECDHE-RSA-AES128-SHA");
  EXPECT_NE(sha1.exitCode, 0) << sha1.out;
  const auto gcm = handshake("-tls1_2 -cipher ECDHE-RSA-AES128-GCM-SHA256");
  EXPECT_EQ(gcm.exitCode, 0) << gcm.out;
  EXPECT_EQ(gcm.out.find("TLS session ticket:"), std::string::npos) << gcm.out;
  const auto tls13 = handshake("-tls1_3");
  EXPECT_EQ(tls13.exitCode, 0) << tls13.out;
  EXPECT_EQ(tls13.out.find("TLS session ticket:"), std::string::npos) << tls13.out;

  const auto end = RunCommand("openssl x509 -noout -enddate -dateopt iso_8601 -in " +
                              ShellQuote((dir_.path() / "first.crt").string()));
  ASSERT_EQ(end.exitCode, 0) << end.err;
  std::tm parts{};
  std::istringstream(end.out.substr(end.out.find('=') + 1)) >>
      std::get_time(&parts, "%Y-%m-%d %H:%M:%S");
  EXPECT_EQ(server.stats().certificateNotAfter, static_cast<int64_t>(timegm(&parts))) << end.out;
}

TEST_F(WebhookServerTest, AHandlerThatThrowsIsA500NamingThePath) {
  ServerOptions options = Options();
  Server server(options);
  server.Handle("/mutate/pods", [](const json&, const RequestContext&) -> json {
    throw std::runtime_error("the review has no request");
  });
  server.Start();
  auto answer = Post(server.port(), "/mutate/pods", "{}");
  ASSERT_TRUE(answer);
  EXPECT_EQ(answer->status, 500);
  EXPECT_NE(answer->body.find("/mutate/pods: the review has no request"), std::string::npos)
      << answer->body;
}

// docs/controller.md, "Admission webhooks": a review that does not decode is answered as an
// AdmissionReview denying with code 400 and the reason, carrying the request's uid, rather than as
// an HTTP error the API server reports only as a failed call.
TEST_F(WebhookServerTest, AMalformedReviewIsAnsweredAsADenialWithCode400) {
  ServerOptions options = Options();
  Server server(options);
  server.Handle("/mutate/pods", [](const json& review, const RequestContext&) -> json {
    if (!review.contains("request") || !review["request"].contains("kind")) {
      throw api::DecodeError("request.kind", "is missing");
    }
    return Echo(review, {});
  });
  server.Start();
  auto answer = Post(server.port(), "/mutate/pods", R"({"request":{"uid":"u-9"}})");
  ASSERT_TRUE(answer) << httplib::to_string(answer.error());
  EXPECT_EQ(answer->status, 200);
  const json review = json::parse(answer->body);
  EXPECT_EQ(review["kind"], "AdmissionReview");
  EXPECT_EQ(review["response"]["uid"], "u-9");
  EXPECT_EQ(review["response"]["allowed"], false);
  EXPECT_EQ(review["response"]["status"]["code"], 400);
  EXPECT_NE(review["response"]["status"]["message"].get<std::string>().find("request.kind"),
            std::string::npos)
      << answer->body;
  EXPECT_EQ(server.stats().failures, 1);
}

TEST_F(WebhookServerTest, ReplacedCertificateFilesAreServedFromTheNextHandshake) {
  ServerOptions options = Options();
  Server server(options);
  server.Handle("/validate/gpudevices", Echo);
  server.Start();
  EXPECT_NE(ServedSubject(server.port()).find("CN = first"), std::string::npos);
  Publish("second");
  EXPECT_NE(ServedSubject(server.port()).find("CN = second"), std::string::npos);
  EXPECT_EQ(server.stats().certificateLoads, 2);
  // A pair whose key does not match: logged, counted, and the last good pair stays.
  Publish("first", "second");
  EXPECT_NE(ServedSubject(server.port()).find("CN = second"), std::string::npos);
  EXPECT_EQ(server.stats().certificateErrors, 1);
  auto answer = Post(server.port(), "/validate/gpudevices", R"({"request":{"uid":"u-2"}})");
  ASSERT_TRUE(answer) << httplib::to_string(answer.error());
  EXPECT_EQ(answer->status, 200);
  // Fixed again: served again.
  Publish("first");
  EXPECT_NE(ServedSubject(server.port()).find("CN = first"), std::string::npos);
}

TEST_F(WebhookServerTest, StartFailsNamingAMissingOrMismatchedFile) {
  ServerOptions options;
  options.address = "127.0.0.1:0";
  options.certDir = dir_.path() / "nowhere";
  Server missing(options);
  try {
    missing.Start();
    FAIL() << "started without a certificate";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find("nowhere/tls.crt"), std::string::npos) << error.what();
  }
  Publish("first", "second");
  options.certDir = certDir_;
  Server mismatched(options);
  try {
    mismatched.Start();
    FAIL() << "started with a key that does not match";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find("does not match"), std::string::npos) << error.what();
  }
  options.address = "127.0.0.1:notaport";
  Publish("first");
  Server badAddress(options);
  EXPECT_THROW(badAddress.Start(), std::runtime_error);
}

TEST_F(WebhookServerTest, TheApiServersTimeoutSetsTheDeadline) {
  EXPECT_EQ(RequestTimeout("30s"), std::chrono::seconds(30));
  EXPECT_EQ(RequestTimeout("5s"), std::chrono::seconds(5));
  EXPECT_EQ(RequestTimeout(""), std::chrono::seconds(10));  // the API server's default
  EXPECT_EQ(RequestTimeout("soon"), std::chrono::seconds(10));
  ServerOptions options = Options();
  Server server(options);
  std::mutex mutex;
  std::vector<std::chrono::milliseconds> left;
  server.Handle("/mutate/virtualmachineinstances",
                [&](const json& review, const RequestContext& context) {
                  std::lock_guard lock(mutex);
                  left.push_back(std::chrono::duration_cast<std::chrono::milliseconds>(
                      context.deadline - std::chrono::steady_clock::now()));
                  return Echo(review, context);
                });
  server.Start();
  ASSERT_TRUE(Post(server.port(), "/mutate/virtualmachineinstances?timeout=5s",
                   R"({"request":{"uid":"a"}})"));
  ASSERT_TRUE(Post(server.port(), "/mutate/virtualmachineinstances?timeout=30s",
                   R"({"request":{"uid":"b"}})"));
  ASSERT_EQ(left.size(), 2u);
  // 5 s less a tenth for the way back; 30 s less at most one second.
  EXPECT_LE(left[0], std::chrono::milliseconds(4500));
  EXPECT_GT(left[0], std::chrono::milliseconds(3500));
  EXPECT_LE(left[1], std::chrono::seconds(29));
  EXPECT_GT(left[1], std::chrono::seconds(27));
}

TEST_F(WebhookServerTest, RequestsThatWaitNeverKeepTheOthersWaiting) {
  ServerOptions options = Options();
  options.threads = 4;
  options.maxWaiting = 2;
  Server server(options);
  std::mutex mutex;
  std::condition_variable released;
  bool release = false;
  int waiting = 0;
  int turnedAway = 0;
  server.Handle("/mutate/virtualmachineinstances",
                [&](const json& review, const RequestContext& context) {
                  auto slot = server.TryWait();
                  std::unique_lock lock(mutex);
                  if (!slot) {
                    ++turnedAway;
                    return Echo(review, context);
                  }
                  ++waiting;
                  released.notify_all();
                  released.wait(lock, [&] { return release; });
                  return Echo(review, context);
                });
  server.Handle("/validate/gpudevices", Echo);
  server.Start();
  std::vector<std::future<httplib::Result>> slow;
  for (int i = 0; i < 2; ++i) {
    slow.push_back(std::async(std::launch::async, [&] {
      return Post(server.port(), "/mutate/virtualmachineinstances", R"({"request":{"uid":"s"}})");
    }));
  }
  {
    std::unique_lock lock(mutex);
    ASSERT_TRUE(released.wait_for(lock, std::chrono::seconds(20), [&] { return waiting == 2; }));
  }
  // Both slots are taken: a third start is turned away at once, and an order is answered while
  // the two still wait.
  auto third = Post(server.port(), "/mutate/virtualmachineinstances", R"({"request":{"uid":"t"}})");
  ASSERT_TRUE(third);
  auto order = Post(server.port(), "/validate/gpudevices", R"({"request":{"uid":"o"}})");
  ASSERT_TRUE(order);
  EXPECT_EQ(order->status, 200);
  {
    std::lock_guard lock(mutex);
    EXPECT_EQ(turnedAway, 1);
    EXPECT_EQ(waiting, 2);
    release = true;
  }
  released.notify_all();
  for (auto& request : slow) {
    auto answer = request.get();
    ASSERT_TRUE(answer);
    EXPECT_EQ(answer->status, 200);
  }
}

// A plain TCP connection to the webhook port that sends a byte now and then: a slow client, or
// a caller that never finishes its TLS handshake.
int Trickler(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    ::close(fd);
    return -1;
  }
  (void)::send(fd, "\x16", 1, MSG_NOSIGNAL);  // the first byte of a TLS record, and no more
  return fd;
}

// docs/security.md, "Hardening done": the abuse the agent's probe server withstands, against the
// webhook port. cpp-httplib, which served it before, timed out a normal review with 64
// one-byte-a-second clients while readiness said ok, and buffered an endless header line. Here slow
// clients are closed at the request deadline counted from accept (and evicted first when the
// connections are all taken), an endless header is 431 at 16 KiB, and a review is answered
// throughout.
TEST_F(WebhookServerTest, SlowClientsAndHeaderFloodsNeverKeepAReviewFromBeingAnswered) {
  ServerOptions options = Options();
  options.maxConnections = 32;
  options.requestDeadline = std::chrono::milliseconds(1500);
  Server server(options);
  server.Handle("/validate/gpudevices", Echo);
  server.Start();
  std::vector<int> slow;
  for (int i = 0; i < 64; ++i) {
    const int fd = Trickler(server.port());
    ASSERT_GE(fd, 0);
    slow.push_back(fd);
  }
  // A header line that never ends, over TLS.
  httplib::SSLClient flood("127.0.0.1", server.port());
  flood.set_ca_cert_path((dir_.path() / "ca.crt").c_str());
  flood.enable_server_certificate_verification(true);
  auto flooded = flood.Post("/validate/gpudevices", {{"X-Flood", std::string(1 << 20, 'a')}}, "{}",
                            "application/json");
  if (flooded) {  // or the connection is cut mid-send
    EXPECT_EQ(flooded->status, 431);
  }
  for (int round = 0; round < 3; ++round) {
    const auto start = std::chrono::steady_clock::now();
    auto answer = Post(server.port(), "/validate/gpudevices", R"({"request":{"uid":"r"}})");
    ASSERT_TRUE(answer) << httplib::to_string(answer.error());
    EXPECT_EQ(answer->status, 200);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
    for (int i = 0; i < 8; ++i) {
      const int fd = Trickler(server.port());  // more keep coming
      if (fd >= 0) slow.push_back(fd);
    }
  }
  std::this_thread::sleep_for(options.requestDeadline + std::chrono::milliseconds(300));
  const Server::Stats stats = server.stats();
  EXPECT_GE(stats.http.timedOut + stats.http.overflowed + stats.http.peerCapped, 64)
      << "slow clients outlived the deadline";
  EXPECT_GE(stats.http.rejected, flooded ? 1 : 0);
  for (const int fd : slow) ::close(fd);
}

// A plain TCP connection from another loopback address (127.0.0.2 and up: another peer to the
// server) that sends nothing; -1 when it cannot connect.
int SilentFrom(int port, const std::string& source) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in local{};
  local.sin_family = AF_INET;
  ::inet_pton(AF_INET, source.c_str(), &local.sin_addr);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof local) != 0 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// H10: bare connects that send nothing, from many addresses, more than every slot: an
// authenticated caller's kept connection is never closed for them (its next review comes on
// it), a caller's new connection gets through, a stalled handshake is closed at the handshake
// deadline, and readiness is not taken by the flood. Before, the server closed every connection
// after one answer, and made room by age alone, so such a flood failed 37 of 40 reviews.
TEST_F(WebhookServerTest, SilentFloodsNeverCloseAnAuthenticatedCallerH10) {
  const std::string d = ShellQuote(dir_.path().string());
  const auto made = RunCommand(
      "cd " + d +
      " && openssl req -x509 -newkey rsa:2048 -nodes -keyout callers-ca.key -out callers-ca.crt"
      " -days 1 -subj /CN=callers-ca 2>/dev/null"
      " && printf 'extendedKeyUsage=clientAuth\\n' > client.ext"
      " && openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr"
      " -subj /CN=apiserver 2>/dev/null"
      " && openssl x509 -req -in apiserver.csr -CA callers-ca.crt -CAkey callers-ca.key"
      " -CAcreateserial -out apiserver.crt -days 1 -extfile client.ext 2>/dev/null");
  ASSERT_EQ(made.exitCode, 0) << made.err;
  ServerOptions options = Options();
  options.clientCaFile = dir_.path() / "callers-ca.crt";
  options.maxConnections = 16;
  options.handshakeDeadline = std::chrono::milliseconds(500);
  Server server(options);
  server.Handle("/validate/gpudevices", Echo);
  server.Start();
  const auto caller = [&] {
    auto client = std::make_unique<httplib::SSLClient>("127.0.0.1", server.port(),
                                                       (dir_.path() / "apiserver.crt").string(),
                                                       (dir_.path() / "apiserver.key").string());
    client->set_ca_cert_path((dir_.path() / "ca.crt").c_str());
    client->enable_server_certificate_verification(true);
    client->set_keep_alive(true);
    client->set_read_timeout(std::chrono::seconds(10));
    return client;
  };
  const auto review = [](httplib::SSLClient& client, const std::string& uid) {
    auto answer = client.Post("/validate/gpudevices", R"({"request":{"uid":")" + uid + R"("}})",
                              "application/json");
    return answer ? answer->status : -1;
  };
  auto kept = caller();
  ASSERT_EQ(review(*kept, "first"), 200);

  std::vector<int> flood;
  for (int address = 2; address < 10; ++address) {
    for (int i = 0; i < 12; ++i) {
      const int fd = SilentFrom(server.port(), "127.0.0.10" + std::to_string(address));
      ASSERT_GE(fd, 0);
      flood.push_back(fd);
    }
  }
  const auto settled = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (server.stats().http.accepted < 97 && std::chrono::steady_clock::now() < settled) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_GE(server.stats().http.overflowed, 96 - 15) << "the flood did not fill every slot";
  EXPECT_EQ(review(*kept, "second"), 200);
  EXPECT_EQ(server.stats().http.reused, 1) << "the kept connection was closed for the flood";
  // A caller's new connection, with the slots full of the flood, more of it coming between.
  for (int round = 0; round < 4; ++round) {
    for (int i = 0; i < 16; ++i) {
      const int fd = SilentFrom(server.port(), "127.0.1." + std::to_string(10 + round));
      if (fd >= 0) flood.push_back(fd);
    }
    auto fresh = caller();
    EXPECT_EQ(review(*fresh, "fresh-" + std::to_string(round)), 200) << "round " << round;
  }
  EXPECT_FALSE(server.Saturated()) << "a flood of silent connections took readiness";
  EXPECT_EQ(server.stats().http.turnedAway, 0);
  // The flood's last connections never finished a handshake: closed at its deadline, long
  // before the request deadline (10 s).
  std::this_thread::sleep_for(options.handshakeDeadline + std::chrono::milliseconds(500));
  EXPECT_LE(server.stats().http.open, 1 + 4) << "stalled handshakes outlived their deadline";
  EXPECT_EQ(review(*kept, "third"), 200);
  EXPECT_EQ(server.stats().http.reused, 2);
  for (const int fd : flood) ::close(fd);
}

// docs/security.md, "Hardening done": a full pool answers 503 at once instead of queueing without
// bound, and says it is saturated (readiness then takes the replica out of the Service).
TEST_F(WebhookServerTest, AFullPoolIsRefusedAtOnceAndSaysItIsSaturated) {
  ServerOptions options = Options();
  options.threads = 1;
  options.queue = 2;
  Server server(options);
  std::mutex mutex;
  std::condition_variable changed;
  bool release = false;
  int running = 0;
  server.Handle("/validate/gpudevices", [&](const json& review, const RequestContext& context) {
    std::unique_lock lock(mutex);
    ++running;
    changed.notify_all();
    changed.wait(lock, [&] { return release; });
    return Echo(review, context);
  });
  server.Start();
  std::vector<std::future<httplib::Result>> held;
  for (int i = 0; i < 3; ++i) {
    held.push_back(std::async(std::launch::async, [&] {
      return Post(server.port(), "/validate/gpudevices", R"({"request":{"uid":"h"}})");
    }));
    if (i == 0) {
      std::unique_lock lock(mutex);
      ASSERT_TRUE(changed.wait_for(lock, std::chrono::seconds(10), [&] { return running == 1; }));
    }
  }
  const auto queued = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (server.stats().http.queued < 2 && std::chrono::steady_clock::now() < queued) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(server.Saturated());
  auto refused = Post(server.port(), "/validate/gpudevices", R"({"request":{"uid":"x"}})");
  ASSERT_TRUE(refused) << httplib::to_string(refused.error());
  EXPECT_EQ(refused->status, 503);
  EXPECT_EQ(server.stats().http.busy, 1);
  {
    std::lock_guard lock(mutex);
    release = true;
  }
  changed.notify_all();
  for (auto& request : held) {
    auto answer = request.get();
    ASSERT_TRUE(answer);
    EXPECT_EQ(answer->status, 200);
  }
  // A review was refused a moment ago: readiness keeps saying so for a few seconds (the
  // HTTP server's own test sees it clear).
  EXPECT_TRUE(server.Saturated());
}

// docs/security.md, "Hardening done": the API server's timeout runs from when it sent the review,
// so the deadline counts from accept: a review that took a second to arrive has a second less.
TEST_F(WebhookServerTest, TheDeadlineCountsFromAcceptNotFromWhenTheHandlerStarts) {
  ServerOptions options = Options();
  Server server(options);
  std::chrono::milliseconds left{};
  server.Handle("/validate/gpudevices", [&](const json& review, const RequestContext& context) {
    left = std::chrono::duration_cast<std::chrono::milliseconds>(context.deadline -
                                                                 std::chrono::steady_clock::now());
    return Echo(review, context);
  });
  server.Start();
  const std::string body = R"({"request":{"uid":"late"}})";
  httplib::SSLClient client("127.0.0.1", server.port());
  client.set_ca_cert_path((dir_.path() / "ca.crt").c_str());
  client.enable_server_certificate_verification(true);
  // The body comes in two parts a second apart.
  auto answer = client.Post(
      "/validate/gpudevices?timeout=5s", body.size(),
      [&](size_t offset, size_t, httplib::DataSink& sink) {
        if (offset == 0) {
          sink.write(body.data(), 5);
          std::this_thread::sleep_for(std::chrono::seconds(1));
        } else {
          sink.write(body.data() + offset, body.size() - offset);
        }
        return true;
      },
      "application/json");
  ASSERT_TRUE(answer) << httplib::to_string(answer.error());
  EXPECT_EQ(answer->status, 200);
  // 5 s less a tenth for the way back, less the second the body took.
  EXPECT_LE(left, std::chrono::milliseconds(3500));
  EXPECT_GT(left, std::chrono::milliseconds(2500));
}

// One address parser for every listener: IPv6 literals in brackets, the any-address included.
TEST_F(WebhookServerTest, ListensOnTheIpv6AnyAddressAndRefusesAMalformedOneSayingWhy) {
  ServerOptions options;
  options.address = "[::]:0";
  options.certDir = certDir_;
  Server server(options);
  server.Handle("/validate/gpudevices", Echo);
  ASSERT_NO_THROW(server.Start());
  auto answer = Post(server.port(), "/validate/gpudevices", R"({"request":{"uid":"v6"}})");
  ASSERT_TRUE(answer) << httplib::to_string(answer.error());
  EXPECT_EQ(answer->status, 200);
  options.address = "::1:9443";
  Server ambiguous(options);
  try {
    ambiguous.Start();
    ADD_FAILURE() << "an unbracketed IPv6 address was taken";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find("::1:9443"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace cozy::controller::webhook
