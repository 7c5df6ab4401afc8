// node_fit POD.json NODE.json: what test/support/node_fit.h says about that pod on that Node,
// for the real-node test that checks it against kube-scheduler's own decisions on the same
// objects (test/realcluster/launcher_placement_test.sh). Prints "fits", or the reason it does
// not; exit status 0 either way, 2 on unreadable input.
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "test/support/node_fit.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: node_fit POD.json NODE.json\n";
    return 2;
  }
  nlohmann::json pod;
  nlohmann::json node;
  try {
    std::ifstream(argv[1]) >> pod;
    std::ifstream(argv[2]) >> node;
  } catch (const std::exception& error) {
    std::cerr << "node_fit: " << error.what() << "\n";
    return 2;
  }
  const std::string why = cozy::testing::WhyNotOn(pod, node);
  std::cout << (why.empty() ? "fits" : why) << "\n";
  return 0;
}
