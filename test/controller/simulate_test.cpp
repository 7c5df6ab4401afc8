// `gpu-controller simulate` run as a program on controller/testdata/cluster.json, and on
// malformed copies of it: the output a hoster reads, and the exit code 2 with one line naming
// the object and the field that are wrong.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

namespace cozy::controller {
namespace {

using nlohmann::json;

struct RunResult {
  int exitCode = -1;
  std::string out;
  std::string err;
};

std::string ReadFile(const std::string& path) {
  std::ifstream file(path);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

// ctest runs each case as its own process, two at a time: scratch files carry the process id,
// or one case reads the other's stderr.
std::string ScratchPath(const std::string& name) {
  return testing::TempDir() + "cozy-simulate-" + std::to_string(::getpid()) + "-" + name;
}

RunResult RunController(const std::string& arguments) {
  const std::string errPath = ScratchPath("stderr.txt");
  const std::string command = std::string(GPU_CONTROLLER) + " " + arguments + " 2>" + errPath;
  RunResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    ADD_FAILURE() << "cannot run " << command;
    return result;
  }
  std::array<char, 4096> buffer{};
  size_t read = 0;
  while ((read = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) {
    result.out.append(buffer.data(), read);
  }
  const int status = pclose(pipe);
  result.exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.err = ReadFile(errPath);
  return result;
}

const std::string kSnapshot = std::string(COZY_SOURCE_DIR) + "/controller/testdata/cluster.json";

TEST(Simulate, JsonViewOfTheSampleCluster) {
  const RunResult result = RunController("simulate --snapshot " + kSnapshot + " -o json");
  ASSERT_EQ(result.exitCode, 0) << result.err;
  EXPECT_EQ(result.err, "");
  const json view = json::parse(result.out);

  // C16: the hoster's list, GPUNode names, NVIDIA and mediated table entries; not the ConnectX VF.
  EXPECT_EQ(view["resourceNames"],
            json({"amd.com/gpu", "nvidia.com/GA100_A100_PCIE_80GB", "nvidia.com/NVIDIA_A2-4Q"}));

  // gpu-1: 4 units, train (2, bound, covers its launcher) + cuda-job (1, raw) used. gpu-2 is
  // cordoned, so its free unit is not the class's. B9: a2-4q is vgpu without maxCount: 1.
  EXPECT_EQ(view["classes"]["a100"],
            json({{"source", "devicePlugin nvidia.com/GA100_A100_PCIE_80GB"},
                  {"maxCount", 4},
                  {"units", 6},
                  {"free", 1}}));
  EXPECT_EQ(view["classes"]["a2-4q"], json({{"source", "devicePlugin nvidia.com/NVIDIA_A2-4Q"},
                                            {"maxCount", 1},
                                            {"units", 4},
                                            {"free", 4}}));
  // C19: gpu-4's two A100s no device plugin advertises, from its ResourceSlice; no resource name.
  EXPECT_EQ(view["classes"]["a100-dra"],
            json({{"source", "dra 10DE:20B5"}, {"maxCount", nullptr}, {"units", 2}, {"free", 2}}));
  EXPECT_EQ(view["nodes"]["gpu-4"]["classes"]["a100-dra"],
            json({{"units", 2}, {"used", 0}, {"free", 2}}));
  EXPECT_EQ(view["nodes"]["gpu-1"]["classes"]["a100"],
            json({{"units", 4}, {"used", 3}, {"free", 1}}));
  EXPECT_EQ(view["nodes"]["gpu-2"]["eligible"], false);
  EXPECT_EQ(view["nodes"]["gpu-2"]["reasons"], json({"cordoned"}));
  EXPECT_EQ(view["nodes"]["gpu-3"]["classes"]["a2-4q"],
            json({{"units", 4}, {"used", 0}, {"free", 4}}));
  EXPECT_FALSE(view["nodes"].contains("cpu-1")) << "no GPUNode, no GPU view";

  // C3: the root's class budget (6) caps the subtree, which holds 4 of a100.
  EXPECT_EQ(view["tenants"]["tenant-a"]["a100"], json({{"used", 4},
                                                       {"remaining", 2},
                                                       {"limitedBy", "tenant-root"},
                                                       {"key", "requests.gpu.cozystack.io/a100"}}));
  // C4: tenant-a-b's raw key without a GPU key blocks a100 there.
  EXPECT_EQ(view["tenants"]["tenant-a-b"]["a100"]["remaining"], 0);
  EXPECT_EQ(view["tenants"]["tenant-a-b"]["a100"]["limitedBy"], "tenant-a-b");

  std::map<std::string, std::pair<std::string, json>> decisions;
  for (const json& decision : view["decisions"]) {
    decisions[decision["device"]] = {decision["action"], decision["node"]};
    EXPECT_FALSE(decision["reason"].get<std::string>().empty());
  }
  const std::map<std::string, std::pair<std::string, json>> expected = {
      {"tenant-a/spare", {"move", "gpu-1"}},  // D10: cordoned, room elsewhere
      {"tenant-a/train", {"keep", "gpu-1"}},
      {"tenant-a-b/desk", {"bind", "gpu-3"}},       // D5: the Lost set first
      {"tenant-a/new-a2", {"bind", "gpu-3"}},       // D6
      {"tenant-a/too-many", {"refuse", nullptr}},   // B9: vgpu allows 1
      {"tenant-a-b/blocked", {"refuse", nullptr}},  // C4
  };
  EXPECT_EQ(decisions, expected);
}

TEST(Simulate, TableIsForPeople) {
  const RunResult result = RunController("simulate --snapshot " + kSnapshot + " -o table");
  ASSERT_EQ(result.exitCode, 0) << result.err;
  for (const char* text : {"CLASS", "a100      4         6      1     devicePlugin",
                           "a100-dra  -         2      2     dra 10DE:20B5", "gpu-2  no",
                           "cordoned", "tenant-a/spare      move    gpu-1  node gpu-2 is cordoned",
                           "a raw key without a GPU key"}) {
    EXPECT_NE(result.out.find(text), std::string::npos) << text << "\n" << result.out;
  }
}

// --device: one order's explanation, the one `kubectl gpu why` prints on a live cluster.
TEST(Simulate, DeviceExplainsOneOrder) {
  const RunResult table =
      RunController("simulate --snapshot " + kSnapshot + " --device tenant-a/spare -o table");
  ASSERT_EQ(table.exitCode, 0) << table.err;
  for (const char* text :
       {"DEVICE:    tenant-a/spare (1 x a100, Bound on gpu-2)",
        "DECISION:  move on gpu-1: node gpu-2 is cordoned",
        "limited by tenant-root (requests.gpu.cozystack.io/a100)", "gpu-2  no", "cordoned"}) {
    EXPECT_NE(table.out.find(text), std::string::npos) << text << "\n" << table.out;
  }
  const RunResult result =
      RunController("simulate --snapshot " + kSnapshot + " --device tenant-a/spare");
  ASSERT_EQ(result.exitCode, 0) << result.err;
  const json explanation = json::parse(result.out);
  EXPECT_EQ(explanation["decision"],
            (json{{"action", "move"}, {"node", "gpu-1"}, {"reason", "node gpu-2 is cordoned"}}));
  EXPECT_EQ(explanation["boundNode"], "gpu-2");
  EXPECT_EQ(explanation["budget"]["limitedBy"], "tenant-root");
  for (const std::string device : {"tenant-a/nope", "spare"}) {
    const RunResult missing =
        RunController("simulate --snapshot " + kSnapshot + " --device " + device);
    EXPECT_EQ(missing.exitCode, 2) << device;
    EXPECT_NE(missing.err.find("no GPUDevice " + device), std::string::npos) << missing.err;
  }
}

struct MalformedCase {
  const char* what;
  std::function<void(json&)> mutate;
  std::vector<std::string> mentions;  // what the one line on stderr must name
};

json& Item(json& list, const std::string& kind, const std::string& name) {
  for (json& item : list["items"]) {
    if (item["kind"] == kind && item["metadata"]["name"] == name) {
      return item;
    }
  }
  throw std::runtime_error("no " + kind + " " + name + " in the sample");
}

TEST(Simulate, MalformedInputIsExitCode2NamingObjectAndField) {
  const std::vector<MalformedCase> cases = {
      {"GPUClass maxCount type",
       [](json& l) { Item(l, "GPUClass", "a100")["spec"]["maxCount"] = "4"; },
       {"GPUClass a100", "spec.maxCount", "expected an integer"}},
      {"GPUDevice count 0",
       [](json& l) { Item(l, "GPUDevice", "spare")["spec"]["count"] = 0; },
       {"GPUDevice tenant-a/spare", "spec.count"}},
      {"GPUDevice phase",
       [](json& l) { Item(l, "GPUDevice", "spare")["status"]["phase"] = "Up"; },
       {"GPUDevice tenant-a/spare", "status.phase", "Pending, Bound, Lost"}},
      {"node taint without effect",
       [](json& l) { Item(l, "Node", "gpu-2")["spec"]["taints"][0].erase("effect"); },
       {"Node gpu-2", "spec.taints[0].effect", "missing"}},
      {"GPUNode allocatable type",
       [](json& l) {
         Item(l, "GPUNode", "gpu-1")["status"]["devices"][0]["resources"][0]["allocatable"] = "1";
       },
       {"GPUNode gpu-1", "status.devices[0].resources[0].allocatable"}},
      {"item without kind", [](json& l) { l["items"][0].erase("kind"); }, {"items[0]", "kind"}},
      {"not a List", [](json& l) { l["kind"] = "Pod"; }, {"List"}},
  };
  for (const MalformedCase& c : cases) {
    json list = json::parse(ReadFile(kSnapshot));
    c.mutate(list);
    const std::string path = ScratchPath("malformed.json");
    std::ofstream(path) << list.dump();
    const RunResult result = RunController("simulate --snapshot " + path);
    EXPECT_EQ(result.exitCode, 2) << c.what;
    EXPECT_EQ(result.out, "") << c.what;
    ASSERT_FALSE(result.err.empty()) << c.what;
    EXPECT_EQ(result.err.find('\n'), result.err.size() - 1) << c.what << ": one line\n"
                                                            << result.err;
    for (const std::string& mention : c.mentions) {
      EXPECT_NE(result.err.find(mention), std::string::npos)
          << c.what << ": stderr does not name " << mention << ":\n"
          << result.err;
    }
  }
}

// C2, C18: a quantity the model cannot read, or one past what any cluster holds, is no malformed
// snapshot: the simulation runs, with each such input named in a warning on stderr, and the
// budget that does not read refuses its own subtree's orders (C2).
TEST(Simulate, C2_C18_QuantitiesOutOfRangeAreWarningsNamingObjectAndField) {
  json list = json::parse(ReadFile(kSnapshot));
  Item(list, "ResourceQuota", "gpu-budget")["spec"]["hard"]["requests.gpu.cozystack.io/a100"] =
      "six";
  Item(list, "Pod", "cuda-job")["spec"]["containers"][0]["resources"]["requests"]
                               ["nvidia.com/GA100_A100_PCIE_80GB"] = "10E";
  const std::string path = ScratchPath("out-of-range.json");
  std::ofstream(path) << list.dump();
  const RunResult result = RunController("simulate --snapshot " + path + " -o json");
  ASSERT_EQ(result.exitCode, 0) << result.err;
  for (const std::string mention :
       {"warning: ResourceQuota tenant-root/gpu-budget: "
        "spec.hard[\"requests.gpu.cozystack.io/a100\"]: \"six\" is not a quantity",
        "warning: Pod tenant-a/cuda-job: spec.containers[0].resources.requests"}) {
    EXPECT_NE(result.err.find(mention), std::string::npos) << result.err;
  }
  const json out = json::parse(result.out);
  bool refusedNamingTheQuota = false;
  for (const json& decision : out.at("decisions")) {
    if (decision.value("action", "") == "refuse" &&
        decision.value("reason", "").find("ResourceQuota tenant-root/gpu-budget") !=
            std::string::npos) {
      refusedNamingTheQuota = true;
    }
  }
  EXPECT_TRUE(refusedNamingTheQuota) << out.dump(2);
}

TEST(Simulate, UnreadableFileAndBadFlagsAreExitCode2) {
  EXPECT_EQ(RunController("simulate --snapshot /nonexistent/cluster.json").exitCode, 2);
  const std::string notJson = ScratchPath("not-json.json");
  std::ofstream(notJson) << "{";
  const RunResult result = RunController("simulate --snapshot " + notJson);
  EXPECT_EQ(result.exitCode, 2);
  EXPECT_NE(result.err.find("not JSON"), std::string::npos) << result.err;
  EXPECT_EQ(RunController("simulate --snapshot " + kSnapshot + " -o yaml").exitCode, 2);
  EXPECT_EQ(RunController("simulate").exitCode, 2);
}

}  // namespace
}  // namespace cozy::controller
