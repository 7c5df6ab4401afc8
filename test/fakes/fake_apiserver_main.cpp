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
  const char* usage =
      "usage: fake_apiserver [--port N] [--crds DIR_OR_FILE]... [--kubeconfig-out FILE] "
      "[--token TOKEN] [--bookmark-interval-ms MS] [--request-delay-ms MS] [--fault JSON]...\n";
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
    } else {
      std::cerr << usage;
      return 2;
    }
  }
  try {
    cozy::fake::FakeApiServer server(options);
    for (const auto& fault : faults) server.AddFault(fault);
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
