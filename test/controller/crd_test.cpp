// The GPUClass and GPUDevice CRDs (charts/gpu/templates/crds/): the structural facts the API server
// enforces for us, and agreement with api/validation.h on the same name tables.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <functional>
#include <regex>
#include <string>

#include "api/validation.h"
#include "test/controller/name_cases.h"

namespace cozy::api {
namespace {

YAML::Node LoadCrd(const std::string& file) {
  return YAML::LoadFile(std::string(COZY_SOURCE_DIR) + "/charts/gpu/templates/crds/" + file);
}

YAML::Node Version(const YAML::Node& crd) { return crd["spec"]["versions"][0]; }
YAML::Node Schema(const YAML::Node& crd) { return Version(crd)["schema"]["openAPIV3Schema"]; }

// Structural schema: every node states its type, except int-or-string and
// preserve-unknown-fields nodes (apiextensions structural rules).
void ExpectStructural(const YAML::Node& schema, const std::string& path) {
  const bool intOrString = schema["x-kubernetes-int-or-string"].IsDefined();
  if (!intOrString) {
    EXPECT_TRUE(schema["type"].IsDefined()) << path << " has no type";
  }
  if (const YAML::Node properties = schema["properties"]) {
    for (const auto& property : properties) {
      ExpectStructural(property.second, path + "." + property.first.as<std::string>());
    }
  }
  if (const YAML::Node items = schema["items"]) {
    ExpectStructural(items, path + "[]");
  }
  if (const YAML::Node additional = schema["additionalProperties"]) {
    ExpectStructural(additional, path + "{}");
  }
}

// The CEL rules these CRDs use are of four shapes; evaluate them on a string as the API server
// would, so the tables below exercise the CRD text itself.
bool EvaluateRule(const std::string& rule, const std::string& self) {
  static const std::regex matches(R"(^(!?)self\.matches\('(.*)'\)$)");
  static const std::regex startsWith(R"(^(!?)self\.startsWith\('(.*)'\)$)");
  static const std::regex notEquals(R"(^self != '(.*)'$)");
  std::smatch match;
  if (std::regex_match(rule, match, matches)) {
    // CEL string literal: "\\" is one backslash.
    const std::string pattern = std::regex_replace(match[2].str(), std::regex(R"(\\\\)"), "\\");
    return std::regex_search(self, std::regex(pattern)) != (match[1] == "!");
  }
  if (std::regex_match(rule, match, startsWith)) {
    return self.starts_with(match[2].str()) != (match[1] == "!");
  }
  if (std::regex_match(rule, match, notEquals)) {
    return self != match[1].str();
  }
  ADD_FAILURE() << "rule of an unknown shape: " << rule;
  return false;
}

// Splits "a && b" (the only connective used) into its terms.
bool EvaluateConjunction(const std::string& rule, const std::string& self) {
  bool result = true;
  size_t start = 0;
  while (start <= rule.size()) {
    size_t end = rule.find(" && ", start);
    std::string term =
        rule.substr(start, end == std::string::npos ? std::string::npos : end - start);
    term = std::regex_replace(term, std::regex(R"(^\s+|\s+$)"), "");
    // size(self) <= N
    std::smatch match;
    if (std::regex_match(term, match, std::regex(R"(^size\(self\) <= (\d+)$)"))) {
      result = result && self.size() <= std::stoul(match[1].str());
    } else {
      result = result && EvaluateRule(term, self);
    }
    if (end == std::string::npos) {
      break;
    }
    start = end + 4;
  }
  return result;
}

TEST(GpuClassCrd, Shape) {
  const YAML::Node crd = LoadCrd("gpu.cozystack.io_gpuclasses.yaml");
  EXPECT_EQ(crd["apiVersion"].as<std::string>(), "apiextensions.k8s.io/v1");
  EXPECT_EQ(crd["metadata"]["name"].as<std::string>(), "gpuclasses.gpu.cozystack.io");
  EXPECT_EQ(crd["spec"]["scope"].as<std::string>(), "Cluster");
  EXPECT_EQ(crd["spec"]["names"]["kind"].as<std::string>(), "GPUClass");
  EXPECT_EQ(Version(crd)["name"].as<std::string>(), "v1alpha1");
  EXPECT_TRUE(Version(crd)["subresources"]["status"].IsDefined());
  EXPECT_GE(Version(crd)["additionalPrinterColumns"].size(), 4U);
  ExpectStructural(Schema(crd), "GPUClass");
}

// H5: "The CRDs are kept on chart uninstall"
TEST(CrdsH5, KeptOnUninstall) {
  for (const char* file :
       {"gpu.cozystack.io_gpuclasses.yaml", "gpu.cozystack.io_gpudevices.yaml"}) {
    const YAML::Node crd = LoadCrd(file);
    EXPECT_EQ(crd["metadata"]["annotations"]["helm.sh/resource-policy"].as<std::string>(), "keep")
        << file;
  }
}

// B4 through the CRD's root rules on metadata.name.
TEST(GpuClassCrdB4, NameRulesAgreeWithValidator) {
  const YAML::Node rules =
      Schema(LoadCrd("gpu.cozystack.io_gpuclasses.yaml"))["x-kubernetes-validations"];
  ASSERT_TRUE(rules.IsSequence());
  for (const NameCase& c : ClassNameCases()) {
    bool accepted = true;
    for (const auto& rule : rules) {
      std::string text = rule["rule"].as<std::string>();
      text = std::regex_replace(text, std::regex(R"(self\.metadata\.name)"), "self");
      accepted = accepted && EvaluateConjunction(text, c.name);
    }
    EXPECT_EQ(accepted, c.valid) << "CRD on class name \"" << c.name << "\"";
    EXPECT_EQ(accepted, CheckClassName(c.name).empty()) << "CRD and validator disagree";
  }
}

// docs/security.md, "Hardening done": a GPUDevice's spec.className under the same rules as a
// GPUClass's name. The CRD took "total" while the model refused it, so one such order stopped the
// binder.
TEST(GpuDeviceCrd, ClassNameRulesAgreeWithValidator) {
  const YAML::Node field = Schema(
      LoadCrd("gpu.cozystack.io_gpudevices.yaml"))["properties"]["spec"]["properties"]["className"];
  const std::regex pattern(field["pattern"].as<std::string>());
  const size_t maxLength = field["maxLength"].as<size_t>();
  ASSERT_TRUE(field["x-kubernetes-validations"].IsSequence());
  for (const NameCase& c : ClassNameCases()) {
    bool accepted = c.name.size() <= maxLength && std::regex_search(c.name, pattern);
    for (const auto& rule : field["x-kubernetes-validations"]) {
      accepted = accepted && EvaluateConjunction(rule["rule"].as<std::string>(), c.name);
    }
    EXPECT_EQ(accepted, c.valid) << "CRD on spec.className \"" << c.name << "\"";
    EXPECT_EQ(accepted, CheckClassName(c.name).empty()) << "CRD and validator disagree";
  }
}

// B8 through the CRD's pattern and rules on resourceName.
TEST(GpuClassCrdB8, ResourceNameRulesAgreeWithValidator) {
  const YAML::Node field =
      Schema(LoadCrd("gpu.cozystack.io_gpuclasses.yaml"))["properties"]["spec"]["properties"]
                                                         ["source"]["properties"]["devicePlugin"]
                                                         ["properties"]["resourceName"];
  const std::regex pattern(field["pattern"].as<std::string>());
  const size_t maxLength = field["maxLength"].as<size_t>();
  for (const NameCase& c : ResourceNameCases()) {
    bool accepted = c.name.size() <= maxLength && std::regex_search(c.name, pattern);
    for (const auto& rule : field["x-kubernetes-validations"]) {
      accepted = accepted && EvaluateConjunction(rule["rule"].as<std::string>(), c.name);
    }
    EXPECT_EQ(accepted, c.valid) << "CRD on resource name \"" << c.name << "\"";
    EXPECT_EQ(accepted, CheckClassResourceName(c.name).empty()) << "CRD and validator disagree";
  }
}

// B11: a GPUNode's status.resourceNames holds extended resource names only, by the very rules a
// class's resourceName has (so the two never drift apart), and the validator the controller
// filters an older CRD's objects with agrees: node-2's agent setting [cpu, memory, ...] is
// refused at the API server.
TEST(GpuNodeCrdB11, ResourceNamesAreExtendedResourceNamesOnly) {
  const YAML::Node classField =
      Schema(LoadCrd("gpu.cozystack.io_gpuclasses.yaml"))["properties"]["spec"]["properties"]
                                                         ["source"]["properties"]["devicePlugin"]
                                                         ["properties"]["resourceName"];
  const YAML::Node list =
      Schema(LoadCrd("gpunodes.yaml"))["properties"]["status"]["properties"]["resourceNames"];
  ASSERT_TRUE(list["maxItems"].IsDefined()) << "CEL on items needs a bounded list";
  const YAML::Node field = list["items"];
  EXPECT_EQ(field["pattern"].as<std::string>(), classField["pattern"].as<std::string>());
  EXPECT_EQ(field["maxLength"].as<size_t>(), classField["maxLength"].as<size_t>());
  ASSERT_EQ(field["x-kubernetes-validations"].size(),
            classField["x-kubernetes-validations"].size());
  for (size_t i = 0; i < field["x-kubernetes-validations"].size(); ++i) {
    EXPECT_EQ(field["x-kubernetes-validations"][i]["rule"].as<std::string>(),
              classField["x-kubernetes-validations"][i]["rule"].as<std::string>());
  }
  std::vector<NameCase> cases = ResourceNameCases();
  for (const char* notGpu :
       {"memory", "hugepages-2Mi", "hugepages-1Gi", "ephemeral-storage", "pods", "storage",
        "requests.cpu", "attachable-volumes-csi-x", "kubernetes.io/batch-cpu"}) {
    cases.push_back({notGpu, false});
  }
  const std::regex pattern(field["pattern"].as<std::string>());
  for (const NameCase& c : cases) {
    bool accepted =
        c.name.size() <= field["maxLength"].as<size_t>() && std::regex_search(c.name, pattern);
    for (const auto& rule : field["x-kubernetes-validations"]) {
      accepted = accepted && EvaluateConjunction(rule["rule"].as<std::string>(), c.name);
    }
    EXPECT_EQ(accepted, c.valid) << "CRD on a GPUNode's resource name \"" << c.name << "\"";
    EXPECT_EQ(accepted, CheckGpuResourceName(c.name).empty()) << "CRD and validator disagree";
  }
}

TEST(GpuClassCrd, SpecFields) {
  const YAML::Node spec = Schema(LoadCrd("gpu.cozystack.io_gpuclasses.yaml"))["properties"]["spec"];
  const YAML::Node properties = spec["properties"];
  for (const char* field : {"vendor", "model", "mode", "profile", "memory", "maxCount", "source",
                            "nodeSelector", "onCordon"}) {
    EXPECT_TRUE(properties[field].IsDefined()) << field;
  }
  EXPECT_EQ(properties["mode"]["enum"].as<std::vector<std::string>>(),
            (std::vector<std::string>{"passthrough", "vgpu"}));
  // B9: maxCount carries no schema default; the model resolves it per mode.
  EXPECT_FALSE(properties["maxCount"]["default"].IsDefined());
  EXPECT_EQ(properties["maxCount"]["minimum"].as<int>(), 1);
  EXPECT_EQ(properties["onCordon"]["enum"].as<std::vector<std::string>>(),
            (std::vector<std::string>{"Move", "Stay"}));
  EXPECT_EQ(properties["onCordon"]["default"].as<std::string>(), "Move");
  EXPECT_TRUE(properties["memory"]["x-kubernetes-int-or-string"].as<bool>());
  const YAML::Node expressionOperator = properties["nodeSelector"]["properties"]["matchExpressions"]
                                                  ["items"]["properties"]["operator"];
  EXPECT_EQ(expressionOperator["enum"].size(), 4U);
}

// B5: "the source is a union with dra reserved for a later member": the member is served now
// (docs/dra.md), still exactly one, and dra only on a passthrough class.
TEST(GpuClassCrdB5, SourceIsAUnionOfDevicePluginAndDra) {
  const YAML::Node spec = Schema(LoadCrd("gpu.cozystack.io_gpuclasses.yaml"))["properties"]["spec"];
  const YAML::Node source = spec["properties"]["source"];
  EXPECT_EQ(source["maxProperties"].as<int>(), 1);
  EXPECT_EQ(source["minProperties"].as<int>(), 1);
  EXPECT_EQ(source["properties"]["devicePlugin"]["required"][0].as<std::string>(), "resourceName");
  const YAML::Node dra = source["properties"]["dra"];
  EXPECT_EQ(dra["required"][0].as<std::string>(), "pciVendorSelector");
  EXPECT_FALSE(dra["x-kubernetes-preserve-unknown-fields"].IsDefined());
  // The CRD's pattern and the decoder agree on every selector.
  const std::regex pattern(dra["properties"]["pciVendorSelector"]["pattern"].as<std::string>());
  for (const char* selector : {"10DE:20B5", "10de:20b5", "1002:74A1", "10DE20B5", "10DE:20B",
                               "10DE::20B", "GGGG:0000", " 10DE:20B5", "10DE:20B5 "}) {
    EXPECT_EQ(std::regex_search(selector, pattern), api::CheckPciVendorSelector(selector).empty())
        << selector;
  }
  std::vector<std::string> rules;
  for (const auto& rule : spec["x-kubernetes-validations"]) {
    rules.push_back(rule["rule"].as<std::string>());
  }
  EXPECT_NE(
      std::find(rules.begin(), rules.end(), "!has(self.source.dra) || self.mode == 'passthrough'"),
      rules.end());
}

TEST(GpuDeviceCrd, Shape) {
  const YAML::Node crd = LoadCrd("gpu.cozystack.io_gpudevices.yaml");
  EXPECT_EQ(crd["metadata"]["name"].as<std::string>(), "gpudevices.gpu.cozystack.io");
  EXPECT_EQ(crd["spec"]["scope"].as<std::string>(), "Namespaced");
  EXPECT_EQ(crd["spec"]["names"]["kind"].as<std::string>(), "GPUDevice");
  EXPECT_TRUE(Version(crd)["subresources"]["status"].IsDefined())
      << "B2: status is a subresource no tenant role writes";
  ExpectStructural(Schema(crd), "GPUDevice");
  std::vector<std::string> columns;
  for (const auto& column : Version(crd)["additionalPrinterColumns"]) {
    columns.push_back(column["jsonPath"].as<std::string>());
  }
  for (const char* path : {".spec.className", ".status.phase", ".status.nodeName"}) {
    EXPECT_NE(std::find(columns.begin(), columns.end(), path), columns.end()) << path;
  }
}

// B6: "a device's spec is immutable and orders at least one GPU"
TEST(GpuDeviceCrdB6, SpecImmutableCountAtLeastOne) {
  const YAML::Node spec = Schema(LoadCrd("gpu.cozystack.io_gpudevices.yaml"))["properties"]["spec"];
  EXPECT_EQ(spec["x-kubernetes-validations"][0]["rule"].as<std::string>(), "self == oldSelf");
  EXPECT_EQ(spec["properties"]["count"]["minimum"].as<int>(), 1);
  EXPECT_EQ(spec["required"].as<std::vector<std::string>>(),
            (std::vector<std::string>{"className", "count"}));
  const std::regex className(spec["properties"]["className"]["pattern"].as<std::string>());
  for (const NameCase& c : ClassNameCases()) {
    if (c.name != "total" && c.name.size() <= 63) {
      EXPECT_EQ(std::regex_search(c.name, className), c.valid) << c.name;
    }
  }
}

// B7: "bound devices are listable per node through a field selector on status.nodeName"
TEST(GpuDeviceCrdB7, NodeNameIsSelectable) {
  const YAML::Node crd = LoadCrd("gpu.cozystack.io_gpudevices.yaml");
  bool found = false;
  for (const auto& field : Version(crd)["selectableFields"]) {
    found = found || field["jsonPath"].as<std::string>() == ".status.nodeName";
  }
  EXPECT_TRUE(found);
  EXPECT_EQ(Schema(crd)["properties"]["status"]["properties"]["nodeName"]["type"].as<std::string>(),
            "string")
      << "selectable fields must be strings, integers or booleans";
}

TEST(GpuDeviceCrd, StatusContract) {
  const YAML::Node status =
      Schema(LoadCrd("gpu.cozystack.io_gpudevices.yaml"))["properties"]["status"]["properties"];
  EXPECT_EQ(status["phase"]["enum"].as<std::vector<std::string>>(),
            (std::vector<std::string>{"Pending", "Bound", "Lost"}));
  EXPECT_TRUE(status["attachment"]["properties"]["vmiName"].IsDefined());
  EXPECT_TRUE(status["attachment"]["properties"]["vmiUID"].IsDefined());
  EXPECT_TRUE(status["bindRequest"]["properties"]["requestedAt"].IsDefined());
  EXPECT_EQ(status["bindResponse"]["properties"]["result"]["enum"].as<std::vector<std::string>>(),
            (std::vector<std::string>{"Succeeded", "Failed"}));
  for (const char* field : {"reason", "message"}) {
    EXPECT_TRUE(status["bindResponse"]["properties"][field].IsDefined()) << field;
  }
  EXPECT_EQ(status["conditions"]["x-kubernetes-list-type"].as<std::string>(), "map");
}

}  // namespace
}  // namespace cozy::api
