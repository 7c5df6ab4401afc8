// fake_apiserver: the fake Kubernetes API server as a program, for out-of-process tests,
// kubectl and the demo. Prints "listening on http://127.0.0.1:PORT" once it serves. Faults
// can be set from the start (--fault, --request-delay-ms) or later through /_fake/.
#include <csignal>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "test/fakes/fake_apiserver.h"

namespace {
volatile std::sig_atomic_t stopRequested = 0;
void OnSignal(int) { stopRequested = 1; }
}  // namespace

int main(int argc, char** argv) {
  cozy::fake::FakeApiServerOptions options;
  std::string kubeconfigOut;
  std::string token;
  std::vector<cozy::fake::Fault> faults;
  bool virtApiMutator = false;
  struct Endpoint {
    std::string ns, name, host;
    int port;
  };
  std::vector<Endpoint> endpoints;
  std::vector<std::pair<std::string, cozy::fake::UserInfo>> users;
  const char* usage =
      "usage: fake_apiserver [--port N] [--crds DIR_OR_FILE]... [--kubeconfig-out FILE] "
      "[--token TOKEN] [--bookmark-interval-ms MS] [--request-delay-ms MS] [--fault JSON]... "
      "[--virt-api-mutator] [--service-endpoint NS/NAME=[HOST:]PORT]... "
      "[--user TOKEN=JSON]... [--webhook-client-cert FILE --webhook-client-key FILE]\n";
  auto number = [](const std::string& flag, const std::string& text) {
    try {
      size_t end = 0;
      int parsed = std::stoi(text, &end);
      if (end == text.size() && parsed >= 0) return parsed;
    } catch (const std::exception&) {
    }
    std::cerr << "fake_apiserver: " << flag << " needs a non-negative integer, not \"" << text
              << "\"\n";
    std::exit(2);
  };
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "fake_apiserver: " << arg << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--port") {
      options.port = number(arg, value());
    } else if (arg == "--crds") {
      options.crdPaths.emplace_back(value());
    } else if (arg == "--kubeconfig-out") {
      kubeconfigOut = value();
    } else if (arg == "--token") {
      token = value();
    } else if (arg == "--bookmark-interval-ms") {
      options.bookmarkInterval = std::chrono::milliseconds(number(arg, value()));
    } else if (arg == "--request-delay-ms") {
      options.requestDelay = std::chrono::milliseconds(number(arg, value()));
    } else if (arg == "--fault") {
      // The same JSON object as POST /_fake/faults takes.
      std::string text = value();
      try {
        faults.push_back(cozy::fake::Fault::FromJson(nlohmann::json::parse(text)));
      } catch (const std::exception& error) {
        std::cerr << "fake_apiserver: --fault " << text << ": " << error.what() << "\n";
        return 2;
      }
    } else if (arg == "--webhook-client-cert") {
      // The client certificate it presents to admission webhooks, as kube-apiserver does with
      // an admission kubeconfig (docs/install.md, "Who may call the webhooks").
      options.webhookClientCertificate = value();
    } else if (arg == "--webhook-client-key") {
      options.webhookClientKey = value();
    } else if (arg == "--virt-api-mutator") {
      virtApiMutator = true;
    } else if (arg == "--service-endpoint") {
      // NS/NAME=PORT or NS/NAME=HOST:PORT, as PUT /_fake/service-endpoints.
      std::string text = value();
      auto slash = text.find('/');
      auto equals = text.find('=');
      if (slash == std::string::npos || equals == std::string::npos || equals < slash) {
        std::cerr << "fake_apiserver: --service-endpoint takes NS/NAME=[HOST:]PORT, not \"" << text
                  << "\"\n";
        return 2;
      }
      std::string target = text.substr(equals + 1);
      std::string host = "127.0.0.1";
      if (auto colon = target.rfind(':'); colon != std::string::npos) {
        host = target.substr(0, colon);
        target = target.substr(colon + 1);
      }
      endpoints.push_back({text.substr(0, slash), text.substr(slash + 1, equals - slash - 1), host,
                           number(arg, target)});
    } else if (arg == "--user") {
      // TOKEN=JSON, the JSON of PUT /_fake/users' "user".
      std::string text = value();
      auto equals = text.find('=');
      try {
        if (equals == std::string::npos) throw std::invalid_argument("no '='");
        users.emplace_back(
            text.substr(0, equals),
            cozy::fake::UserInfo::FromJson(nlohmann::json::parse(text.substr(equals + 1))));
      } catch (const std::exception& error) {
        std::cerr << "fake_apiserver: --user " << text << ": " << error.what() << "\n";
        return 2;
      }
    } else {
      std::cerr << usage;
      return 2;
    }
  }
  try {
    cozy::fake::FakeApiServer server(options);
    for (const auto& fault : faults) server.AddFault(fault);
    server.EnableVirtApiMutator(virtApiMutator);
    for (const auto& endpoint : endpoints) {
      server.SetServiceEndpoint(endpoint.ns, endpoint.name, endpoint.port, endpoint.host);
    }
    for (const auto& [userToken, user] : users) server.SetUser(userToken, user);
    server.Start();
    if (!kubeconfigOut.empty()) std::ofstream(kubeconfigOut) << server.Kubeconfig(token);
    std::cout << "listening on " << server.url() << std::endl;
    std::signal(SIGTERM, OnSignal);
    std::signal(SIGINT, OnSignal);
    while (!stopRequested) pause();
    server.Stop();
  } catch (const std::exception& error) {
    std::cerr << "fake_apiserver: " << error.what() << "\n";
    return 1;
  }
  return 0;
}
