// `scan -o json` prints the GPUNode as it writes it, with no document in between.
// What it prints must be what the daemon publishes, byte for byte as dump(2) prints the document:
// on every fixture host, with and without units, stale or not, and with strings that need
// escaping; and the printer on its own prints any document as dump(2) does.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "agent/status/json_sinks.h"
#include "agent/status/status_builder.h"
#include "sysfs/scanner.h"
#include "test/support/fixture_host.h"

namespace cozy::agent {
namespace {

using nlohmann::json;

std::string Dumped(const json& document) { return document.dump(2) + "\n"; }

std::string Printed(const std::string& node, const sysfs::HostScan& scan, const UnitReport* units,
                    const StaleUnits* stale) {
  return RenderGpuNodeJson(node, scan, units, stale);
}

std::string Built(const std::string& node, const sysfs::HostScan& scan, const UnitReport* units,
                  const StaleUnits* stale) {
  return Dumped(BuildGpuNode(node, BuildStatus(scan, units, stale)));
}

// Units for every GPU of `scan`, with every field the status carries: resources (none, one,
// two), each health, unplaced resources and resource names.
UnitReport SomeUnits(const sysfs::HostScan& scan, std::mt19937& random) {
  UnitReport report;
  const Health healths[] = {Health::kHealthy, Health::kUnhealthy, Health::kUnadvertised};
  for (const sysfs::PciFunction* gpu : scan.Gpus()) {
    FunctionUnits units;
    units.address = gpu->address;
    const int resources = static_cast<int>(random() % 3);
    for (int i = 0; i < resources; ++i) {
      ResourceUnits resource;
      resource.name = "nvidia.com/resource-" + std::to_string(i);
      resource.allocatable = static_cast<int64_t>(random() % 8);
      resource.allocated = static_cast<int64_t>(random() % 8);
      units.allocatable += resource.allocatable;
      units.allocated += resource.allocated;
      units.resources.push_back(resource);
    }
    units.health = healths[random() % 3];
    report.functions.push_back(units);
  }
  report.resourceNames = {"nvidia.com/resource-0", "nvidia.com/resource-1"};
  report.unplaced = {{"amd.com/gpu", 2, 1}, {"nvidia.com/resource-9", 0, 0}};
  return report;
}

std::vector<std::string> FixtureSpecs() {
  std::vector<std::string> names;
  for (const auto& entry :
       std::filesystem::directory_iterator(cozy::testing::SourceDir() / "fixtures/sysfs/specs")) {
    if (entry.path().extension() == ".json") {
      names.push_back(entry.path().stem().string());
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

TEST(StatusWriter, PrintsWhatTheDocumentDumpsOnEveryFixtureHost) {
  std::mt19937 random(262);
  const std::vector<std::string> specs = FixtureSpecs();
  ASSERT_GT(specs.size(), 10U);
  const StaleUnits stale{"2026-12-03T07:00:00Z", "unavailable"};
  for (const std::string& spec : specs) {
    SCOPED_TRACE(spec);
    const cozy::testing::FixtureHost host(spec);
    const sysfs::HostScan scan = host.Scan();
    const UnitReport units = SomeUnits(scan, random);
    EXPECT_EQ(Printed("node-1", scan, nullptr, nullptr), Built("node-1", scan, nullptr, nullptr));
    EXPECT_EQ(Printed("node-1", scan, &units, nullptr), Built("node-1", scan, &units, nullptr));
    EXPECT_EQ(Printed("node-1", scan, &units, &stale), Built("node-1", scan, &units, &stale));
  }
}

// `scan -o json` prints in pieces through one buffer: the pieces are the document, each at most
// a piece and the object that closed past it, and a large host takes several.
TEST(StatusWriter, PrintedInPiecesIsTheSameText) {
  const cozy::testing::FixtureHost host("large-synthetic");
  const sysfs::HostScan scan = host.Scan();
  std::mt19937 random(263);
  const UnitReport units = SomeUnits(scan, random);
  std::vector<std::string> pieces;
  PrintGpuNodeJson([&](std::string_view piece) { pieces.emplace_back(piece); }, "node-1", scan,
                   &units, nullptr);
  std::string joined;
  for (const std::string& piece : pieces) {
    EXPECT_LT(piece.size(), 64U * 1024 + 8 * 1024);
    joined += piece;
  }
  EXPECT_GT(pieces.size(), 3U);
  EXPECT_EQ(joined, Built("node-1", scan, &units, nullptr));
  // A throw midway (a name that is not UTF-8) leaves what was drained, and no more.
  sysfs::HostScan bad = scan;
  for (auto it = bad.functions.rbegin(); it != bad.functions.rend(); ++it) {
    if (it->isGpu) {
      it->deviceName = "\xff";  // the last GPU: most of the document is out before it
      break;
    }
  }
  pieces.clear();
  EXPECT_ANY_THROW(PrintGpuNodeJson([&](std::string_view piece) { pieces.emplace_back(piece); },
                                    "node-1", bad, nullptr, nullptr));
  EXPECT_FALSE(pieces.empty());
}

// Names and paths are the host's: quotes, backslashes, control characters and UTF-8 are
// escaped as dump() escapes them; a byte that is not UTF-8 fails as dump() fails.
TEST(StatusWriter, EscapesAsTheDocumentDoes) {
  sysfs::HostScan scan;
  sysfs::PciFunction gpu;
  gpu.address = *sysfs::ParsePciAddress("0000:3b:00.0");
  gpu.vendorId = 0x10de;
  gpu.deviceId = 0x2330;
  gpu.classCode = 0x030200;
  gpu.isGpu = true;
  gpu.vendorName = "Quote \" backslash \\ tab \t newline \n bell \a del \x7f end";
  gpu.deviceName = "H100 \xc3\xa9\xe2\x82\xac \xf0\x9f\x98\x80 and \x01\x1f";
  gpu.driver = "vfio-pci";
  gpu.mdevTypes.push_back({"nvidia-1", "", std::nullopt, std::nullopt, "vfio-pci"});
  gpu.mdevs.push_back({"c0ffee00-0000-4000-8000-000000000001", std::nullopt, std::nullopt, {}});
  gpu.vgpu = sysfs::NvidiaVgpu{std::nullopt, {}};
  gpu.sriov = sysfs::SriovInfo{0, 0};
  scan.functions.push_back(gpu);
  EXPECT_EQ(Printed("n \"1\"", scan, nullptr, nullptr), Built("n \"1\"", scan, nullptr, nullptr));

  scan.functions[0].deviceName = "not UTF-8: \xff\xfe";
  EXPECT_THROW(Built("n", scan, nullptr, nullptr), json::type_error);
  EXPECT_THROW(Printed("n", scan, nullptr, nullptr), json::type_error);
}

// Feeds a document to the printer in the document's own key order.
void Feed(JsonPrinter& out, const json& value) {
  switch (value.type()) {
    case json::value_t::object:
      out.BeginObject();
      for (const auto& [key, item] : value.items()) {
        out.Key(key);
        Feed(out, item);
      }
      out.EndObject();
      break;
    case json::value_t::array:
      out.BeginArray();
      for (const json& item : value) {
        Feed(out, item);
      }
      out.EndArray();
      break;
    case json::value_t::string:
      out.String(value.get_ref<const std::string&>());
      break;
    case json::value_t::boolean:
      out.Bool(value.get<bool>());
      break;
    case json::value_t::number_unsigned:
      out.Number(value.get<uint64_t>());
      break;
    default:
      out.Number(value.get<int64_t>());
      break;
  }
}

json RandomValue(std::mt19937& random, int depth) {
  const std::string keys[] = {"a", "b", "ab", "B", "z", "_", "0", "key with space"};
  // A document is an object or an array; deep down, scalars only.
  switch (depth == 0 ? 4 + random() % 2 : random() % (depth > 3 ? 4 : 6)) {
    case 0: {
      std::string text;
      for (auto i = random() % 12; i > 0; --i) {
        text += static_cast<char>(1 + random() % 127);  // every ASCII character but NUL
      }
      return text;
    }
    case 1:
      return static_cast<int64_t>(random()) - static_cast<int64_t>(random());
    case 2:
      return static_cast<uint64_t>(random()) << 32 | random();
    case 3:
      return random() % 2 == 0;
    case 4: {
      json object = json::object();
      for (auto i = random() % 4; i > 0; --i) {
        object[keys[random() % 8]] = RandomValue(random, depth + 1);
      }
      return object;
    }
    default: {
      json array = json::array();
      for (auto i = random() % 4; i > 0; --i) {
        array.push_back(RandomValue(random, depth + 1));
      }
      return array;
    }
  }
}

TEST(JsonPrinter, PrintsAnyDocumentAsDumpDoes) {
  std::mt19937 random(26);
  for (int i = 0; i < 2000; ++i) {
    const json document = RandomValue(random, 0);
    std::string text;
    JsonPrinter out(text);
    Feed(out, document);
    ASSERT_EQ(text, document.dump(2)) << "document " << i;
  }
}

// A key out of the document's order would print differently from the document: refused.
TEST(JsonPrinter, RefusesAKeyOutOfOrder) {
  std::string text;
  JsonPrinter out(text);
  out.BeginObject();
  out.Key("vendor");
  out.String("x");
  EXPECT_THROW(out.Key("model"), std::logic_error);
  EXPECT_THROW(out.Key("vendor"), std::logic_error);  // nor twice
  std::string other;
  JsonPrinter fresh(other);
  fresh.BeginObject();
  fresh.Key("b");
  fresh.BeginObject();
  EXPECT_NO_THROW(fresh.Key("a"));  // each object has its own order
}

}  // namespace
}  // namespace cozy::agent
