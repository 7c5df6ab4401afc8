// The chart's controller RBAC against the table of watched kinds (controller/watched.h): rendered
// by the real `helm template` (chart_render.h), the roles bound to the controller's
// ServiceAccount grant list and watch on every kind the table watches (a GPU-only one only with
// GPU on; one in the controller's namespace in its Role there) and on no kind the table lacks.
// A kind added to the table without its RBAC rule fails here (docs/controller.md, "Adding a
// watched kind").
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "controller/watched.h"
#include "test/chart/chart_render.h"

namespace cozy::chart {
namespace {

const std::filesystem::path kControllerChart =
    std::filesystem::path(COZY_SOURCE_DIR) / "charts/gpu";
const std::string kServiceAccount = "gpu-controller";

// One rule of a role bound to the controller: cluster-wide (a ClusterRole) or not.
struct Grant {
  bool clusterWide = false;
  std::string group;
  std::string resource;
  std::set<std::string> verbs;
  std::set<std::string> resourceNames;
};

std::vector<std::string> ListOf(const YAML::Node& list) {
  std::vector<std::string> items;
  for (const auto& item : list) items.push_back(item.as<std::string>());
  return items;
}

// Every rule of every Role and ClusterRole a binding gives the controller's ServiceAccount.
std::vector<Grant> ControllerGrants(bool gpuOn) {
  YAML::Node values;
  if (gpuOn) {
    values = YAML::Load(
        "gpu: {enabled: true, webhook: {allowUnauthenticatedCallers: true,"
        " networkPolicy: {podCIDRs: [10.244.0.0/16]}}}");
  }
  std::vector<YAML::Node> documents;
  for (const auto& document : RenderChart(kControllerChart, values)) {
    documents.push_back(YAML::Load(document.text));
  }
  std::vector<Grant> grants;
  for (const auto& binding : documents) {
    const std::string kind = binding["kind"].as<std::string>("");
    if (kind != "ClusterRoleBinding" && kind != "RoleBinding") continue;
    bool toController = false;
    for (const auto& subject : binding["subjects"]) {
      toController = toController || (subject["kind"].as<std::string>("") == "ServiceAccount" &&
                                      subject["name"].as<std::string>("") == kServiceAccount);
    }
    if (!toController) continue;
    const std::string roleKind = binding["roleRef"]["kind"].as<std::string>("");
    const std::string roleName = binding["roleRef"]["name"].as<std::string>("");
    for (const auto& role : documents) {
      if (role["kind"].as<std::string>("") != roleKind ||
          role["metadata"]["name"].as<std::string>("") != roleName) {
        continue;
      }
      for (const auto& rule : role["rules"]) {
        const auto verbs = ListOf(rule["verbs"]);
        const auto names = ListOf(rule["resourceNames"]);
        for (const auto& group : ListOf(rule["apiGroups"])) {
          for (const auto& resource : ListOf(rule["resources"])) {
            grants.push_back({roleKind == "ClusterRole", group, resource,
                              std::set<std::string>(verbs.begin(), verbs.end()),
                              std::set<std::string>(names.begin(), names.end())});
          }
        }
      }
    }
  }
  return grants;
}

// Whether `grants` let the cache of `watched` list and watch: its kind, every object of it
// cluster-wide, or (inControllerNamespace) in the release namespace, where a rule may name the
// one object its field selector selects.
template <class T>
bool ListsAndWatches(const std::vector<Grant>& grants, const controller::Watched<T>& watched,
                     const std::string& verb) {
  for (const Grant& grant : grants) {
    if (grant.group != watched.kind.group || grant.resource != watched.kind.plural ||
        !grant.verbs.contains(verb) || (!grant.clusterWide && !watched.inControllerNamespace)) {
      continue;
    }
    if (grant.resourceNames.empty()) return true;
    for (const auto& name : grant.resourceNames) {
      if (watched.fieldSelector == "metadata.name=" + name) return true;
    }
  }
  return false;
}

TEST(ChartControllerRbac, GrantsListAndWatchOnEveryWatchedKindAndNoOther) {
  for (const bool gpuOn : {false, true}) {
    SCOPED_TRACE(gpuOn ? "GPU on" : "GPU off");
    const std::vector<Grant> grants = ControllerGrants(gpuOn);
    std::set<std::pair<std::string, std::string>> watchedKinds;
    controller::ForEachWatched([&](const auto& watched) {
      watchedKinds.emplace(watched.kind.group, watched.kind.plural);
      const bool watches = gpuOn || !watched.gpuOnly;
      for (const char* verb : {"list", "watch"}) {
        EXPECT_EQ(ListsAndWatches(grants, watched, verb), watches)
            << verb << " " << watched.Name() << " (" << watched.kind.group << "/"
            << watched.kind.plural << ")"
            << (watches ? ": the controller watches it and the chart's RBAC does not let it"
                        : ": GPU-only, granted with GPU off");
      }
    });
    for (const Grant& grant : grants) {
      if (!grant.verbs.contains("list") && !grant.verbs.contains("watch")) continue;
      EXPECT_TRUE(watchedKinds.contains({grant.group, grant.resource}))
          << "list or watch on " << grant.group << "/" << grant.resource
          << ", a kind the table of watched kinds lacks (controller/watched.h)";
    }
  }
}

}  // namespace
}  // namespace cozy::chart
