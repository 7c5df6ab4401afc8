// The client over real TLS, as the agent meets the API server in a pod and on a bare-metal
// host: server verification against a CA (file or data), client certificates (files or data),
// insecure-skip-tls-verify, and the failures when any of them is wrong. Certificates are made
// by the openssl CLI for each run; the server is cpp-httplib's SSLServer on 127.0.0.1.
#include <gtest/gtest.h>
#include <httplib.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "kube/client.h"
#include "kube/config.h"
#include "kube/errors.h"
#include "test/support/fixture_host.h"

namespace cozy::kube {
namespace {

using cozy::testing::RunCommand;
using cozy::testing::ShellQuote;

std::string Slurp(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A CA, a server certificate for 127.0.0.1 and a client certificate, both signed by it,
    // and a second CA that signed nothing here; made once for every test here (MakeOnce).
    const std::string script =
        "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 1 "
        "-subj /CN=test-ca"
        " && openssl req -x509 -newkey rsa:2048 -nodes -keyout other-ca.key -out other-ca.crt "
        "-days 1 -subj /CN=other-ca"
        " && openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr "
        "-subj /CN=127.0.0.1"
        " && printf 'subjectAltName=IP:127.0.0.1\\n' > san.ext"
        " && openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial "
        "-out server.crt -days 1 -extfile san.ext"
        " && openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr "
        "-subj /CN=system:node:n1/O=system:nodes"
        " && openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial "
        "-out client.crt -days 1";
    const auto made = cozy::testing::MakeOnce(script, dir_.path());
    ASSERT_EQ(made.exitCode, 0) << made.err;
    const auto path = [this](const char* name) { return (dir_.path() / name).string(); };
    server_ =
        std::make_unique<httplib::SSLServer>(path("server.crt").c_str(), path("server.key").c_str(),
                                             path("ca.crt").c_str());  // client certs
    server_->Get("/api", [](const httplib::Request&, httplib::Response& response) {
      response.set_content(R"({"kind":"APIVersions","versions":["v1"]})", "application/json");
    });
    port_ = server_->bind_to_any_port("127.0.0.1");
    ASSERT_GT(port_, 0);
    thread_ = std::thread([this] { server_->listen_after_bind(); });
  }
  void TearDown() override {
    server_->stop();
    thread_.join();
  }

  ClientConfig Config() const {
    ClientConfig config;
    config.server = "https://127.0.0.1:" + std::to_string(port_);
    config.caFile = (dir_.path() / "ca.crt").string();
    config.clientCertFile = (dir_.path() / "client.crt").string();
    config.clientKeyFile = (dir_.path() / "client.key").string();
    return config;
  }
  static ClientOptions NoRetries() {
    ClientOptions options;
    options.maxRetries = 0;
    return options;
  }

  cozy::testing::TempDir dir_;
  std::unique_ptr<httplib::SSLServer> server_;
  std::thread thread_;
  int port_ = 0;
};

TEST_F(TlsTest, VerifiesTheServerAndPresentsAClientCertificateFromFiles) {
  Client client(Config(), NoRetries());
  EXPECT_EQ(client.Get("/api")["kind"], "APIVersions");
}

TEST_F(TlsTest, CertificatesAsInlineDataWork) {
  ClientConfig config = Config();
  config.caData = Slurp(config.caFile);
  config.clientCertData = Slurp(config.clientCertFile);
  config.clientKeyData = Slurp(config.clientKeyFile);
  config.caFile.clear();
  config.clientCertFile.clear();
  config.clientKeyFile.clear();
  Client client(config, NoRetries());
  EXPECT_EQ(client.Get("/api")["kind"], "APIVersions");
}

TEST_F(TlsTest, KubeconfigWithBase64DataReachesTheServer) {
  const auto base64 = [this](const char* name) {
    return RunCommand("base64 -w0 " + ShellQuote((dir_.path() / name).string())).out;
  };
  const auto file = dir_.path() / "kubeconfig";
  std::ofstream(file) << "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
                      << "clusters:\n- name: k\n  cluster:\n    server: https://127.0.0.1:" << port_
                      << "\n    certificate-authority-data: " << base64("ca.crt")
                      << "\nusers:\n- name: u\n  user:\n    client-certificate-data: "
                      << base64("client.crt") << "\n    client-key-data: " << base64("client.key")
                      << "\ncontexts:\n- name: c\n  context: {cluster: k, user: u}\n";
  Client client(LoadKubeconfig(file), NoRetries());
  EXPECT_EQ(client.Get("/api")["kind"], "APIVersions");
}

TEST_F(TlsTest, AServerSignedByAnotherCaIsRefused) {
  ClientConfig config = Config();
  config.caFile = (dir_.path() / "other-ca.crt").string();
  Client client(config, NoRetries());
  try {
    client.Get("/api");
    FAIL() << "an unverified server was accepted";
  } catch (const ApiError& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kTransport) << error.what();
  }
}

TEST_F(TlsTest, InsecureSkipTlsVerifyAcceptsAnUnverifiedServer) {
  ClientConfig config = Config();
  config.caFile = (dir_.path() / "other-ca.crt").string();
  config.insecureSkipTlsVerify = true;
  Client client(config, NoRetries());
  EXPECT_EQ(client.Get("/api")["kind"], "APIVersions");
}

TEST_F(TlsTest, WithoutTheClientCertificateTheHandshakeFails) {
  ClientConfig config = Config();
  config.clientCertFile.clear();
  config.clientKeyFile.clear();
  Client client(config, NoRetries());
  EXPECT_THROW(client.Get("/api"), ApiError);
}

}  // namespace
}  // namespace cozy::kube
