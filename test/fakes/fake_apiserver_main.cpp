// fake_apiserver: the fake Kubernetes API server as a program, for out-of-process tests,
// kubectl and the demo. Prints "listening on http://127.0.0.1:PORT" once it serves.
#include <csignal>
#include <fstream>
#include <iostream>
#include <string>

#include "test/fakes/fake_apiserver.h"

namespace {
volatile std::sig_atomic_t stopRequested = 0;
void OnSignal(int) { stopRequested = 1; }
}  // namespace

int main(int argc, char** argv) {
  cozy::fake::FakeApiServerOptions options;
  std::string kubeconfigOut;
  std::string token;
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
      options.port = std::stoi(value());
    } else if (arg == "--crds") {
      options.crdPaths.emplace_back(value());
    } else if (arg == "--kubeconfig-out") {
      kubeconfigOut = value();
    } else if (arg == "--token") {
      token = value();
    } else if (arg == "--bookmark-interval-ms") {
      options.bookmarkInterval = std::chrono::milliseconds(std::stoi(value()));
    } else {
      std::cerr << "usage: fake_apiserver [--port N] [--crds DIR_OR_FILE]... "
                   "[--kubeconfig-out FILE] [--token TOKEN] [--bookmark-interval-ms MS]\n";
      return 2;
    }
  }
  try {
    cozy::fake::FakeApiServer server(options);
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
