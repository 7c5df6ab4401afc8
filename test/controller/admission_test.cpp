// The admission webhooks' pure part: the device-reference annotation, the AdmissionReview codec
// on payloads as the API server sends them, the GPUDevice order check, the VMI start plan and
// patch, the launcher pod's pin. Each test names the catalog ID it covers.
#include <gtest/gtest.h>

#include <openssl/evp.h>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "api/device_references.h"
#include "api/json_field.h"
#include "api/keys.h"
#include "controller/admission/orders.h"
#include "controller/admission/pod.h"
#include "controller/admission/review.h"
#include "controller/admission/vmi.h"
#include "controller/model/readers.h"
#include "test/controller/admission_fixtures.h"
#include "test/controller/model_fixtures.h"

namespace cozy::admission {
namespace {

using namespace cozy::admission::testing;
using namespace cozy::model::testing;
using api::DeviceReferences;
using nlohmann::json;

// EVP_DecodeBlock counts padding as decoded zero bytes: drop one per '='.
std::string DecodeBase64(const std::string& text) {
  std::string out(text.size(), '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(text.data()),
                                static_cast<int>(text.size()));
  EXPECT_GE(n, 0);
  size_t size = static_cast<size_t>(std::max(n, 0));
  for (size_t i = text.size(); i > 0 && text[i - 1] == '='; --i) {
    --size;
  }
  out.resize(size);
  return out;
}

// ---- the device-reference annotation (E12) ----

TEST(DeviceReferencesE12, ParsesDevicesAndTemplates) {
  const DeviceReferences refs = api::ParseDeviceReferences(
      R"({"devices":["held","gpu.a"],"templates":[{"name":"gpu","className":"a100","count":2}]})");
  EXPECT_EQ(refs.devices, (std::vector<std::string>{"held", "gpu.a"}));
  ASSERT_EQ(refs.templates.size(), 1U);
  EXPECT_EQ(refs.templates[0], (DeviceReferences::Template{"gpu", "a100", 2}));
  EXPECT_TRUE(api::ParseDeviceReferences(R"({"devices":["x"]})").templates.empty());
  EXPECT_TRUE(
      api::ParseDeviceReferences(R"({"templates":[{"name":"t","className":"c","count":1}]})")
          .devices.empty());
}

TEST(DeviceReferencesE12, RoundTripsInTheCompactShape) {
  const std::string text =
      R"({"devices":["a","b"],"templates":[{"name":"t1","className":"a100","count":1},{"name":"t2","className":"l40s","count":4}]})";
  EXPECT_EQ(api::ToAnnotation(api::ParseDeviceReferences(text)), text);
  EXPECT_EQ(api::ToAnnotation(DeviceReferences{{"a"}, {}}), R"({"devices":["a"]})");
  EXPECT_EQ(api::ToAnnotation(DeviceReferences{{}, {{"t", "c", 1}}}),
            R"({"templates":[{"name":"t","className":"c","count":1}]})");
}

TEST(DeviceReferencesE12, RefusesMalformedValuesNamingWhatAndWhere) {
  struct Case {
    const char* value;
    const char* field;  // DecodeError::field()
    const char* problem;
  };
  const std::vector<Case> cases = {
      {"not json", "", "not JSON"},
      {"[]", "", "JSON object"},
      {R"({"devices":["a"],"extra":1})", "extra", "unknown key"},
      {R"({"devices":["Bad_Name"]})", "devices[0]", "device name"},
      {R"({"devices":["a","a"]})", "devices[1]", "named twice"},
      {R"({"devices":[1]})", "devices[0]", "expected a string"},
      {R"({"templates":[{"name":"t","className":"c","count":1,"x":1}]})", "templates[0].x",
       "unknown key"},
      {R"({"templates":[{"name":"a.b","className":"c","count":1}]})", "templates[0].name",
       "template name"},
      {R"({"templates":[{"name":"t","className":"c","count":1},{"name":"t","className":"c","count":1}]})",
       "templates[1].name", "named twice"},
      {R"({"templates":[{"name":"t","className":"C","count":1}]})", "templates[0].className",
       "className"},
      {R"({"templates":[{"name":"t","className":"c","count":0}]})", "templates[0].count",
       "at least 1"},
      {R"({"templates":[{"name":"t","className":"c","count":1.5}]})", "templates[0].count",
       "at least 1"},
      {R"({"templates":[{"name":"t","className":"c","count":"2"}]})", "templates[0].count",
       "at least 1"},
      {R"({"templates":[{"name":"t","className":"c"}]})", "templates[0].count", "missing"},
      {R"({})", "", "no device and no template"},
      {R"({"devices":[],"templates":[]})", "", "no device and no template"},
  };
  for (const Case& c : cases) {
    try {
      api::ParseDeviceReferences(c.value);
      ADD_FAILURE() << c.value << ": parsed";
    } catch (const api::DecodeError& error) {
      EXPECT_EQ(error.field(), c.field) << c.value << ": " << error.what();
      EXPECT_NE(std::string(error.what()).find(c.problem), std::string::npos)
          << c.value << ": " << error.what();
    }
  }
}

// E12: "this test reads each pinned value back through the webhook's parser" — the pins the
// vm-instance chart's tests keep (test/chart/chart_test.cpp checks the chart renders them).
TEST(DeviceReferencesE12, ReadsEveryValueTheChartPins) {
  const std::filesystem::path pins =
      std::filesystem::path(COZY_SOURCE_DIR) / "test/chart/vm-instance-pins.json";
  ASSERT_TRUE(std::filesystem::exists(pins)) << pins << ": the chart's pins are gone";
  std::ifstream in(pins);
  const json cases = json::parse(in);
  ASSERT_TRUE(cases.is_array());
  ASSERT_FALSE(cases.empty());
  for (const json& pin : cases) {
    const std::string annotation = pin.at("annotation").get<std::string>();
    // What the chart was given (values.gpus) is what the parser must read back.
    DeviceReferences expected;
    const json gpus = pin.at("values").value("gpus", json::object());
    expected.devices = gpus.value("devices", std::vector<std::string>{});
    for (const json& item : gpus.value("templates", json::array())) {
      expected.templates.push_back({item.at("name").get<std::string>(),
                                    item.at("className").get<std::string>(),
                                    item.at("count").get<int64_t>()});
    }
    try {
      const DeviceReferences refs = api::ParseDeviceReferences(annotation);
      EXPECT_EQ(refs.devices, expected.devices) << annotation;
      EXPECT_EQ(refs.templates, expected.templates) << annotation;
      // The chart may write an empty list the writer here leaves out: the same references.
      EXPECT_EQ(api::ParseDeviceReferences(api::ToAnnotation(refs)), refs) << annotation;
    } catch (const api::DecodeError& error) {
      ADD_FAILURE() << annotation << ": " << error.what();
    }
  }
}

// ---- the AdmissionReview codec ----

TEST(AdmissionReview, DecodesAGpuDeviceCreate) {
  const AdmissionRequest request = DecodeAdmissionReview(ReadTestdata("gpudevice-create.json"));
  EXPECT_EQ(request.uid, "0f3c1c2e-6a53-4c0e-9f3e-1a2b3c4d5e6f");
  EXPECT_EQ(request.kind, (GroupVersionKind{"gpu.cozystack.io", "v1alpha1", "GPUDevice"}));
  EXPECT_EQ(request.resource, (GroupVersionResource{"gpu.cozystack.io", "v1alpha1", "gpudevices"}));
  EXPECT_EQ(request.operation, Operation::kCreate);
  EXPECT_EQ(request.name, "gpu1");
  EXPECT_EQ(request.namespaceName, "tenant-a");
  EXPECT_EQ(request.userInfo.username, "oidc:alice@example.com");
  EXPECT_EQ(request.userInfo.groups.size(), 2U);
  EXPECT_TRUE(request.oldObject.is_null());
  EXPECT_FALSE(request.dryRun);
  EXPECT_EQ(request.options["kind"], "CreateOptions");
  const api::GpuDevice device = api::GpuDeviceFromJson(request.object);
  EXPECT_EQ(device.spec.count, 3);
}

TEST(AdmissionReview, DecodesADryRunWithUserExtra) {
  const AdmissionRequest request = DecodeAdmissionReview(ReadTestdata("vmi-create-dryrun.json"));
  EXPECT_TRUE(request.dryRun);
  EXPECT_EQ(request.kind.group, "kubevirt.io");
  ASSERT_TRUE(request.requestKind);
  EXPECT_EQ(request.requestKind->kind, "VirtualMachineInstance");
  EXPECT_EQ(request.userInfo.extra.at("authentication.kubernetes.io/node-name"),
            std::vector<std::string>{"n1"});
  EXPECT_EQ(request.userInfo.extra.size(), 5U);
}

TEST(AdmissionReview, DecodesAnUpdateWithItsOldObject) {
  const AdmissionRequest request = DecodeAdmissionReview(ReadTestdata("vmi-update.json"));
  EXPECT_EQ(request.operation, Operation::kUpdate);
  EXPECT_EQ(request.oldObject["metadata"]["resourceVersion"], "12345");
  EXPECT_EQ(request.object["status"]["nodeName"], "n1");
}

// E9: a reinvocation is a new request with its own uid, for the same VMI.
// What E9 stands on, not E9 itself (VmiStartPlanE9 and the e2e E9 tests hold that): the review
// of a reinvocation decodes as a request of its own for the same VMI.
TEST(AdmissionReview, AReinvocationDecodesAsANewRequestForTheSameVmi) {
  const AdmissionRequest first = DecodeAdmissionReview(ReadTestdata("vmi-create-dryrun.json"));
  const AdmissionRequest again = DecodeAdmissionReview(ReadTestdata("vmi-reinvocation.json"));
  EXPECT_NE(first.uid, again.uid);
  EXPECT_EQ(first.name, again.name);
  EXPECT_EQ(first.namespaceName, again.namespaceName);
}

TEST(AdmissionReview, RefusesMalformedReviews) {
  const json good = ReadTestdata("gpudevice-create.json");
  struct Case {
    const char* what;
    std::function<void(json&)> damage;
    const char* field;
  };
  const std::vector<Case> cases = {
      {"v1beta1", [](json& r) { r["apiVersion"] = "admission.k8s.io/v1beta1"; }, "apiVersion"},
      {"kind", [](json& r) { r["kind"] = "Pod"; }, "kind"},
      {"no request", [](json& r) { r.erase("request"); }, "request"},
      {"no uid", [](json& r) { r["request"].erase("uid"); }, "request.uid"},
      {"empty uid", [](json& r) { r["request"]["uid"] = ""; }, "request.uid"},
      {"operation", [](json& r) { r["request"]["operation"] = "PATCH"; }, "request.operation"},
      {"no kind", [](json& r) { r["request"].erase("kind"); }, "request.kind"},
      {"groups", [](json& r) { r["request"]["userInfo"]["groups"][1] = 7; },
       "request.userInfo.groups[1]"},
      {"object", [](json& r) { r["request"]["object"] = "x"; }, "request.object"},
      {"dryRun", [](json& r) { r["request"]["dryRun"] = "yes"; }, "request.dryRun"},
  };
  for (const Case& c : cases) {
    json review = good;
    c.damage(review);
    try {
      DecodeAdmissionReview(review);
      ADD_FAILURE() << c.what << ": decoded";
    } catch (const api::DecodeError& error) {
      EXPECT_EQ(error.field(), c.field) << c.what << ": " << error.what();
    }
  }
  EXPECT_THROW(DecodeAdmissionReview(std::string_view("{not json")), api::DecodeError);
  EXPECT_NO_THROW(DecodeAdmissionReview(std::string_view(good.dump())));
}

TEST(AdmissionReview, EncodesARefusal) {
  AdmissionRequest request;
  request.uid = "u-1";
  const json review = EncodeAdmissionReview(Refuse(request, "no room"));
  EXPECT_EQ(review["apiVersion"], "admission.k8s.io/v1");
  EXPECT_EQ(review["kind"], "AdmissionReview");
  const json& response = review["response"];
  EXPECT_EQ(response["uid"], "u-1");
  EXPECT_EQ(response["allowed"], false);
  EXPECT_EQ(response["status"],
            (json{{"code", 403}, {"reason", "Forbidden"}, {"message", "no room"}}));
  EXPECT_FALSE(response.contains("patch"));
}

TEST(AdmissionReview, EncodesAPatchAsBase64JsonPatch) {
  AdmissionRequest request;
  request.uid = "u-2";
  const json ops = json::array({{{"op", "add"}, {"path", "/a"}, {"value", 1}}});
  AdmissionResponse response = Allow(request, ops);
  response.warnings = {"careful"};
  const json review = EncodeAdmissionReview(response);
  EXPECT_EQ(review["response"]["allowed"], true);
  EXPECT_FALSE(review["response"].contains("status"));
  EXPECT_EQ(review["response"]["patchType"], "JSONPatch");
  EXPECT_EQ(json::parse(DecodeBase64(review["response"]["patch"].get<std::string>())), ops);
  EXPECT_EQ(review["response"]["warnings"], json::array({"careful"}));
  // No ops: no patch at all.
  const json plain = EncodeAdmissionReview(Allow(request, json::array()));
  EXPECT_FALSE(plain["response"].contains("patchType"));
  EXPECT_FALSE(plain["response"].contains("patch"));
  EXPECT_FALSE(plain["response"].contains("warnings"));
}

TEST(AdmissionReview, Base64IsStandardWithPadding) {
  EXPECT_EQ(Base64(""), "");
  EXPECT_EQ(Base64("f"), "Zg==");
  EXPECT_EQ(Base64("fo"), "Zm8=");
  EXPECT_EQ(Base64("foo"), "Zm9v");
  EXPECT_EQ(Base64(std::string("\xff\xfe\x00", 3)), "//4A");
}

}  // namespace
}  // namespace cozy::admission
