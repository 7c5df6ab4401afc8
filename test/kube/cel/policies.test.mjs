// The chart's admission policies (docs/policies.md), as rendered with GPUs off and on, run
// through admission.mjs, which applies every policy with its binding as the API server does.
// Each SEEDS-CATALOG item F3-F17, B2 and H6 has its allowed and refused cases; F1 and F2 are in
// policy.test.mjs and are run here once more through every binding of both renders.
// The evaluator's own semantics are tested first: a harness that read an error as "allowed",
// or skipped a selector, would let every policy test below pass on a broken policy.
import { test as nodeTest } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
// With COZY_RECORD_POLICY_CASES set, every case asserted on the chart's policies is written
// down for the replay on a real API server (record.mjs, realserver.test.mjs).
import { recordCase, recordingTest } from "./record.mjs";

const test = recordingTest(nodeTest);

let admit, admitAll, admissionRequest, checkExpression, policyExpressions, OLDEST_MINOR;
let parseAllDocuments, parseDocument;
try {
  ({ parseAllDocuments, parseDocument } = await import("yaml"));
  ({ admit, admitAll, admissionRequest } = await import("./admission.mjs"));
  ({ checkExpression, policyExpressions, OLDEST_MINOR } = await import("./cel-versions.mjs"));
} catch (error) {
  console.error("policies test: npm packages missing; run scripts/install-deps.sh " +
    "(npm ci --prefix test/kube/cel): " + error.message);
  process.exit(1);
}

// test/kube/CMakeLists.txt renders the chart twice into a namespace other than the default.
const env = (name) => {
  if (!process.env[name]) {
    console.error(`policies test: ${name} must be set (ctest sets it)`);
    process.exit(1);
  }
  return process.env[name];
};
const load = (file) => parseAllDocuments(readFileSync(file, "utf8")).map((d) => d.toJS())
  .filter((d) => d);
const OFF = load(env("COZY_RENDERED_CHART_GPU_OFF"));
const ON = load(env("COZY_RENDERED_CHART_GPU_ON"));
const RELEASE_NS = env("COZY_RELEASE_NAMESPACE");
const CHART_YAML = parseDocument(readFileSync(env("COZY_CHART_YAML"), "utf8")).toJS();
const RENDERS = [["GPUs off", OFF], ["GPUs on", ON]];
const renderOf = (docs) => (docs === OFF ? "off" : docs === ON ? "on" : null);

// The keys, read from api/keys.h, so the policies are checked against what the binder and
// webhooks spell (B1).
const KEYS = Object.fromEntries([...readFileSync(env("COZY_KEYS_H"), "utf8")
  .matchAll(/constexpr std::string_view (k\w+) = "([^"]*)";/g)].map((m) => [m[1], m[2]]));
const TENANT_KEY = KEYS.kTenantNamespaceLabel;
const USAGE_KEY = KEYS.kUsageMonitorLabel;
const DEVICE_FINALIZER = KEYS.kDeviceFinalizer;
const CLASS_FINALIZER = KEYS.kClassFinalizer;
const TEMPLATE_MARK = KEYS.kTemplateDeviceLabel;
const DEVICE_REFS = KEYS.kDeviceReferenceLabel;

const byName = (docs, kind, name) => docs.find((d) => d.kind === kind && d.metadata.name === name);
const policyNames = (docs) => docs.filter((d) => d.kind === "ValidatingAdmissionPolicy")
  .map((d) => d.metadata.name).sort();

// --- The cluster the requests land in ---------------------------------------------------

function namespace(name, labels = {}) {
  return { apiVersion: "v1", kind: "Namespace", metadata: { name, labels } };
}
const NAMESPACES = Object.fromEntries([
  namespace("tenant-root", { [TENANT_KEY]: "" }),
  namespace("tenant-a", { [TENANT_KEY]: "", "tenant.cozystack.io/tenant-root": "" }),
  namespace("cozy-system"),
  namespace("kube-system"),
  namespace(RELEASE_NS),
  namespace("default"),
].map((n) => [n.metadata.name, n]));

const GPU_NAMES = ["nvidia.com/GA100", "nvidia.com/AD102GL_L40S"];
function settings({ names = GPU_NAMES, raw = KEYS.kRawNamePolicyForbidden } = {}) {
  const data = { [KEYS.kSettingsResourceNamesKey]: names.join(",") };
  if (raw !== undefined) data[KEYS.kSettingsRawNamePolicyKey] = raw;
  return { apiVersion: "v1", kind: "ConfigMap",
    metadata: { name: KEYS.kSettingsConfigMapName, namespace: RELEASE_NS }, data };
}

function gpuClass(name, { finalizers = [CLASS_FINALIZER], deleting = false, spec = {} } = {}) {
  const metadata = { name, uid: `uid-${name}`, finalizers };
  if (deleting) metadata.deletionTimestamp = "2026-01-01T00:00:00Z";
  return {
    apiVersion: "gpu.cozystack.io/v1alpha1", kind: "GPUClass", metadata,
    spec: {
      vendor: "nvidia", model: "A100", mode: "passthrough", memory: "80Gi", maxCount: 4,
      source: { devicePlugin: { resourceName: "nvidia.com/GA100" } },
      nodeSelector: { matchLabels: { gpu: "a100" } },
      ...spec,
    },
  };
}

const cluster = ({ objects = [settings()] } = {}) => ({ namespaces: NAMESPACES, objects });

// --- Callers ------------------------------------------------------------------------------

const sa = (ns, name) => ({ username: `system:serviceaccount:${ns}:${name}`,
  groups: ["system:serviceaccounts", `system:serviceaccounts:${ns}`, "system:authenticated"] });
const TENANT = { username: "alice", groups: ["tenant-a-admins", "system:authenticated"] };
const TENANT_SA = sa("tenant-a", "default");
const ADMIN = { username: "kubernetes-admin", groups: ["system:masters", "system:authenticated"] };
const COZY_SA = sa("cozy-system", "cozystack-controller");
// The chart's own controller: the service account gpu-controller of the release's namespace.
const CONTROLLER = sa(RELEASE_NS, "gpu-controller");
const KUBE_SYSTEM_SA = sa("kube-system", "generic-garbage-collector");
const KCM = { username: "system:kube-controller-manager", groups: ["system:authenticated"] };
const KUBEVIRT_CONTROLLER = sa("cozy-kubevirt", "kubevirt-controller");

// --- Requests -------------------------------------------------------------------------------

const RESOURCES = {
  GPUClass: ["gpu.cozystack.io", "v1alpha1", "gpuclasses"],
  GPUDevice: ["gpu.cozystack.io", "v1alpha1", "gpudevices"],
  GPUNode: ["gpu.cozystack.io", "v1alpha1", "gpunodes"],
  Pod: ["", "v1", "pods"],
  ConfigMap: ["", "v1", "configmaps"],
  DataVolume: ["cdi.kubevirt.io", "v1beta1", "datavolumes"],
  VirtualMachineInstance: ["kubevirt.io", "v1", "virtualmachineinstances"],
  Deployment: ["apps", "v1", "deployments"],
  Namespace: ["", "v1", "namespaces"],
  ResourceSlice: ["resource.k8s.io", "v1", "resourceslices"],
  ResourceClaim: ["resource.k8s.io", "v1", "resourceclaims"],
  ResourceClaimTemplate: ["resource.k8s.io", "v1", "resourceclaimtemplates"],
};

// A write as the API server hands it to admission: object null on DELETE, oldObject null on
// CREATE; `kind` names the resource, `objectKind` the kind of the object a subresource takes.
function write(kind, operation, user, { object = null, oldObject = null, subResource = "",
  namespace = "", name, objectKind = kind } = {}) {
  const [group, version, resource] = RESOURCES[kind];
  const meta = (object ?? oldObject)?.metadata ?? {};
  return {
    request: admissionRequest({
      kind: { group, version, kind: objectKind },
      resource: { group, version, resource },
      subResource, operation, userInfo: user,
      name: name ?? meta.name ?? "", namespace: namespace || meta.namespace || "",
    }),
    object: operation === "DELETE" ? null : object,
    oldObject: operation === "CREATE" ? null : oldObject,
  };
}
const create = (kind, user, object, extra = {}) => write(kind, "CREATE", user, { object, ...extra });
const update = (kind, user, oldObject, object, extra = {}) =>
  write(kind, "UPDATE", user, { object, oldObject, ...extra });
const remove = (kind, user, oldObject, extra = {}) =>
  write(kind, "DELETE", user, { oldObject, ...extra });

// Every binding of the render on the write. No binding may error unless the case says so: an
// error is a denial for the wrong reason.
function decide(docs, w, c = cluster(), { errorsExpected = false } = {}) {
  const result = admitAll(docs, w, c);
  if (!errorsExpected) {
    for (const d of result.decisions) assert.deepEqual(d.errors, [], `${d.binding} errored`);
  }
  return result;
}
function assertAllowed(docs, w, what, c) {
  const result = decide(docs, w, c);
  recordCase({ source: import.meta.url, what, render: renderOf(docs), write: w,
    cluster: c ?? cluster(), allowed: true, result });
  const denied = result.decisions.filter((d) => !d.allowed).map((d) => d.denial);
  assert.equal(result.allowed, true, `${what}: ${denied.join("; ")}`);
}
function assertRefused(docs, w, policyName, pattern, what, c, options) {
  const result = decide(docs, w, c, options);
  recordCase({ source: import.meta.url, what, render: renderOf(docs), write: w,
    cluster: c ?? cluster(), allowed: false, policy: policyName, pattern, result });
  assert.equal(result.allowed, false, `${what}: allowed`);
  const denial = result.decisions.find((d) => !d.allowed && d.binding === policyName);
  assert.ok(denial, `${what}: refused, but not by ${policyName}: ` +
    result.decisions.filter((d) => !d.allowed).map((d) => d.denial).join("; "));
  assert.match(denial.denial, pattern, what);
}

// --- The evaluator itself -----------------------------------------------------------------

function toyPolicy(spec) {
  return { apiVersion: "admissionregistration.k8s.io/v1", kind: "ValidatingAdmissionPolicy",
    metadata: { name: "toy" }, spec: { failurePolicy: "Fail", ...spec,
      matchConstraints: spec.matchConstraints ?? { resourceRules: [{ apiGroups: [""],
        apiVersions: ["v1"], operations: ["*"], resources: ["configmaps", "configmaps/*"] }] } } };
}
const toyBinding = (spec = {}) => ({ metadata: { name: "toy-binding" },
  spec: { policyName: "toy", validationActions: ["Deny"], ...spec } });
const cm = (name, labels = {}, ns = "tenant-a") => ({ apiVersion: "v1", kind: "ConfigMap",
  metadata: { name, namespace: ns, labels } });
const refuseAll = [{ expression: "false", message: "refused" }];

test("harness: resourceRules match operation, group, version, resource, subresource, scope and names", () => {
  const rule = (fields) => toyPolicy({ validations: refuseAll, matchConstraints: {
    resourceRules: [{ apiGroups: [""], apiVersions: ["v1"], operations: ["CREATE"],
      resources: ["configmaps"], ...fields }] } });
  const w = create("ConfigMap", ADMIN, cm("x"));
  const c = cluster();
  assert.equal(admit(rule({}), w, { cluster: c }).allowed, false, "matches");
  assert.equal(admit(rule({ operations: ["UPDATE"] }), w, { cluster: c }).matched, false);
  assert.equal(admit(rule({ apiGroups: ["apps"] }), w, { cluster: c }).matched, false);
  assert.equal(admit(rule({ apiVersions: ["v2"] }), w, { cluster: c }).matched, false);
  assert.equal(admit(rule({ resources: ["secrets"] }), w, { cluster: c }).matched, false);
  assert.equal(admit(rule({ scope: "Cluster" }), w, { cluster: c }).matched, false);
  assert.equal(admit(rule({ scope: "Namespaced" }), w, { cluster: c }).matched, true);
  assert.equal(admit(rule({ resourceNames: ["y"] }), w, { cluster: c }).matched, false);
  assert.equal(admit(rule({ resourceNames: ["x"] }), w, { cluster: c }).matched, true);
  const sub = create("ConfigMap", ADMIN, cm("x"), { subResource: "status" });
  assert.equal(admit(rule({}), sub, { cluster: c }).matched, false, "'configmaps' is no subresource");
  assert.equal(admit(rule({ resources: ["configmaps/*"] }), sub, { cluster: c }).matched, true);
  assert.equal(admit(rule({ resources: ["*/status"] }), sub, { cluster: c }).matched, true);
  assert.equal(admit(rule({ resources: ["*"] }), sub, { cluster: c }).matched, false);
  assert.equal(admit(rule({ resources: ["*/*"] }), w, { cluster: c }).matched, true);
  // A Namespace is cluster-scoped although its request carries its name as namespace.
  const ns = write("ConfigMap", "CREATE", ADMIN, { object: namespace("n") });
  ns.request.resource = { group: "", version: "v1", resource: "namespaces" };
  ns.request.namespace = "n";
  assert.equal(admit(rule({ resources: ["namespaces"], scope: "Namespaced" }), ns,
    { cluster: c }).matched, false);
  assert.equal(admit(rule({ resources: ["namespaces"], scope: "Cluster" }), ns,
    { cluster: c }).matched, true);
});

test("harness: excludeResourceRules, namespaceSelector and objectSelector, of policy and binding", () => {
  const c = cluster();
  const policy = toyPolicy({ validations: refuseAll });
  const w = create("ConfigMap", ADMIN, cm("x", { team: "a" }));
  const excluded = toyPolicy({ validations: refuseAll, matchConstraints: {
    ...policy.spec.matchConstraints, excludeResourceRules: [{ apiGroups: [""],
      apiVersions: ["*"], operations: ["CREATE"], resources: ["configmaps"] }] } });
  assert.equal(admit(excluded, w, { cluster: c }).matched, false);
  const tenantOnly = toyBinding({ matchResources: { namespaceSelector: { matchExpressions:
    [{ key: TENANT_KEY, operator: "Exists" }] } } });
  assert.equal(admit(policy, w, { binding: tenantOnly, cluster: c }).allowed, false);
  const inCozy = create("ConfigMap", ADMIN, cm("x", {}, "cozy-system"));
  assert.equal(admit(policy, inCozy, { binding: tenantOnly, cluster: c }).matched, false);
  // An unknown namespace is a matching error: failurePolicy Fail denies.
  const nowhere = create("ConfigMap", ADMIN, cm("x", {}, "gone"));
  const lost = admit(policy, nowhere, { binding: tenantOnly, cluster: c });
  assert.equal(lost.allowed, false);
  assert.match(lost.errors.join(), /namespace gone not found/);
  // objectSelector: the object's or the old object's labels; a null object matches nothing.
  const teamA = toyBinding({ matchResources: { objectSelector: { matchLabels: { team: "a" } } } });
  assert.equal(admit(policy, w, { binding: teamA, cluster: c }).matched, true);
  const relabel = update("ConfigMap", ADMIN, cm("x", { team: "a" }), cm("x", { team: "b" }));
  assert.equal(admit(policy, relabel, { binding: teamA, cluster: c }).matched, true, "old matches");
  const other = create("ConfigMap", ADMIN, cm("x", { team: "b" }));
  assert.equal(admit(policy, other, { binding: teamA, cluster: c }).matched, false);
  const notB = toyBinding({ matchResources: { objectSelector: { matchExpressions:
    [{ key: "team", operator: "NotIn", values: ["b"] }] } } });
  assert.equal(admit(policy, other, { binding: notB, cluster: c }).matched, false);
  assert.equal(admit(policy, create("ConfigMap", ADMIN, cm("x")), { binding: notB, cluster: c })
    .matched, true, "NotIn matches an absent key");
  // The policy's own namespaceSelector counts too.
  const policyScoped = toyPolicy({ validations: refuseAll, matchConstraints: {
    ...policy.spec.matchConstraints, namespaceSelector: { matchLabels: { nope: "x" } } } });
  assert.equal(admit(policyScoped, w, { cluster: c }).matched, false);
});

test("harness: params through paramRef, parameterNotFoundAction and failurePolicy", () => {
  const policy = toyPolicy({ paramKind: { apiVersion: "v1", kind: "ConfigMap" },
    validations: [{ expression: "params.data.allowed == 'yes'", messageExpression:
      "'param ' + params.metadata.name + ' says no'" }] });
  const w = create("ConfigMap", ADMIN, cm("x"));
  const param = (name, allowed, labels = {}) => ({ apiVersion: "v1", kind: "ConfigMap",
    metadata: { name, namespace: "cozy-system", labels }, data: { allowed } });
  const named = (action) => toyBinding({ paramRef: { name: "p", namespace: "cozy-system",
    parameterNotFoundAction: action } });
  const withP = { namespaces: NAMESPACES, objects: [param("p", "yes")] };
  const without = { namespaces: NAMESPACES, objects: [] };
  assert.equal(admit(policy, w, { binding: named("Deny"), cluster: withP }).allowed, true);
  const denied = admit(policy, w, { binding: named("Deny"), cluster: without });
  assert.equal(denied.allowed, false);
  assert.match(denied.denial, /no params found/);
  assert.equal(admit(policy, w, { binding: named("Allow"), cluster: without }).allowed, true);
  const ignoring = structuredClone(policy);
  ignoring.spec.failurePolicy = "Ignore";
  assert.equal(admit(ignoring, w, { binding: named("Deny"), cluster: without }).allowed, true);
  // A param in another namespace is not it.
  const elsewhere = { namespaces: NAMESPACES, objects: [{ ...param("p", "yes"),
    metadata: { name: "p", namespace: "tenant-a" } }] };
  assert.equal(admit(policy, w, { binding: named("Deny"), cluster: elsewhere }).allowed, false);
  // A selector: once per parameter, any denial denies.
  const selected = toyBinding({ paramRef: { namespace: "cozy-system", selector: { matchLabels:
    { set: "1" } }, parameterNotFoundAction: "Deny" } });
  const two = { namespaces: NAMESPACES, objects: [param("p1", "yes", { set: "1" }),
    param("p2", "no", { set: "1" }), param("p3", "no")] };
  const once = admit(policy, w, { binding: selected, cluster: two });
  assert.equal(once.allowed, false);
  assert.deepEqual(once.messages, ["param p2 says no"]);
  // Without a namespace, a namespaced param is looked for in the request's namespace.
  const local = toyBinding({ paramRef: { name: "p", parameterNotFoundAction: "Deny" } });
  assert.equal(admit(policy, w, { binding: local, cluster: withP }).allowed, false);
  // A policy with paramKind and a binding without paramRef is misconfigured: Fail denies.
  assert.equal(admit(policy, w, { binding: toyBinding(), cluster: withP }).allowed, false);
});

test("harness: matchConditions, variables, messageExpression, failurePolicy, validationActions", () => {
  const c = cluster();
  const w = create("ConfigMap", ADMIN, cm("x"));
  const run = (spec, binding) => admit(toyPolicy(spec), w, { binding, cluster: c });
  assert.equal(run({ matchConditions: [{ name: "no", expression: "false" }],
    validations: refuseAll }).matched, false);
  // A false condition wins over an erroring one; an error alone denies under Fail.
  assert.equal(run({ matchConditions: [{ name: "e", expression: "object.nope" },
    { name: "no", expression: "false" }], validations: refuseAll }).matched, false);
  assert.equal(run({ matchConditions: [{ name: "e", expression: "object.nope" }],
    validations: [] }).allowed, false);
  assert.equal(run({ failurePolicy: "Ignore", matchConditions: [{ name: "e",
    expression: "object.nope" }], validations: refuseAll }).allowed, true);
  // An erroring validation denies under Fail, is skipped under Ignore; a non-bool is an error.
  assert.equal(run({ validations: [{ expression: "object.nope == 1" }] }).allowed, false);
  assert.equal(run({ validations: [{ expression: "'a'" }] }).allowed, false);
  assert.equal(run({ failurePolicy: "Ignore",
    validations: [{ expression: "object.nope == 1" }] }).allowed, true);
  // Variables: in order, one may use another; an erroring one matters only where used.
  assert.equal(run({ variables: [{ name: "a", expression: "object.metadata.name" },
    { name: "b", expression: "variables.a + '!'" }, { name: "bad", expression: "object.nope" }],
  validations: [{ expression: "variables.b == 'x!'" }] }).allowed, true);
  const used = run({ variables: [{ name: "bad", expression: "object.nope" }],
    validations: [{ expression: "variables.bad == 1" }] });
  assert.equal(used.allowed, false);
  assert.match(used.errors.join(), /bad/);
  // messageExpression: its string, else message, else the expression.
  const msg = (v) => run({ validations: [{ expression: "false", ...v }] }).messages[0];
  assert.equal(msg({ message: "m", messageExpression: "'e ' + object.metadata.name" }), "e x");
  assert.equal(msg({ message: "m", messageExpression: "' '" }), "m");
  assert.equal(msg({ message: "m", messageExpression: "'a\\nb'" }), "m");
  assert.equal(msg({ message: "m", messageExpression: "object.nope" }), "m");
  assert.equal(msg({}), "failed expression: false");
  // object and oldObject are null where the API server passes null.
  assert.equal(admit(toyPolicy({ validations: [{ expression: "oldObject == null && object != null" }] }),
    w, { cluster: c }).allowed, true);
  assert.equal(admit(toyPolicy({ validations: [{ expression: "object == null && oldObject != null" }] }),
    remove("ConfigMap", ADMIN, cm("x")), { cluster: c }).allowed, true);
  // namespaceObject is the request's namespace; request.userInfo carries extra.
  assert.equal(run({ validations: [{ expression:
    `namespaceObject.metadata.name == 'tenant-a' && '${TENANT_KEY}' in namespaceObject.metadata.labels` }] })
    .allowed, true);
  // Without paramKind, params is null; request carries userInfo.extra and dryRun.
  const withExtra = create("ConfigMap", { username: "u", extra: { "x/y": ["v"] } }, cm("x"));
  withExtra.request.dryRun = true;
  assert.equal(admit(toyPolicy({ validations: [{ expression: "params == null && " +
    "request.userInfo.extra['x/y'][0] == 'v' && request.dryRun && request.operation == 'CREATE' " +
    "&& !has(request.subResource)" }] }), withExtra, { cluster: c }).allowed, true);
  // Warn: not denied, warned.
  const warned = run({ validations: refuseAll }, toyBinding({ validationActions: ["Warn"] }));
  assert.deepEqual([warned.allowed, warned.warnings], [true, ["refused"]]);
});

// --- H6: the oldest supported minor ----------------------------------------------------------

test("H6: the chart pins the oldest Kubernetes minor the CEL check uses", () => {
  assert.equal(CHART_YAML.kubeVersion, `>=1.${OLDEST_MINOR}.0-0`);
});

test("H6: every expression of the rendered chart compiles for the oldest supported minor", () => {
  for (const [label, docs] of RENDERS) {
    const policies = docs.filter((d) => d.kind === "ValidatingAdmissionPolicy");
    assert.ok(policies.length >= 5, label);
    for (const policy of policies) {
      for (const { where, expression } of policyExpressions(policy)) {
        assert.deepEqual(checkExpression(expression, OLDEST_MINOR), [], `${label}: ${where}`);
      }
    }
  }
});

test("H6: a copy of a chart policy using a too-new CEL function fails the old-minor check", () => {
  const check = (policy) => policyExpressions(policy)
    .flatMap(({ expression }) => checkExpression(expression, OLDEST_MINOR));
  const copy = structuredClone(byName(ON, "ValidatingAdmissionPolicy", "gpu-raw-names-pod"));
  assert.deepEqual(check(copy), []);
  // semver (1.33), the format library (1.31), a two-variable comprehension (1.32).
  for (const [expression, pattern] of [
    ["params.data.resourceNames.isSemver()", /isSemver needs Kubernetes 1.33/],
    ["format.dns1123Label().validate(object.metadata.name) == optional.none()", /1.31/],
    ["object.metadata.labels.all(k, v, v != '')", /all\/2 needs Kubernetes 1.32/],
    ["object.metadata.name.reverse() == ''", /reverse is unknown/],
  ]) {
    const tooNew = structuredClone(copy);
    tooNew.spec.validations.push({ expression });
    assert.match(check(tooNew).join("; "), pattern, expression);
  }
  // ... while what 1.30 has passes, and fails a check for 1.29 where it is newer.
  assert.deepEqual(checkExpression("isCIDR('10.0.0.0/8') && quantity('1Gi').isInteger()"), []);
  assert.match(checkExpression("isCIDR('10.0.0.0/8')", 29).join(), /needs Kubernetes 1.30/);
});

// --- F1, F2 through every binding ------------------------------------------------------------

test("F1 F2: the node-bound policy through every binding of both renders", () => {
  const node = (name) => ({ apiVersion: "gpu.cozystack.io/v1alpha1", kind: "GPUNode",
    metadata: { name, ownerReferences: [{ apiVersion: "v1", kind: "Node", name, uid: "u" }] },
    status: {} });
  const agent = (nodeName) => ({ ...sa(RELEASE_NS, "gpu-agent"),
    extra: nodeName ? { "authentication.kubernetes.io/node-name": [nodeName] } : {} });
  for (const [label, docs] of RENDERS) {
    assertAllowed(docs, update("GPUNode", agent("n1"), node("n1"), node("n1"),
      { subResource: "status" }), `${label}: own node`);
    assertRefused(docs, update("GPUNode", agent("n1"), node("n2"), node("n2"),
      { subResource: "status" }), "gpu-agent-own-gpunode", /may write only GPUNode n1/,
    `${label}: other node`);
    assertRefused(docs, update("GPUNode", agent(undefined), node("n1"), node("n1"),
      { subResource: "status" }), "gpu-agent-own-gpunode", /carry no node name/,
    `${label}: no extra`);
    assertAllowed(docs, update("GPUNode", ADMIN, node("n2"), node("n2")), `${label}: admin`);
  }
});

// --- F19: the agent's ResourceSlices, node-bound as its GPUNode ---------------------------------

const SLICE_POLICY = "gpu-agent-own-resourceslices";
// A ResourceSlice as gpu-agent publishes it (agent/status/resource_slice.cpp).
function resourceSlice(node, { driver = "gpu.cozystack.io", owners, nodeName = node } = {}) {
  return { apiVersion: "resource.k8s.io/v1", kind: "ResourceSlice",
    metadata: { name: `${node}-gpu.cozystack.io`, ownerReferences: owners ??
      [{ apiVersion: "v1", kind: "Node", name: node, uid: "u", controller: true }] },
    spec: { driver, nodeName, pool: { name: node, generation: 1, resourceSliceCount: 1 },
      devices: [{ name: "pci-0000-3b-00-0",
        attributes: { "resource.kubernetes.io/pciBusID": { string: "0000:3b:00.0" },
          id: { string: `${node}/0000:3b:00.0` } },
        taints: [{ key: "gpu.cozystack.io/catalog", effect: "NoSchedule" }] }] } };
}
const podAgentOn = (nodeName) => ({ ...sa(RELEASE_NS, "gpu-agent"),
  extra: nodeName ? { "authentication.kubernetes.io/node-name": [nodeName] } : {} });
const bareMetalAgentOn = (nodeName) => ({ username: `gpu.cozystack.io:agent:${nodeName}`,
  groups: ["gpu.cozystack.io:agents", "system:authenticated"] });

test("F19: the slice policy renders only with agent.resourceSlices on, and denies failing closed", () => {
  assert.equal(byName(OFF, "ValidatingAdmissionPolicy", SLICE_POLICY), undefined);
  const policy = byName(ON, "ValidatingAdmissionPolicy", SLICE_POLICY);
  assert.equal(policy.spec.failurePolicy, "Fail");
  const binding = ON.find((d) => d.kind === "ValidatingAdmissionPolicyBinding" &&
    d.spec.policyName === SLICE_POLICY);
  assert.deepEqual(binding.spec.validationActions, ["Deny"]);
  // Its caller and node are the GPUNode policy's, written once (charts/gpu/templates/_helpers.tpl).
  const nodePolicy = byName(ON, "ValidatingAdmissionPolicy", "gpu-agent-own-gpunode");
  assert.deepEqual(policy.spec.matchConditions, nodePolicy.spec.matchConditions);
  assert.deepEqual(policy.spec.variables, nodePolicy.spec.variables);
});

test("F19: the agent publishes and updates only its own node's ResourceSlice", () => {
  for (const [who, agent] of [["pod", podAgentOn], ["bare metal", bareMetalAgentOn]]) {
    assertAllowed(ON, create("ResourceSlice", agent("n1"), resourceSlice("n1")),
      `${who}: creates its own node's slice`);
    assertAllowed(ON, update("ResourceSlice", agent("n1"), resourceSlice("n1"),
      resourceSlice("n1")), `${who}: updates it`);
    assertRefused(ON, create("ResourceSlice", agent("n1"), resourceSlice("n2")), SLICE_POLICY,
      /gpu-agent on node n1 may publish only ResourceSlices whose spec.nodeName is n1/,
      `${who}: creates another node's slice`);
    assertRefused(ON, update("ResourceSlice", agent("n1"), resourceSlice("n2"),
      resourceSlice("n2")), SLICE_POLICY, /may publish only ResourceSlices whose spec.nodeName is n1/,
    `${who}: updates another node's slice`);
    assertRefused(ON, remove("ResourceSlice", agent("n1"), resourceSlice("n2")), SLICE_POLICY,
      /may change only the ResourceSlices of node n1/, `${who}: deletes another node's slice`);
  }
});

test("F19: no node name, another driver, a slice for all nodes or without its Node owner are refused", () => {
  assertRefused(ON, create("ResourceSlice", podAgentOn(undefined), resourceSlice("n1")),
    SLICE_POLICY, /carry no node name/, "a token bound to no node");
  assertRefused(ON, create("ResourceSlice", podAgentOn("n1"),
    resourceSlice("n1", { driver: "gpu.nvidia.com" })), SLICE_POLICY,
  /only ResourceSlices of driver gpu.cozystack.io/, "another driver's slice");
  const everywhere = resourceSlice("n1");
  delete everywhere.spec.nodeName;
  everywhere.spec.allNodes = true;
  assertRefused(ON, create("ResourceSlice", podAgentOn("n1"), everywhere), SLICE_POLICY,
    /spec.nodeName is n1/, "a slice for all nodes");
  assertRefused(ON, create("ResourceSlice", podAgentOn("n1"), resourceSlice("n1", { owners:
    [{ apiVersion: "v1", kind: "Node", name: "n2", uid: "u" }] })), SLICE_POLICY,
  /exactly one owner reference, to the v1 Node n1/, "owned by another Node");
  // Other callers are not the agent: the policy does not speak for them (RBAC does).
  assertAllowed(ON, create("ResourceSlice", ADMIN, resourceSlice("n2", { driver: "gpu.nvidia.com" })),
    "the cluster admin");
  assertAllowed(ON, create("ResourceSlice", sa("kube-system", "nvidia-dra-driver"),
    resourceSlice("n2", { driver: "gpu.nvidia.com" })), "another driver's own account");
});

// --- F20: only the controller's claims tolerate the catalog's taint ---------------------------

const CATALOG_TAINT = "gpu.cozystack.io/catalog";
// A claim (or, `template`, a claim template) in tenant-a with one request of `request`'s shape.
function claim(name, request, { template = false } = {}) {
  const spec = { devices: { requests: [{ name: "gpu", ...request }] } };
  return template
    ? { apiVersion: "resource.k8s.io/v1", kind: "ResourceClaimTemplate",
      metadata: { name, namespace: "tenant-a" }, spec: { spec } }
    : { apiVersion: "resource.k8s.io/v1", kind: "ResourceClaim",
      metadata: { name, namespace: "tenant-a" }, spec };
}
const exactly = (tolerations) => ({ exactly: { deviceClassName: "gpu", ...(tolerations ?
  { tolerations } : {}) } });
const CATALOG = [{ key: CATALOG_TAINT, operator: "Exists", effect: "NoSchedule" }];
const EVERY_TAINT = [{ operator: "Exists" }];
const RESOURCE_CLAIM_CONTROLLER = sa("kube-system", "resource-claim-controller");

test("F20: a request may tolerate the catalog's taint only in the controller's claims", () => {
  const refused = /only gpu-controller .* may write a claim that tolerates the taint gpu.cozystack.io\/catalog/;
  for (const [who, user] of [["tenant", TENANT], ["tenant's service account", TENANT_SA]]) {
    assertRefused(ON, create("ResourceClaim", user, claim("c", exactly(CATALOG))),
      "gpu-catalog-claims", refused, `${who}: the catalog's key`);
    assertRefused(ON, create("ResourceClaim", user, claim("c", exactly(EVERY_TAINT))),
      "gpu-catalog-claims", refused, `${who}: every taint`);
    assertRefused(ON, create("ResourceClaim", user, claim("c", { firstAvailable: [
      { name: "small", deviceClassName: "gpu" },
      { name: "catalog", deviceClassName: "gpu", tolerations: CATALOG }] })),
    "gpu-catalog-claims", refused, `${who}: an alternative of a prioritized list`);
    assertRefused(ON, create("ResourceClaimTemplate", user,
      claim("t", exactly(CATALOG), { template: true })), "gpu-catalog-claim-templates", refused,
    `${who}: a template`);
    assertAllowed(ON, create("ResourceClaim", user, claim("c", exactly())),
      `${who}: a claim of its own, no toleration`);
    assertAllowed(ON, create("ResourceClaim", user, claim("c", exactly([{ key: "example.com/x",
      operator: "Exists", effect: "NoSchedule" }]))), `${who}: another taint's toleration`);
  }
  assertAllowed(ON, create("ResourceClaim", CONTROLLER, claim("c", exactly(CATALOG))),
    "the controller");
  // kube-scheduler adds its finalizer to the claim it allocates: an update, never matched (the
  // spec is immutable, so a toleration is only ever written at create).
  assertAllowed(ON, update("ResourceClaim", { username: "system:kube-scheduler",
    groups: ["system:authenticated"] }, claim("c", exactly(CATALOG)),
  claim("c", exactly(CATALOG))), "kube-scheduler's update of a catalog claim");
  assertAllowed(ON, create("ResourceClaim", ADMIN, claim("c", exactly(CATALOG))), "a cluster admin");
  // kube-controller-manager makes a pod's claims from its templates, which the policy guards.
  assertAllowed(ON, create("ResourceClaim", RESOURCE_CLAIM_CONTROLLER, claim("c", exactly(CATALOG))),
    "the resource-claim controller's claim");
  assertRefused(ON, create("ResourceClaimTemplate", RESOURCE_CLAIM_CONTROLLER,
    claim("t", exactly(CATALOG), { template: true })), "gpu-catalog-claim-templates", refused,
  "the resource-claim controller's template");
  assert.equal(byName(OFF, "ValidatingAdmissionPolicy", "gpu-catalog-claims"), undefined);
});

test("F20: a claim may name a catalog's DeviceClass only when the controller writes it", () => {
  const refused = /only gpu-controller .* may write a claim of a DeviceClass of the GPU catalog .*: order the GPU as a GPUDevice of its GPUClass/;
  const catalogClass = { exactly: { deviceClassName: "a100-dra.gpu.cozystack.io" } };
  for (const [who, user] of [["tenant", TENANT], ["tenant's service account", TENANT_SA]]) {
    assertRefused(ON, create("ResourceClaim", user, claim("c", catalogClass)),
      "gpu-catalog-claims", refused, `${who}: an exact request, no toleration`);
    assertRefused(ON, create("ResourceClaim", user, claim("c", { firstAvailable: [
      { name: "other", deviceClassName: "gpu.example.com" },
      { name: "catalog", deviceClassName: "a100-dra.gpu.cozystack.io" }] })),
    "gpu-catalog-claims", refused, `${who}: an alternative of a prioritized list`);
    assertRefused(ON, create("ResourceClaimTemplate", user,
      claim("t", catalogClass, { template: true })), "gpu-catalog-claim-templates", refused,
    `${who}: a template`);
    // Another driver's class, even one whose name ends like the group without its dot.
    assertAllowed(ON, create("ResourceClaim", user, claim("c", { exactly: {
      deviceClassName: "gpu.nvidia.com" } })), `${who}: another driver's class`);
    assertAllowed(ON, create("ResourceClaim", user, claim("c", { exactly: {
      deviceClassName: "notgpu.cozystack.io" } })), `${who}: a class named like the group`);
  }
  assertAllowed(ON, create("ResourceClaim", CONTROLLER, claim("c", catalogClass)), "the controller");
  assertAllowed(ON, create("ResourceClaim", ADMIN, claim("c", catalogClass)), "a cluster admin");
});

// --- F3-F5, F17: the class policies ----------------------------------------------------------

test("F17: the class policies render only with GPUs on; the others either way", () => {
  const classPolicies = ["gpu-class-deleting-no-orders", "gpu-class-immutable"];
  const always = ["gpu-agent-own-gpunode", "gpu-device-platform-fields",
    "gpu-device-status-writer", "gpu-raw-names-pod", "gpu-raw-names-vmi",
    "gpu-tenant-namespace-label", "gpu-usage-monitor-label"];
  assert.deepEqual(policyNames(OFF), always);
  // (gpu-on-values.yaml also turns agent.resourceSlices on: F19's policy.)
  assert.deepEqual(policyNames(ON), [...always, ...classPolicies, "gpu-agent-own-resourceslices",
    "gpu-catalog-claim-templates", "gpu-catalog-claims"].sort());
  for (const name of classPolicies) {
    assert.equal(OFF.some((d) => d.kind === "ValidatingAdmissionPolicyBinding" &&
      d.spec.policyName === name), false, name);
  }
  // With GPUs off nothing stops a class change (no policy, hence F3's refusal is GPU-on only).
  assertAllowed(OFF, update("GPUClass", ADMIN, gpuClass("a100"),
    gpuClass("a100", { spec: { model: "H100" } })), "off: model change");
});

test("F3: with the class finalizer, what a class sells is immutable", () => {
  const old = gpuClass("a100");
  for (const [field, value] of [["vendor", "amd"], ["model", "H100"], ["mode", "vgpu"],
    ["profile", "A100-4C"], ["memory", "40Gi"], ["maxCount", 8]]) {
    assertRefused(ON, update("GPUClass", ADMIN, old, gpuClass("a100", { spec: { [field]: value } })),
      "gpu-class-immutable", new RegExp(`${field} is immutable`), field);
  }
  const noMaxCount = gpuClass("a100");
  delete noMaxCount.spec.maxCount;
  assertRefused(ON, update("GPUClass", ADMIN, old, noMaxCount), "gpu-class-immutable",
    /maxCount is immutable/, "maxCount unset");
  assertRefused(ON, update("GPUClass", ADMIN, old, gpuClass("a100", { spec: { source:
    { dra: { pciVendorSelector: "10DE:20B5" } } } })), "gpu-class-immutable",
  /kind of source is immutable/, "source kind");
  // A dra class's selector names the model it sells: fixed as vendor and model are.
  const dra = gpuClass("a100-dra", { spec: { source: { dra: { pciVendorSelector: "10DE:20B5" } } } });
  assertRefused(ON, update("GPUClass", ADMIN, dra, gpuClass("a100-dra", { spec: { source:
    { dra: { pciVendorSelector: "10DE:20B7" } } } })), "gpu-class-immutable",
  /pciVendorSelector is immutable/, "dra selector");
  assertRefused(ON, update("GPUClass", ADMIN, dra, gpuClass("a100-dra")), "gpu-class-immutable",
    /kind of source is immutable/, "dra to devicePlugin");
  assertAllowed(ON, update("GPUClass", ADMIN, dra, gpuClass("a100-dra", { spec: {
    source: { dra: { pciVendorSelector: "10DE:20B5" } }, onCordon: "Stay" } })), "dra, onCordon");
});

test("F3: resourceName and nodeSelector stay open; without the finalizer everything is", () => {
  const old = gpuClass("a100");
  assertAllowed(ON, update("GPUClass", ADMIN, old, gpuClass("a100", { spec: { source:
    { devicePlugin: { resourceName: "nvidia.com/A100_SXM4_80GB" } } } })), "resourceName");
  assertAllowed(ON, update("GPUClass", ADMIN, old, gpuClass("a100", { spec: { nodeSelector:
    { matchLabels: { gpu: "a100-new" } } } })), "nodeSelector");
  assertAllowed(ON, update("GPUClass", ADMIN, old, gpuClass("a100", { spec: { onCordon: "Stay" } })),
    "onCordon");
  const bare = gpuClass("a100", { finalizers: [] });
  assertAllowed(ON, update("GPUClass", ADMIN, bare, gpuClass("a100", { finalizers: [],
    spec: { model: "H100", memory: "40Gi", mode: "vgpu" } })), "no finalizer: model");
  const none = gpuClass("a100");
  delete none.metadata.finalizers;
  assertAllowed(ON, update("GPUClass", ADMIN, none, gpuClass("a100", { spec: { vendor: "amd" } })),
    "no finalizers field");
});

test("F4: the finalizer is read from the stored object: dropping it cannot change the spec", () => {
  const old = gpuClass("a100");
  assertRefused(ON, update("GPUClass", ADMIN, old, gpuClass("a100", { finalizers: [],
    spec: { memory: "40Gi" } })), "gpu-class-immutable", /memory is immutable/,
  "drop finalizer and change memory at once");
  assertAllowed(ON, update("GPUClass", COZY_SA, old, gpuClass("a100", { finalizers: [] })),
    "drop the finalizer alone");
  // Adding the finalizer in the same write as a change: the stored class had none.
  assertAllowed(ON, update("GPUClass", COZY_SA, gpuClass("a100", { finalizers: [] }),
    gpuClass("a100", { spec: { model: "H100" } })), "add finalizer and change");
});

test("F5: a deleting class takes no new orders; other classes do", () => {
  const order = (className) => ({ apiVersion: "gpu.cozystack.io/v1alpha1", kind: "GPUDevice",
    metadata: { name: "d1", namespace: "tenant-a" }, spec: { className, count: 1 } });
  const classes = cluster({ objects: [settings(), gpuClass("a100", { deleting: true }),
    gpuClass("l40s")] });
  assertRefused(ON, create("GPUDevice", TENANT, order("a100")), "gpu-class-deleting-no-orders",
    /GPUClass a100 is being deleted: it takes no new orders/, "deleting class", classes);
  assertRefused(ON, create("GPUDevice", ADMIN, order("a100")), "gpu-class-deleting-no-orders",
    /a100 is being deleted/, "an admin too", classes);
  assertAllowed(ON, create("GPUDevice", TENANT, order("l40s")), "other class", classes);
  assertAllowed(ON, create("GPUDevice", TENANT, order("h100")), "unknown class (the webhook's)",
    classes);
  assertAllowed(ON, create("GPUDevice", TENANT, order("a100")), "no class at all", cluster());
  // Evaluated once per class: every class is a parameter of the one binding.
  const binding = byName(ON, "ValidatingAdmissionPolicyBinding", "gpu-class-deleting-no-orders");
  assert.deepEqual(binding.spec.paramRef, { selector: {}, parameterNotFoundAction: "Allow" });
  assertAllowed(OFF, create("GPUDevice", TENANT, order("a100")), "GPUs off: absent", classes);
});

// docs/policies.md, "After kube-apiserver restarts": a restarted API server resolves GPUClass, a
// CRD, some seconds after it is ready. The one policy whose parameter kind is ours fails open
// meanwhile, so no tenant's order is refused for it; a policy of a built-in parameter kind, always
// resolved, fails closed. Not recorded for the real server, where GPUClass is resolved
// (real_cluster_apiserver_restart_test restarts kube-apiserver instead).
test("F5: while GPUClass is unresolved after a restart, orders are not refused for it", () => {
  const order = (className) => ({ apiVersion: "gpu.cozystack.io/v1alpha1", kind: "GPUDevice",
    metadata: { name: "d1", namespace: "tenant-a" }, spec: { className, count: 1 } });
  const unresolved = { ...cluster({ objects: [settings(), gpuClass("l40s")] }),
    unresolvedKinds: ["gpu.cozystack.io/v1alpha1/GPUClass"] };
  const result = decide(ON, create("GPUDevice", TENANT, order("l40s")), unresolved,
    { errorsExpected: true });
  assert.equal(result.allowed, true, result.decisions.map((d) => d.denial).join("; "));
  const errored = result.decisions.filter((d) => d.errors.length > 0);
  assert.deepEqual(errored.map((d) => d.binding), ["gpu-class-deleting-no-orders"]);
  assert.match(errored[0].errors[0], /failed to configure policy: failed to find resource referenced by paramKind: 'gpu.cozystack.io\/v1alpha1, Kind=GPUClass'/);
  // Which policies fail open: exactly those whose parameter kind is not built in.
  for (const [label, docs] of RENDERS) {
    for (const policy of docs.filter((d) => d.kind === "ValidatingAdmissionPolicy")) {
      const crdParam = policy.spec.paramKind !== undefined &&
        policy.spec.paramKind.apiVersion.includes(".");
      assert.equal(policy.spec.failurePolicy, crdParam ? "Ignore" : "Fail",
        `${label}: ${policy.metadata.name}`);
    }
  }
  // Under Fail, the same moment refuses every order: what the chart had.
  const failing = ON.map((d) => d.kind === "ValidatingAdmissionPolicy" &&
    d.metadata.name === "gpu-class-deleting-no-orders"
    ? { ...d, spec: { ...d.spec, failurePolicy: "Fail" } } : d);
  assert.equal(decide(failing, create("GPUDevice", TENANT, order("l40s")), unresolved,
    { errorsExpected: true }).allowed, false);
});

// --- F6-F8: platform fields of a device ---------------------------------------------------------

function device({ finalizers, mark, labels = {} } = {}) {
  const metadata = { name: "d1", namespace: "tenant-a", labels: { ...labels } };
  if (finalizers) metadata.finalizers = finalizers;
  if (mark !== undefined) metadata.labels[TEMPLATE_MARK] = mark;
  return { apiVersion: "gpu.cozystack.io/v1alpha1", kind: "GPUDevice", metadata,
    spec: { className: "a100", count: 1 } };
}

test("F6: a tenant may not drop the device finalizer or set the template mark", () => {
  for (const [label, docs] of RENDERS) {
    const held = device({ finalizers: [DEVICE_FINALIZER] });
    for (const user of [TENANT, TENANT_SA]) {
      assertRefused(docs, update("GPUDevice", user, held, device({ finalizers: [] })),
        "gpu-device-platform-fields", /may remove the finalizer gpu.cozystack.io\/device-protection/,
        `${label}: ${user.username} drops the finalizer`);
      assertRefused(docs, create("GPUDevice", user, device({ mark: "true" })),
        "gpu-device-platform-fields", /template-device/, `${label}: order with the mark`);
      assertRefused(docs, update("GPUDevice", user, held, device({ finalizers: [DEVICE_FINALIZER],
        mark: "true" })), "gpu-device-platform-fields", /template-device/, `${label}: sets the mark`);
      assertRefused(docs, update("GPUDevice", user, device({ mark: "true" }), device()),
        "gpu-device-platform-fields", /template-device/, `${label}: removes the mark`);
      assertRefused(docs, create("GPUDevice", user, device({ finalizers: [DEVICE_FINALIZER] })),
        "gpu-device-platform-fields", /may add the finalizer/, `${label}: adds the finalizer`);
      // What is not the platform's stays the tenant's.
      assertAllowed(docs, create("GPUDevice", user, device({ labels: { app: "x" } })),
        `${label}: plain order`);
      assertAllowed(docs, update("GPUDevice", user, held, device({ finalizers: [DEVICE_FINALIZER],
        labels: { app: "y" } })), `${label}: other labels`);
      // Through a subresource the same fields are as guarded. (On a real API server a custom
      // resource's /status write keeps the stored metadata, so there the status-writer policy,
      // B2, is the one that refuses it.)
      assertRefused(docs, update("GPUDevice", user, held, device({ finalizers: [] }),
        { subResource: "status" }), "gpu-device-platform-fields", /finalizer/,
      `${label}: through status`);
    }
  }
});

// F7: the controller is trusted by its exact user name in whatever namespace the chart is
// installed (here RELEASE_NS, not cozy-system), and no other service account of that namespace
// or of cozy-system is. gpu-on-values.yaml adds the hoster's extra callers (policies.platformUsers
// and platformGroups), which only that render trusts.
const OPERATOR = { username: "ops-bot", groups: ["cozy-operators", "system:authenticated"] };
test("F7: platform callers may drop the finalizer and set the mark", () => {
  const held = device({ finalizers: [DEVICE_FINALIZER] });
  for (const [label, docs] of RENDERS) {
    const extras = docs === ON ? [COZY_SA, OPERATOR] : [];
    for (const user of [CONTROLLER, ADMIN, KCM, ...extras,
      { username: CONTROLLER.username }]) {
      assertAllowed(docs, update("GPUDevice", user, held, device({ finalizers: [] })),
        `${label}: ${user.username} drops the finalizer`);
      assertAllowed(docs, create("GPUDevice", user, device({ finalizers: [DEVICE_FINALIZER],
        mark: "true" })), `${label}: ${user.username} creates a marked device`);
    }
    // Not platform: another service account of the release's namespace, the controller's name
    // in another namespace (cozy-system, where the chart is not), cozy-system's other service
    // accounts without the hoster's value, a user named like one without its group, the
    // kube-controller-manager's name with a suffix, the controller's name with a suffix, and a
    // service account of kube-system: named identities only, no namespace's whole group.
    const notExtras = docs === ON ? [] : [COZY_SA, OPERATOR];
    for (const user of [sa(RELEASE_NS, "default"), sa(RELEASE_NS, "gpu-agent"), KUBE_SYSTEM_SA,
      sa("kube-system", "hoster-made-this"),
      sa("cozy-system", "gpu-controller"), ...notExtras, sa("cozy-public", "x"),
      { username: "system:serviceaccount:cozy-system:x" },
      { username: "system:kube-controller-manager-x", groups: ["system:authenticated"] },
      { username: `${CONTROLLER.username}-x`, groups: CONTROLLER.groups }]) {
      assertRefused(docs, update("GPUDevice", user, held, device({ finalizers: [] })),
        "gpu-device-platform-fields", /finalizer/, `${label}: ${user.username}`);
      assertRefused(docs, create("GPUDevice", user, device({ mark: "true" })),
        "gpu-device-platform-fields", /template-device/, `${label}: ${user.username} marks`);
    }
  }
});

test("F8: the orphan and foregroundDeletion finalizers stay free", () => {
  const held = device({ finalizers: [DEVICE_FINALIZER] });
  for (const [label, docs] of RENDERS) {
    // A foreground delete: DELETE is not matched; the API server's own update adding
    // foregroundDeletion, or a tenant adding orphan or foregroundDeletion, is allowed.
    assertAllowed(docs, remove("GPUDevice", TENANT, held), `${label}: tenant delete`);
    assertAllowed(docs, update("GPUDevice", TENANT, held, device({ finalizers:
      [DEVICE_FINALIZER, "foregroundDeletion"] })), `${label}: foregroundDeletion added`);
    assertAllowed(docs, update("GPUDevice", TENANT, held, device({ finalizers:
      [DEVICE_FINALIZER, "orphan"] })), `${label}: orphan added`);
    assertAllowed(docs, update("GPUDevice", TENANT, device({ finalizers:
      [DEVICE_FINALIZER, "foregroundDeletion"] }), held), `${label}: foregroundDeletion dropped`);
  }
});

// --- B2: a device's status is the controller's ------------------------------------------------

test("B2: only the controller (and cluster admins) may write a GPUDevice's status", () => {
  const stored = device({ finalizers: [DEVICE_FINALIZER] });
  const bound = (nodeName) => ({ ...device({ finalizers: [DEVICE_FINALIZER] }),
    status: { phase: "Bound", nodeName } });
  const why = new RegExp(`only gpu-controller \\(${CONTROLLER.username}\\) may write the ` +
    "status of a GPUDevice");
  for (const [label, docs] of RENDERS) {
    for (const user of [CONTROLLER, ADMIN]) {
      assertAllowed(docs, update("GPUDevice", user, stored, bound("n1"), { subResource: "status" }),
        `${label}: ${user.username} binds`);
    }
    // Whatever RBAC lets them send it: tenants, other service accounts of the release's
    // namespace (the agent's among them), the same name elsewhere, the platform-fields policy's
    // other trusted callers, the hoster's extra ones.
    for (const user of [TENANT, TENANT_SA, sa(RELEASE_NS, "default"), sa(RELEASE_NS, "gpu-agent"),
      sa("cozy-system", "gpu-controller"), COZY_SA, OPERATOR, KUBE_SYSTEM_SA, KCM,
      { username: `${CONTROLLER.username}-x`, groups: CONTROLLER.groups }]) {
      assertRefused(docs, update("GPUDevice", user, bound("n1"), bound("n2"),
        { subResource: "status" }), "gpu-device-status-writer", why,
      `${label}: ${user.username} moves a bound device`);
    }
    // The main resource is not the policy's: a tenant's own order stays theirs.
    assertAllowed(docs, update("GPUDevice", TENANT, stored, device({ finalizers: [DEVICE_FINALIZER],
      labels: { app: "x" } })), `${label}: tenant labels its order`);
    const policy = byName(docs, "ValidatingAdmissionPolicy", "gpu-device-status-writer");
    assert.equal(policy.spec.failurePolicy, "Fail", label);
    assert.deepEqual(byName(docs, "ValidatingAdmissionPolicyBinding", "gpu-device-status-writer")
      .spec.validationActions, ["Deny"], label);
  }
});

// --- F9-F12: the usage-monitor label ---------------------------------------------------------

const labelled = (value = "x") => ({ [USAGE_KEY]: value });
function obj(kind, { labels, name = "o1", ns = "tenant-a", finalizers } = {}) {
  const metadata = { name, namespace: ns };
  if (labels) metadata.labels = labels;
  if (finalizers) metadata.finalizers = finalizers;
  const o = { apiVersion: RESOURCES[kind][0] ? `${RESOURCES[kind][0]}/${RESOURCES[kind][1]}` : "v1",
    kind, metadata };
  if (kind === "Pod") o.spec = { containers: [{ name: "c", image: "x" }] };
  return o;
}

test("F9: adding the usage-monitor key in a tenant namespace is refused for every caller", () => {
  const why = /gpu.cozystack.io\/usage-monitor is reserved/;
  for (const [label, docs] of RENDERS) {
    for (const user of [ADMIN, COZY_SA, TENANT, KUBEVIRT_CONTROLLER]) {
      for (const kind of ["ConfigMap", "Pod", "DataVolume", "Deployment"]) {
        assertRefused(docs, create(kind, user, obj(kind, { labels: labelled() })),
          "gpu-usage-monitor-label", why, `${label}: ${user.username} creates a ${kind}`);
      }
      assertRefused(docs, update("ConfigMap", user, obj("ConfigMap", { labels: { a: "b" } }),
        obj("ConfigMap", { labels: { a: "b", ...labelled("") } })), "gpu-usage-monitor-label",
      why, `${label}: ${user.username} adds it, empty value`);
    }
    // Through a subresource (a pod's status carries the pod's metadata).
    assertRefused(docs, update("Pod", ADMIN, obj("Pod"), obj("Pod", { labels: labelled() }),
      { subResource: "status" }), "gpu-usage-monitor-label", why, `${label}: pods/status`);
    // Outside tenant namespaces the key is not the policy's business.
    for (const ns of ["cozy-system", RELEASE_NS, "default"]) {
      assertAllowed(docs, create("ConfigMap", ADMIN, obj("ConfigMap", { ns, labels: labelled() })),
        `${label}: in ${ns}`);
    }
  }
});

test("F10: the ratchet: an object with the key may change, lose finalizers and the key, not its value", () => {
  const had = obj("ConfigMap", { labels: { ...labelled("v1"), a: "1" }, finalizers: ["x/y"] });
  for (const [label, docs] of RENDERS) {
    assertAllowed(docs, update("ConfigMap", TENANT, had, obj("ConfigMap",
      { labels: { ...labelled("v1"), a: "2" }, finalizers: ["x/y"] })), `${label}: other edit`);
    assertAllowed(docs, update("ConfigMap", TENANT, had, obj("ConfigMap",
      { labels: { ...labelled("v1"), a: "1" } })), `${label}: loses finalizers`);
    assertAllowed(docs, update("ConfigMap", TENANT, had, obj("ConfigMap", { labels: { a: "1" } })),
      `${label}: drops the key`);
    assertAllowed(docs, update("ConfigMap", TENANT, had, obj("ConfigMap")),
      `${label}: drops all labels`);
    assertAllowed(docs, remove("ConfigMap", TENANT, had), `${label}: delete`);
    for (const user of [TENANT, ADMIN]) {
      assertRefused(docs, update("ConfigMap", user, had, obj("ConfigMap",
        { labels: { ...labelled("v2"), a: "1" } })), "gpu-usage-monitor-label",
      /its value may not change/, `${label}: ${user.username} changes the value`);
    }
  }
});

test("F11: the usage-monitor policy and binding render whether or not GPUs are on", () => {
  for (const [label, docs] of RENDERS) {
    assert.ok(byName(docs, "ValidatingAdmissionPolicy", "gpu-usage-monitor-label"), label);
    const binding = byName(docs, "ValidatingAdmissionPolicyBinding", "gpu-usage-monitor-label");
    assert.deepEqual(binding.spec.validationActions, ["Deny"], label);
  }
});

test("F12: the usage-monitor expressions read only metadata and never error", () => {
  for (const [label, docs] of RENDERS) {
    const policy = byName(docs, "ValidatingAdmissionPolicy", "gpu-usage-monitor-label");
    for (const { where, expression } of policyExpressions(policy)) {
      // Every path read from object or oldObject goes through metadata.
      for (const [, path] of expression.matchAll(/\b(?:object|oldObject)\.(\w+)/g)) {
        assert.equal(path, "metadata", `${where} reads object.${path}`);
      }
    }
    const c = cluster();
    const noError = (w, what) => {
      const d = admit(policy, w, { binding: byName(docs, "ValidatingAdmissionPolicyBinding",
        "gpu-usage-monitor-label"), cluster: c });
      recordCase({ source: import.meta.url, what: `${label}: ${what}`, render: renderOf(docs),
        scope: "gpu-usage-monitor-label", write: w, cluster: c, allowed: true, result: d });
      assert.deepEqual(d.errors, [], what);
      assert.equal(d.allowed, true, what);
    };
    noError(create("ConfigMap", TENANT, obj("ConfigMap")), "no labels");
    noError(update("ConfigMap", TENANT, obj("ConfigMap"), obj("ConfigMap")), "no labels, update");
    noError(remove("ConfigMap", TENANT, obj("ConfigMap", { labels: labelled() })), "DELETE");
    noError(remove("ConfigMap", TENANT, obj("ConfigMap")), "DELETE, no labels");
    // Subresources whose objects carry other kinds: a Scale without labels, an Eviction, a
    // Binding, and an options-like kind with no metadata at all.
    noError(update("Deployment", TENANT, obj("Deployment", { labels: labelled() }),
      { apiVersion: "autoscaling/v1", kind: "Scale", metadata: { name: "o1",
        namespace: "tenant-a" }, spec: { replicas: 2 } }, { subResource: "scale" }), "scale");
    noError(create("Pod", TENANT, { apiVersion: "policy/v1", kind: "Eviction",
      metadata: { name: "o1", namespace: "tenant-a" } }, { subResource: "eviction" }), "eviction");
    noError(create("Pod", TENANT, { kind: "PodExecOptions", command: ["sh"] },
      { subResource: "exec", namespace: "tenant-a", name: "o1" }), "no metadata");
    noError(update("Pod", TENANT, { kind: "Pod" }, { kind: "Pod" },
      { namespace: "tenant-a", name: "o1" }), "neither with metadata");
  }
});

// --- F13-F16: raw names -----------------------------------------------------------------------

function vmi({ label = false, gpus = [], hostDevices, resources, ns = "tenant-a" } = {}) {
  const metadata = { name: "vm1", namespace: ns };
  if (label) metadata.labels = { [DEVICE_REFS]: KEYS.kDeviceReferenceLabelValue };
  const devices = { disks: [] };
  if (gpus.length) devices.gpus = gpus;
  if (hostDevices) devices.hostDevices = hostDevices;
  const domain = { devices };
  if (resources) domain.resources = resources;
  return { apiVersion: "kubevirt.io/v1", kind: "VirtualMachineInstance", metadata,
    spec: { domain } };
}

test("F13: a VMI with a GPU entry but no device-reference label is refused, whoever wrote it", () => {
  const why = /raw GPU resource names are forbidden here: a VMI gets GPUs only through GPUDevice/;
  const gpu = [{ name: "g1", deviceName: "nvidia.com/GA100" }];
  for (const [label, docs] of RENDERS) {
    for (const user of [TENANT, ADMIN, KUBEVIRT_CONTROLLER, COZY_SA]) {
      assertRefused(docs, create("VirtualMachineInstance", user, vmi({ gpus: gpu })),
        "gpu-raw-names-vmi", why, `${label}: ${user.username}, gpus entry`);
    }
    // Any gpus entry, whatever its name.
    assertRefused(docs, create("VirtualMachineInstance", TENANT, vmi({ gpus: [{ name: "g",
      deviceName: "example.com/other" }] })), "gpu-raw-names-vmi", why, `${label}: any gpus entry`);
    assertRefused(docs, create("VirtualMachineInstance", TENANT, vmi({ hostDevices: [{ name: "h",
      deviceName: "nvidia.com/AD102GL_L40S" }] })), "gpu-raw-names-vmi", why,
    `${label}: hostDevices of a GPU name`);
    assertRefused(docs, create("VirtualMachineInstance", TENANT, vmi({ resources: { limits:
      { "nvidia.com/GA100": "1" } } })), "gpu-raw-names-vmi", why, `${label}: resources limit`);
    assertRefused(docs, create("VirtualMachineInstance", TENANT, vmi({ resources: { requests:
      { "nvidia.com/GA100": "1", memory: "1Gi" } } })), "gpu-raw-names-vmi", why,
    `${label}: resources request`);
    // Labelled, or with no GPU at all: allowed.
    assertAllowed(docs, create("VirtualMachineInstance", TENANT, vmi({ label: true, gpus: gpu })),
      `${label}: labelled`);
    assertAllowed(docs, create("VirtualMachineInstance", TENANT, vmi({ hostDevices: [{ name: "nic",
      deviceName: "mellanox.com/ConnectX6_VF" }], resources: { requests: { memory: "1Gi" } } })),
    `${label}: a non-GPU host device`);
    assertAllowed(docs, create("VirtualMachineInstance", TENANT, vmi()), `${label}: no devices`);
    // A label of another value is no reference.
    const wrong = vmi({ gpus: gpu });
    wrong.metadata.labels = { [DEVICE_REFS]: "false" };
    assertRefused(docs, create("VirtualMachineInstance", TENANT, wrong), "gpu-raw-names-vmi", why,
      `${label}: label false`);
    // Raw names allowed by the hoster: nothing refused.
    const allowed = cluster({ objects: [settings({ raw: KEYS.kRawNamePolicyAllowed })] });
    assertAllowed(docs, create("VirtualMachineInstance", TENANT, vmi({ gpus: gpu })),
      `${label}: raw names allowed`, allowed);
    // A ConfigMap without the policy key reads as forbidden.
    const unset = cluster({ objects: [settings({ raw: undefined })] });
    assertRefused(docs, create("VirtualMachineInstance", TENANT, vmi({ gpus: gpu })),
      "gpu-raw-names-vmi", why, `${label}: policy key missing`, unset);
  }
});

function pod({ owner = false, containers = [{}], initContainers, ns = "tenant-a", name = "p1" } = {}) {
  const metadata = { name, namespace: ns };
  if (owner) {
    metadata.ownerReferences = [{ apiVersion: "kubevirt.io/v1", kind: "VirtualMachineInstance",
      name: "vm1", uid: "u", controller: true, blockOwnerDeletion: true }];
  }
  const container = (resources, i) => ({ name: `c${i}`, image: "x", ...(resources ?
    { resources } : {}) });
  const spec = { containers: containers.map((r, i) => container(r.resources, i)) };
  if (initContainers) spec.initContainers = initContainers.map((r, i) => container(r.resources, i));
  return { apiVersion: "v1", kind: "Pod", metadata, spec };
}
const GPU_LIMIT = { resources: { limits: { "nvidia.com/GA100": "1" } } };
const GPU_REQUEST = { resources: { requests: { "nvidia.com/AD102GL_L40S": "1", cpu: "1" } } };

test("F14: a GPU-requesting pod needs kubevirt-controller and a VMI owner", () => {
  const why = /only kubevirt-controller may create a pod requesting a GPU resource name/;
  for (const [label, docs] of RENDERS) {
    for (const user of [TENANT, ADMIN, COZY_SA]) {
      assertRefused(docs, create("Pod", user, pod({ owner: true, containers: [GPU_LIMIT] })),
        "gpu-raw-names-pod", why, `${label}: ${user.username} with a VMI owner`);
    }
    assertRefused(docs, create("Pod", KUBEVIRT_CONTROLLER, pod({ containers: [GPU_LIMIT] })),
      "gpu-raw-names-pod", why, `${label}: kubevirt-controller, ownerless`);
    assertRefused(docs, create("Pod", TENANT, pod({ containers: [{}, GPU_REQUEST] })),
      "gpu-raw-names-pod", why, `${label}: second container requests`);
    assertRefused(docs, create("Pod", TENANT, pod({ initContainers: [GPU_LIMIT] })),
      "gpu-raw-names-pod", why, `${label}: init container`);
    const notVmi = pod({ containers: [GPU_LIMIT] });
    notVmi.metadata.ownerReferences = [{ apiVersion: "apps/v1", kind: "ReplicaSet", name: "r",
      uid: "u" }];
    assertRefused(docs, create("Pod", KUBEVIRT_CONTROLLER, notVmi), "gpu-raw-names-pod", why,
      `${label}: kubevirt-controller, ReplicaSet owner`);
    assertAllowed(docs, create("Pod", KUBEVIRT_CONTROLLER, pod({ owner: true,
      containers: [GPU_LIMIT] })), `${label}: virt-launcher`);
    assertAllowed(docs, create("Pod", KUBEVIRT_CONTROLLER, pod({ owner: true,
      containers: [GPU_REQUEST], name: "target" })), `${label}: migration target`);
    assertAllowed(docs, create("Pod", TENANT, pod({ containers: [{ resources: { limits:
      { cpu: "1", "example.com/fpga": "1" } } }] })), `${label}: no GPU`);
    assertAllowed(docs, create("Pod", TENANT, pod()), `${label}: no resources`);
    assertAllowed(docs, create("Pod", TENANT, pod({ containers: [GPU_LIMIT] })),
      `${label}: raw names allowed`, cluster({ objects: [settings({
        raw: KEYS.kRawNamePolicyAllowed })] }));
    // The names are the ConfigMap's: another set, another answer.
    assertAllowed(docs, create("Pod", TENANT, pod({ containers: [GPU_LIMIT] })),
      `${label}: not a GPU name here`, cluster({ objects: [settings({ names: ["amd.com/gpu"] })] }));
    assertRefused(docs, create("Pod", TENANT, pod({ containers: [{ resources: { limits:
      { "amd.com/gpu": "1" } } }] })), "gpu-raw-names-pod", why, `${label}: spaces in the list`,
    cluster({ objects: [settings({ names: [" nvidia.com/GA100", " amd.com/gpu "] })] }));
  }
});

test("F15: without the settings ConfigMap the raw-name bindings deny in tenant namespaces", () => {
  const empty = cluster({ objects: [] });
  for (const [label, docs] of RENDERS) {
    for (const name of ["gpu-raw-names-pod", "gpu-raw-names-vmi"]) {
      const binding = byName(docs, "ValidatingAdmissionPolicyBinding", name);
      assert.deepEqual(binding.spec.paramRef, { name: KEYS.kSettingsConfigMapName,
        namespace: RELEASE_NS, parameterNotFoundAction: "Deny" }, `${label}: ${name}`);
      assert.equal(byName(docs, "ValidatingAdmissionPolicy", name).spec.failurePolicy, "Fail");
    }
    assertRefused(docs, create("Pod", TENANT, pod()), "gpu-raw-names-pod", /no params found/,
      `${label}: tenant pod`, empty, { errorsExpected: true });
    assertRefused(docs, create("Pod", KUBEVIRT_CONTROLLER, pod({ owner: true })),
      "gpu-raw-names-pod", /no params found/, `${label}: even a launcher`, empty,
      { errorsExpected: true });
    assertRefused(docs, create("VirtualMachineInstance", TENANT, vmi()), "gpu-raw-names-vmi",
      /no params found/, `${label}: VMI`, empty, { errorsExpected: true });
    // A ConfigMap of that name elsewhere is not the parameter.
    const elsewhere = settings();
    elsewhere.metadata.namespace = "tenant-a";
    assertRefused(docs, create("Pod", TENANT, pod()), "gpu-raw-names-pod", /no params found/,
      `${label}: ConfigMap in another namespace`, cluster({ objects: [elsewhere] }),
      { errorsExpected: true });
  }
});

test("F16: the raw-name and usage-monitor bindings select tenant namespaces only", () => {
  const empty = cluster({ objects: [] });
  for (const [label, docs] of RENDERS) {
    const selectors = ["gpu-raw-names-pod", "gpu-raw-names-vmi", "gpu-usage-monitor-label"]
      .map((n) => byName(docs, "ValidatingAdmissionPolicyBinding", n).spec.matchResources);
    for (const s of selectors) {
      assert.deepEqual(s, { namespaceSelector: { matchExpressions:
        [{ key: TENANT_KEY, operator: "Exists" }] } }, label);
    }
    // No ConfigMap yet: pods outside tenant namespaces start, the controller's own included.
    for (const ns of ["cozy-system", RELEASE_NS, "kube-system", "default"]) {
      assertAllowed(docs, create("Pod", sa(ns, "replicaset-controller"), pod({ ns })),
        `${label}: pod in ${ns}`, empty);
      assertAllowed(docs, create("Pod", ADMIN, pod({ ns, containers: [GPU_LIMIT] })),
        `${label}: GPU pod in ${ns}`, empty);
    }
    // The root tenant's namespace is a tenant namespace too.
    assertRefused(docs, create("Pod", TENANT, pod({ ns: "tenant-root" })), "gpu-raw-names-pod",
      /no params found/, `${label}: tenant-root`, empty, { errorsExpected: true });
  }
});

// F18: the catalog's tenant (tenant.cozystack.io/ labels) and the policies' tenant (the
// tenant-namespace label) cannot disagree: a namespace with the first and not the second is
// refused, whoever writes it, so the tenant chart that forgets the second fails at install.
test("F18: a namespace with a tenant.cozystack.io/ label must carry the tenant-namespace label", () => {
  const empty = cluster({ objects: [] });
  const child = (labels) => namespace("tenant-x", labels);
  const ancestry = { "tenant.cozystack.io/tenant-root": "" };
  for (const [label, docs] of RENDERS) {
    for (const user of [ADMIN, COZY_SA, CONTROLLER]) {
      assertRefused(docs, create("Namespace", user, child(ancestry)),
        "gpu-tenant-namespace-label", /carries a tenant\.cozystack\.io\/ label but not/,
        `${label}: ${user.username} creates a tenant namespace without the label`, empty);
      assertAllowed(docs, create("Namespace", user, child({ ...ancestry, [TENANT_KEY]: "" })),
        `${label}: ${user.username} creates a tenant namespace with both`, empty);
    }
    // Namespaces that are no tenant's stay free.
    for (const labels of [{}, { "kubernetes.io/metadata.name": "tenant-x" },
      { [TENANT_KEY]: "" }, { "tenant.cozystack.io": "x", "cozystack.io/tenant": "y" }]) {
      assertAllowed(docs, create("Namespace", ADMIN, child(labels)),
        `${label}: ${JSON.stringify(labels)}`, empty);
    }
    // An update may not make them disagree either way, and may fix one that does.
    const both = child({ ...ancestry, [TENANT_KEY]: "" });
    assertRefused(docs, update("Namespace", ADMIN, both, child(ancestry)),
      "gpu-tenant-namespace-label", /gpu\.cozystack\.io\/tenant-namespace/,
      `${label}: the tenant-namespace label removed`, empty);
    assertRefused(docs, update("Namespace", ADMIN, child({}), child(ancestry)),
      "gpu-tenant-namespace-label", /tenant-x/, `${label}: a tenant label added alone`, empty);
    assertAllowed(docs, update("Namespace", ADMIN, child(ancestry), both),
      `${label}: a broken namespace fixed`, empty);
    // A broken one being deleted is let through, so it can always go.
    const deleting = child(ancestry);
    deleting.metadata.deletionTimestamp = "2026-01-01T00:00:00Z";
    assertAllowed(docs, update("Namespace", ADMIN, deleting, deleting),
      `${label}: a broken namespace being deleted`, empty);
  }
});

test("B1: the policies spell the keys as api/keys.h does", () => {
  const text = JSON.stringify(ON.filter((d) => d.kind.startsWith("ValidatingAdmissionPolicy")));
  for (const key of ["kTenantNamespaceLabel", "kUsageMonitorLabel", "kDeviceFinalizer",
    "kClassFinalizer", "kTemplateDeviceLabel", "kDeviceReferenceLabel", "kSettingsConfigMapName",
    "kSettingsResourceNamesKey", "kSettingsRawNamePolicyKey", "kRawNamePolicyAllowed"]) {
    assert.ok(KEYS[key], `${key} in api/keys.h`);
    assert.ok(text.includes(KEYS[key]), `${key} (${KEYS[key]}) in the policies`);
  }
});
