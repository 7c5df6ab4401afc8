// The built-in kinds the fake serves and their validation basics.
#include "test/fakes/fake_apiserver_internal.h"

#include <algorithm>

namespace cozy::fake {
using namespace internal;  // NOLINT

void FakeApiServer::RegisterBuiltins() {
  auto add = [this](ResourceType type) {
    auto shared = std::make_shared<const ResourceType>(std::move(type));
    types_[shared->group + "/" + shared->version + "/" + shared->plural] = shared;
  };
  ResourceType nodes;
  nodes.version = "v1";
  nodes.plural = "nodes";
  nodes.singular = "node";
  nodes.kind = "Node";
  nodes.listKind = "NodeList";
  nodes.statusSubresource = true;
  nodes.statusOnCreate = true;
  nodes.shortNames = {"no"};
  nodes.fieldLabels = {"spec.unschedulable"};
  add(nodes);
  ResourceType pods;
  pods.version = "v1";
  pods.plural = "pods";
  pods.singular = "pod";
  pods.kind = "Pod";
  pods.listKind = "PodList";
  pods.namespaced = true;
  pods.statusSubresource = true;
  pods.shortNames = {"po"};
  pods.categories = {"all"};
  pods.fieldLabels = {"spec.nodeName",           "spec.restartPolicy", "spec.schedulerName",
                      "spec.serviceAccountName", "status.phase",       "status.podIP",
                      "status.nominatedNodeName"};
  add(pods);
  ResourceType namespaces;
  namespaces.version = "v1";
  namespaces.plural = "namespaces";
  namespaces.singular = "namespace";
  namespaces.kind = "Namespace";
  namespaces.listKind = "NamespaceList";
  namespaces.statusSubresource = true;
  namespaces.shortNames = {"ns"};
  namespaces.fieldLabels = {"status.phase"};
  add(namespaces);
  ResourceType crds;
  crds.group = "apiextensions.k8s.io";
  crds.version = "v1";
  crds.plural = "customresourcedefinitions";
  crds.singular = "customresourcedefinition";
  crds.kind = "CustomResourceDefinition";
  crds.listKind = "CustomResourceDefinitionList";
  crds.statusSubresource = true;
  crds.shortNames = {"crd", "crds"};
  add(crds);
}

}  // namespace cozy::fake
