// charts/gpu's monitoring objects (docs/operations.md) rendered by the real `helm template`
// (chart_render.h): the Prometheus operator's and VictoriaMetrics' scrape and rule objects
// appear only where the cluster serves their API (--api-versions) or their switch forces them,
// their selectors find the chart's metrics Services and those the pods and ports that serve
// /metrics, both rule objects hold the same alerts, and the dashboard's ConfigMap holds the
// chart's dashboard file.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "test/chart/chart_render.h"

namespace cozy::chart {
namespace {

const std::filesystem::path kChart = std::filesystem::path(COZY_SOURCE_DIR) / "charts/gpu";
const std::string kPrometheusApi = "monitoring.coreos.com/v1";
const std::string kVictoriaApi = "operator.victoriametrics.com/v1beta1";

// GPU on (the binder's, webhooks' and catalog's alerts render only then), the callers opted out
// of authentication and no NetworkPolicy: neither matters here.
YAML::Node GpuOn() {
  return YAML::Load(
      "gpu: {enabled: true, webhook: {allowUnauthenticatedCallers: true,"
      " networkPolicy: {enabled: false}}}");
}

std::vector<YAML::Node> Render(const YAML::Node& overrides, std::vector<std::string> apis) {
  Release release;
  release.apiVersions = std::move(apis);
  std::vector<YAML::Node> documents;
  for (const auto& document : RenderChart(kChart, overrides, release)) {
    documents.push_back(YAML::Load(document.text));
  }
  return documents;
}

std::vector<YAML::Node> OfKind(const std::vector<YAML::Node>& documents, const std::string& kind) {
  std::vector<YAML::Node> found;
  for (const auto& document : documents) {
    if (document["kind"].as<std::string>("") == kind) found.push_back(document);
  }
  return found;
}

// Every key of `selector` is in `labels` with the same value (a matchLabels selector).
bool Selects(const YAML::Node& selector, const YAML::Node& labels) {
  if (!selector.IsMap() || selector.size() == 0) return false;
  for (const auto& entry : selector) {
    const YAML::Node value = labels[entry.first.as<std::string>()];
    if (!value || value.as<std::string>() != entry.second.as<std::string>()) return false;
  }
  return true;
}

std::map<std::string, size_t> MonitoringKinds(const std::vector<YAML::Node>& documents) {
  std::map<std::string, size_t> counts;
  for (const char* kind : {"ServiceMonitor", "PrometheusRule", "VMServiceScrape", "VMRule"}) {
    counts[kind] = OfKind(documents, kind).size();
  }
  return counts;
}

// docs/operations.md, "The chart's monitoring values": auto renders each operator's objects
// exactly where the cluster serves its API; true renders them regardless, false never.
TEST(ChartMonitoring, OperatorObjectsRenderOnlyWhereTheirApiIsServedOrForced) {
  struct Case {
    std::string values;
    std::vector<std::string> apis;
    std::map<std::string, size_t> expected;
  };
  const std::vector<Case> cases = {
      {"{}",
       {},
       {{"ServiceMonitor", 0}, {"PrometheusRule", 0}, {"VMServiceScrape", 0}, {"VMRule", 0}}},
      {"{}",
       {kPrometheusApi},
       {{"ServiceMonitor", 2}, {"PrometheusRule", 1}, {"VMServiceScrape", 0}, {"VMRule", 0}}},
      {"{}",
       {kVictoriaApi},
       {{"ServiceMonitor", 0}, {"PrometheusRule", 0}, {"VMServiceScrape", 2}, {"VMRule", 1}}},
      {"{}",
       {kPrometheusApi, kVictoriaApi},
       {{"ServiceMonitor", 2}, {"PrometheusRule", 1}, {"VMServiceScrape", 2}, {"VMRule", 1}}},
      // Another API of the same group is not the one asked for.
      {"{}",
       {"monitoring.coreos.com/v1alpha1", "operator.victoriametrics.com/v1"},
       {{"ServiceMonitor", 0}, {"PrometheusRule", 0}, {"VMServiceScrape", 0}, {"VMRule", 0}}},
      {"{serviceMonitor: {enabled: true}, vmRule: {enabled: true}}",
       {},
       {{"ServiceMonitor", 2}, {"PrometheusRule", 0}, {"VMServiceScrape", 0}, {"VMRule", 1}}},
      {"{serviceMonitor: {enabled: false}, vmServiceScrape: {enabled: false}}",
       {kPrometheusApi, kVictoriaApi},
       {{"ServiceMonitor", 0}, {"PrometheusRule", 1}, {"VMServiceScrape", 0}, {"VMRule", 1}}},
      {"{prometheusRule: {enabled: false}, vmRule: {enabled: false}}",
       {kPrometheusApi, kVictoriaApi},
       {{"ServiceMonitor", 2}, {"PrometheusRule", 0}, {"VMServiceScrape", 2}, {"VMRule", 0}}},
  };
  for (const auto& [values, apis, expected] : cases) {
    YAML::Node overrides = GpuOn();
    overrides["monitoring"] = YAML::Load(values);
    std::string named;
    for (const auto& api : apis) named += api + " ";
    EXPECT_EQ(MonitoringKinds(Render(overrides, apis)), expected)
        << "monitoring: " << values << ", --api-versions " << named;
  }
}

// Each scrape object selects exactly one of the chart's Services in the release's namespace, by
// labels; that Service has the port the scrape names, its selector matches the pods of the
// Deployment or DaemonSet, and its targetPort is the container's health port, the one serving
// /metrics. The webhook Service (which also has a port "metrics") is not selected: no replica is
// scraped twice.
void ExpectScrapeReachesThePods(const std::vector<YAML::Node>& documents, const YAML::Node& scrape,
                                int healthPort) {
  const std::string name = scrape["metadata"]["name"].as<std::string>();
  const std::string what = scrape["kind"].as<std::string>() + " " + name;
  EXPECT_EQ(scrape["metadata"]["namespace"].as<std::string>(""), "cozy-gpu") << what;
  ASSERT_EQ(scrape["spec"]["namespaceSelector"]["matchNames"].size(), 1u) << what;
  EXPECT_EQ(scrape["spec"]["namespaceSelector"]["matchNames"][0].as<std::string>(), "cozy-gpu");
  std::vector<YAML::Node> services;
  for (const auto& service : OfKind(documents, "Service")) {
    if (Selects(scrape["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])) {
      services.push_back(service);
    }
  }
  ASSERT_EQ(services.size(), 1u) << what << " selects " << services.size() << " Services";
  const YAML::Node service = services[0];
  EXPECT_EQ(service["metadata"]["name"].as<std::string>(), name + "-metrics") << what;
  EXPECT_EQ(service["spec"]["clusterIP"].as<std::string>(""), "None") << what;
  EXPECT_TRUE(service["spec"]["publishNotReadyAddresses"].as<bool>(false)) << what;
  ASSERT_EQ(scrape["spec"]["endpoints"].size(), 1u) << what;
  const std::string port = scrape["spec"]["endpoints"][0]["port"].as<std::string>("");
  EXPECT_EQ(scrape["spec"]["endpoints"][0]["path"].as<std::string>(""), "/metrics") << what;
  std::string targetPort;
  for (const auto& servicePort : service["spec"]["ports"]) {
    if (servicePort["name"].as<std::string>("") != port) continue;
    targetPort = servicePort["targetPort"].as<std::string>("");
    EXPECT_EQ(servicePort["port"].as<int>(0), healthPort) << what;
  }
  ASSERT_FALSE(targetPort.empty()) << what << ": its Service has no port named '" << port << "'";
  const std::string workloadKind = name == "gpu-agent" ? "DaemonSet" : "Deployment";
  const auto workloads = OfKind(documents, workloadKind);
  ASSERT_EQ(workloads.size(), 1u) << workloadKind;
  const YAML::Node pod = workloads[0]["spec"]["template"];
  EXPECT_TRUE(Selects(service["spec"]["selector"], pod["metadata"]["labels"]))
      << what << ": its Service selects no pod of the " << workloadKind;
  bool served = false;
  for (const auto& containerPort : pod["spec"]["containers"][0]["ports"]) {
    if (containerPort["name"].as<std::string>("") == targetPort) {
      served = containerPort["containerPort"].as<int>(0) == healthPort;
    }
  }
  EXPECT_TRUE(served) << what << ": targetPort '" << targetPort << "' is not the container's "
                      << healthPort;
}

TEST(ChartMonitoring, ScrapeObjectsSelectTheMetricsServicesWhichSelectThePodsHealthPorts) {
  YAML::Node overrides = GpuOn();
  overrides["controller"]["healthPort"] = 8181;
  overrides["agent"]["healthPort"] = 9911;
  const auto documents = Render(overrides, {kPrometheusApi, kVictoriaApi});
  for (const char* kind : {"ServiceMonitor", "VMServiceScrape"}) {
    const auto scrapes = OfKind(documents, kind);
    ASSERT_EQ(scrapes.size(), 2u) << kind;
    for (const auto& scrape : scrapes) {
      const bool agent = scrape["metadata"]["name"].as<std::string>() == "gpu-agent";
      ExpectScrapeReachesThePods(documents, scrape, agent ? 9911 : 8181);
      const YAML::Node endpoint = scrape["spec"]["endpoints"][0];
      if (agent) {  // the node's name as label node (the alerts name it)
        const YAML::Node relabel =
            endpoint[std::string(kind) == "ServiceMonitor" ? "relabelings" : "relabelConfigs"][0];
        EXPECT_EQ(relabel["sourceLabels"][0].as<std::string>(""),
                  "__meta_kubernetes_endpoint_node_name")
            << kind;
        EXPECT_EQ(relabel["targetLabel"].as<std::string>(""), "node") << kind;
      } else {  // gpu_catalog_tenant_units_held keeps the tenant's namespace
        EXPECT_TRUE(endpoint["honorLabels"].as<bool>(false)) << kind;
      }
    }
  }
  // Without GPUs the controller's metrics Service is there all the same (the webhook Service
  // is not).
  const auto gpuOff = Render(YAML::Load("{}"), {kPrometheusApi});
  for (const auto& scrape : OfKind(gpuOff, "ServiceMonitor")) {
    const bool agent = scrape["metadata"]["name"].as<std::string>() == "gpu-agent";
    ExpectScrapeReachesThePods(gpuOff, scrape, agent ? 9810 : 8080);
  }
}

std::vector<std::string> AlertNames(const YAML::Node& rule) {
  std::vector<std::string> names;
  for (const auto& group : rule["spec"]["groups"]) {
    for (const auto& entry : group["rules"]) names.push_back(entry["alert"].as<std::string>());
  }
  return names;
}

// One source: the PrometheusRule and the VMRule hold the same groups; the binder's, webhooks'
// and catalog's alerts only with GPUs on (without, those metrics do not exist); monitoring.labels
// reach every operator object (what a Prometheus's ruleSelector asks for).
TEST(ChartMonitoring, BothRuleObjectsHoldTheSameAlertsAndGpuOnesOnlyWithGpus) {
  YAML::Node overrides = GpuOn();
  overrides["monitoring"]["labels"]["release"] = "kube-prometheus-stack";
  const auto documents = Render(overrides, {kPrometheusApi, kVictoriaApi});
  const auto prometheus = OfKind(documents, "PrometheusRule");
  const auto victoria = OfKind(documents, "VMRule");
  ASSERT_EQ(prometheus.size(), 1u);
  ASSERT_EQ(victoria.size(), 1u);
  EXPECT_EQ(YAML::Dump(prometheus[0]["spec"]), YAML::Dump(victoria[0]["spec"]));
  const std::vector<std::string> gpuOn = AlertNames(prometheus[0]);
  EXPECT_EQ(gpuOn.size(), 12u);
  for (const char* kind : {"ServiceMonitor", "PrometheusRule", "VMServiceScrape", "VMRule"}) {
    for (const auto& object : OfKind(documents, kind)) {
      EXPECT_EQ(object["metadata"]["labels"]["release"].as<std::string>(""),
                "kube-prometheus-stack")
          << kind;
    }
  }
  const auto gpuOff = OfKind(Render(YAML::Load("{}"), {kPrometheusApi}), "PrometheusRule");
  ASSERT_EQ(gpuOff.size(), 1u);
  EXPECT_EQ(AlertNames(gpuOff[0]),
            (std::vector<std::string>{"GPUControllerNoLeader", "GPUControllerCacheNotSynced",
                                      "GPUControllerCacheFailing", "GPUAgentNotPublishing",
                                      "GPUAgentUnitsUnknown", "GPUAgentUnitsStale"}));
  // The thresholds come from values.
  overrides["monitoring"]["alerts"]["pendingOrderSeconds"] = 123;
  const std::string spec =
      YAML::Dump(OfKind(Render(overrides, {kPrometheusApi}), "PrometheusRule")[0]["spec"]);
  EXPECT_NE(spec.find("(gpu_catalog_class_oldest_pending_seconds) > 123"), std::string::npos)
      << spec;
}

// The dashboard's ConfigMap carries the label Grafana's sidecar looks for and exactly the
// chart's dashboards/gpu.json, whose panels each query something; switched off, it is gone.
TEST(ChartMonitoring, DashboardConfigMapHoldsTheChartsDashboardForGrafanasSidecar) {
  const auto documents = Render(YAML::Load("{}"), {});
  std::vector<YAML::Node> dashboards;
  for (const auto& map : OfKind(documents, "ConfigMap")) {
    if (map["metadata"]["name"].as<std::string>("") == "gpu-dashboard") dashboards.push_back(map);
  }
  ASSERT_EQ(dashboards.size(), 1u);
  EXPECT_EQ(dashboards[0]["metadata"]["labels"]["grafana_dashboard"].as<std::string>(""), "1");
  std::ifstream file(kChart / "dashboards/gpu.json");
  ASSERT_TRUE(file);
  const nlohmann::json expected = nlohmann::json::parse(file);
  const nlohmann::json rendered =
      nlohmann::json::parse(dashboards[0]["data"]["gpu.json"].as<std::string>(""));
  EXPECT_EQ(rendered, expected);
  ASSERT_GE(rendered["panels"].size(), 6u);
  for (const auto& panel : rendered["panels"]) {
    ASSERT_FALSE(panel["targets"].empty()) << panel["title"];
    for (const auto& target : panel["targets"]) {
      EXPECT_FALSE(target.value("expr", "").empty()) << panel["title"];
      EXPECT_EQ(target["datasource"]["uid"], "${datasource}") << panel["title"];
    }
  }
  YAML::Node off;
  off["monitoring"]["dashboard"]["enabled"] = false;
  off["monitoring"]["dashboard"]["annotations"]["grafana_folder"] = "GPU";
  for (const auto& map : OfKind(Render(off, {}), "ConfigMap")) {
    EXPECT_NE(map["metadata"]["name"].as<std::string>(""), "gpu-dashboard");
  }
  off["monitoring"]["dashboard"]["enabled"] = true;
  for (const auto& map : OfKind(Render(off, {}), "ConfigMap")) {
    if (map["metadata"]["name"].as<std::string>("") != "gpu-dashboard") continue;
    EXPECT_EQ(map["metadata"]["annotations"]["grafana_folder"].as<std::string>(""), "GPU");
  }
}

// The switches take auto, true or false and nothing else (values.schema.json).
TEST(ChartMonitoring, ASwitchOtherThanAutoTrueOrFalseIsRefused) {
  for (const char* values :
       {"monitoring: {serviceMonitor: {enabled: yes-please}}",
        "monitoring: {vmRule: {enabled: \"true\"}}",
        "monitoring: {alerts: {pendingOrderSeconds: 0}}", "monitoring: {scrapeInterval: 30}"}) {
    EXPECT_THROW(Render(YAML::Load(values), {}), RenderError) << values;
  }
}

}  // namespace
}  // namespace cozy::chart
