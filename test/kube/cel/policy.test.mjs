// The node-bound ValidatingAdmissionPolicy of the chart, evaluated with a real CEL
// implementation (@bufbuild/cel) the way the API server applies it (admission.mjs): an
// expression that errors under failurePolicy Fail DENIES. Covers SEEDS-CATALOG F1 and F2, and
// A8/A9 from the API server's side (the binder's conditions, no other node's object).
import { test as nodeTest } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
// With COZY_RECORD_POLICY_CASES set, every case asserted on the chart's policy is written down
// for the replay on a real API server (record.mjs, realserver.test.mjs).
import { recordCase, recordingTest } from "./record.mjs";

const test = recordingTest(nodeTest);

let admit, admissionRequest, run, isCelError, parseAllDocuments;
try {
  ({ run, isCelError } = await import("@bufbuild/cel"));
  ({ parseAllDocuments } = await import("yaml"));
  ({ admit, admissionRequest } = await import("./admission.mjs"));
} catch (error) {
  console.error("policy test: npm packages missing; run scripts/install-deps.sh " +
    "(npm ci --prefix test/kube/cel): " + error.message);
  process.exit(1);
}

// The chart as rendered (test/kube/CMakeLists.txt runs `helm template` with a namespace other
// than the default into COZY_RENDERED_CHART), so the templated service account is checked.
const renderedFile = process.env.COZY_RENDERED_CHART;
const namespace = process.env.COZY_RELEASE_NAMESPACE;
if (!renderedFile || !namespace) {
  console.error("policy test: COZY_RENDERED_CHART and COZY_RELEASE_NAMESPACE must be set " +
    "(ctest sets them)");
  process.exit(1);
}
const documents = parseAllDocuments(readFileSync(renderedFile, "utf8")).map((d) => d.toJS());
// The chart renders other policies too (docs/policies.md; policies.test.mjs runs them).
const policy = documents.find((d) => d.kind === "ValidatingAdmissionPolicy" &&
  d.metadata.name === "gpu-agent-own-gpunode");
const binding = documents.find((d) => d.kind === "ValidatingAdmissionPolicyBinding" &&
  d.spec.policyName === "gpu-agent-own-gpunode");
// The agent's: the chart also binds the controller's roles.
const clusterRoleBinding = documents.find((d) => d.kind === "ClusterRoleBinding" &&
  d.metadata.name === "gpu-agent");

const NODE_NAME = "authentication.kubernetes.io/node-name";
const AGENT = `system:serviceaccount:${namespace}:gpu-agent`;
const AGENT_GROUPS = ["system:serviceaccounts", `system:serviceaccounts:${namespace}`,
  "system:authenticated"];
// A bare-metal agent (docs/install.md): a client certificate with CN
// gpu.cozystack.io:agent:<node> and O gpu.cozystack.io:agents.
const BARE_METAL_PREFIX = "gpu.cozystack.io:agent:";
const BARE_METAL_GROUP = "gpu.cozystack.io:agents";

// The pod's token: bound to the pod, so it carries the node name (and pod and node-uid) extras.
function podAgent(nodeName) {
  return {
    username: AGENT, uid: "u-1", groups: AGENT_GROUPS,
    extra: nodeName === undefined ? {} : {
      [NODE_NAME]: [nodeName], "authentication.kubernetes.io/pod-name": ["gpu-agent-x"],
    },
  };
}

function bareMetalAgent(nodeName) {
  return { username: BARE_METAL_PREFIX + nodeName, groups: [BARE_METAL_GROUP,
    "system:authenticated"] };
}

function gpuNode(name, { owners, finalizers, conditions, devices } = {}) {
  const metadata = {
    name, uid: `uid-${name}`, resourceVersion: "7",
    ownerReferences: owners ?? [{ apiVersion: "v1", kind: "Node", name, uid: `node-${name}` }],
  };
  if (owners === null) delete metadata.ownerReferences;
  if (finalizers !== undefined) metadata.finalizers = finalizers;
  const status = { resourceNames: ["nvidia.com/GA100"], devices: devices ?? [] };
  if (conditions !== undefined) status.conditions = conditions;
  return { apiVersion: "gpu.cozystack.io/v1alpha1", kind: "GPUNode", metadata, spec: {}, status };
}

const BOUND = [{ type: "Bound", status: "True", reason: "Ready", lastTransitionTime:
  "2026-01-01T00:00:00Z" }];

function gpuNodeRequest(userInfo, { operation, name, subResource = "" }) {
  return admissionRequest({
    kind: { group: "gpu.cozystack.io", version: "v1alpha1", kind: "GPUNode" },
    resource: { group: "gpu.cozystack.io", version: "v1alpha1", resource: "gpunodes" },
    subResource, name, operation, userInfo,
  });
}

// The writes the agent makes (agent/publisher.cpp) and ones it must not, as the API server
// would hand them to admission (a status update's object is the old one with the new status).
function create(userInfo, object, name = object.metadata.name) {
  return { request: gpuNodeRequest(userInfo, { operation: "CREATE", name }), object };
}
function update(userInfo, oldObject, object, subResource = "status") {
  return {
    request: gpuNodeRequest(userInfo,
      { operation: "UPDATE", name: oldObject.metadata.name, subResource }),
    object, oldObject,
  };
}
function remove(userInfo, oldObject) {
  return {
    request: gpuNodeRequest(userInfo, { operation: "DELETE", name: oldObject.metadata.name }),
    oldObject,
  };
}

// The chart's policy on one write. The policy never errors on a well-formed request: an error
// here would be a denial for the wrong reason (or, in a broken harness, a silent pass).
function decide(write) {
  const decision = admit(policy, write, { binding });
  assert.deepEqual(decision.errors, [], "the policy errored");
  return decision;
}
// The chart rendered with its default values (GPUs off); one policy decides each case.
const record = (write, what, expected) => recordCase({ source: import.meta.url, what,
  render: "off", scope: policy.metadata.name, write, ...expected });
function assertAllowed(write, what) {
  const decision = decide(write);
  record(write, what, { allowed: true, result: decision });
  assert.equal(decision.matched, true, `${what}: not matched`);
  assert.equal(decision.allowed, true, `${what}: ${decision.messages.join("; ")}`);
}
function assertRefused(write, pattern, what) {
  const decision = decide(write);
  record(write, what, { allowed: false, policy: policy.metadata.name, pattern,
    result: decision });
  assert.equal(decision.matched, true, `${what}: not matched`);
  assert.equal(decision.allowed, false, `${what}: allowed`);
  assert.match(decision.messages.join("; "), pattern, what);
}

test("the binding denies through the policy, failing closed", () => {
  assert.equal(binding.spec.policyName, policy.metadata.name);
  assert.deepEqual(binding.spec.validationActions, ["Deny"]);
  assert.equal(policy.spec.failurePolicy, "Fail");
});

// The harness itself: the library returns errors as values, and admit() treats them as the
// API server does. Without this the tests below could pass on a policy that only ever errors.
test("harness: run() returns an error value instead of throwing", () => {
  const result = run("object.metadata.noSuchField == 'x'",
    { object: new Map([["metadata", new Map()]]) });
  assert.equal(isCelError(result), true);
});

test("harness: an erroring validation denies under Fail and is skipped under Ignore", () => {
  const erroring = structuredClone(policy);
  erroring.spec.validations.push({ expression: "object.metadata.noSuchField == 'x'" });
  const write = update(podAgent("n1"), gpuNode("n1"), gpuNode("n1"));
  const denied = admit(erroring, write);
  assert.equal(denied.matched, true);
  assert.equal(denied.allowed, false);
  assert.match(denied.messages.join(" "), /resulted in error: .*noSuchField/);
  erroring.spec.failurePolicy = "Ignore";
  assert.equal(admit(erroring, write).allowed, true);
  // A non-bool result is an error too.
  const notBool = structuredClone(policy);
  notBool.spec.validations.push({ expression: "'yes'" });
  assert.equal(admit(notBool, write).allowed, false);
});

test("harness: an erroring matchCondition denies under Fail unless another is false", () => {
  const erroring = structuredClone(policy);
  erroring.spec.matchConditions.push({ name: "broken", expression: "request.noSuchField" });
  const write = update(podAgent("n1"), gpuNode("n1"), gpuNode("n1"));
  const denied = admit(erroring, write);
  assert.equal(denied.allowed, false);
  assert.match(denied.messages.join(" "), /matchCondition broken/);
  // An admin does not match is-gpu-agent: a false condition wins over an error.
  const admin = { username: "kubernetes-admin", groups: ["system:masters"] };
  assert.equal(admit(erroring, update(admin, gpuNode("n2"), gpuNode("n2"))).matched, false);
  erroring.spec.failurePolicy = "Ignore";
  assert.deepEqual([admit(erroring, write).matched, admit(erroring, write).allowed], [false, true]);
});

test("harness: empty request fields are absent, as the API server binds them", () => {
  const request = gpuNodeRequest({ username: "u" }, { operation: "UPDATE", name: "n1" });
  assert.equal("subResource" in request, false);
  assert.equal("groups" in request.userInfo, false);
  assert.equal("extra" in request.userInfo, false);
  assert.equal("namespace" in request, false);
  assert.equal(request.dryRun, false);
  const unguarded = structuredClone(policy);
  unguarded.spec.validations.push({ expression: "request.subResource == 'status'" });
  const decision = admit(unguarded,
    { request: gpuNodeRequest(podAgent("n1"), { operation: "DELETE", name: "n1" }),
      oldObject: gpuNode("n1") });
  assert.equal(decision.allowed, false);
  assert.match(decision.errors.join(" "), /subResource/);
});

test("F1 A9: the agent in a pod may create its own node's GPUNode and patch its status", () => {
  const agent = podAgent("n1");
  assertAllowed(create(agent, gpuNode("n1")), "create");
  assertAllowed(create(agent, gpuNode("n1", { finalizers: [] })), "create, empty finalizers");
  const before = gpuNode("n1", { conditions: BOUND });
  const after = gpuNode("n1", { conditions: BOUND,
    devices: [{ pciAddress: "0000:3b:00.0", allocatable: 1 }] });
  assertAllowed(update(agent, before, after), "status patch");
  assertAllowed(update(agent, gpuNode("n1"), gpuNode("n1", { devices: [{ allocatable: 2 }] })),
    "status patch without conditions");
});

test("F1 A9: the agent on n1 writing n2's GPUNode is refused, and told why", () => {
  const agent = podAgent("n1");
  const why = /gpu-agent on node n1 may write only GPUNode n1, not n2/;
  assertRefused(create(agent, gpuNode("n2")), why, "create");
  assertRefused(update(agent, gpuNode("n2"), gpuNode("n2")), why, "status patch");
  assertRefused(remove(agent, gpuNode("n2")), why, "delete");
  assertAllowed(remove(agent, gpuNode("n1")), "its own delete (RBAC does not grant it)");
  const generated = gpuNode("", { owners: [{ apiVersion: "v1", kind: "Node", name: "n1",
    uid: "x" }] });
  assertRefused(create(agent, generated, ""), /not one with a generated name/, "generateName");
});

test("F2: credentials without the node-name extra are refused", () => {
  const why = /credentials carry no node name/;
  const noExtra = podAgent(undefined);
  assertRefused(update(noExtra, gpuNode("n1"), gpuNode("n1")), why, "no extra at all");
  const emptyList = { ...podAgent("n1"), extra: { [NODE_NAME]: [] } };
  assertRefused(update(emptyList, gpuNode("n1"), gpuNode("n1")), why, "empty list");
  const emptyName = { ...podAgent("n1"), extra: { [NODE_NAME]: [""] } };
  assertRefused(update(emptyName, gpuNode("n1"), gpuNode("n1")), why, "empty name");
  const podOnly = { ...podAgent("n1"), extra: { "authentication.kubernetes.io/pod-name": ["p"] } };
  assertRefused(create(podOnly, gpuNode("n1")), why, "another extra only");
});

test("F2: other users are not matched at all", () => {
  for (const userInfo of [
    { username: "kubernetes-admin", groups: ["system:masters", "system:authenticated"] },
    { username: "system:serviceaccount:cozy-gpu:gpu-controller", groups: AGENT_GROUPS },
    { username: "system:serviceaccount:kube-system:gpu-agent", groups: AGENT_GROUPS,
      extra: { [NODE_NAME]: ["n1"] } },
    { username: "system:node:n1", groups: ["system:nodes"] },
    { username: "no-groups" },
  ]) {
    const write = update(userInfo, gpuNode("n2", { conditions: BOUND }),
      gpuNode("n2", { conditions: [] }));
    const decision = decide(write);
    record(write, `${userInfo.username}: not matched`, { allowed: true, result: decision });
    assert.equal(decision.matched, false, userInfo.username);
    assert.equal(decision.allowed, true, userInfo.username);
  }
});

test("the agent creates its GPUNode with exactly one owner reference, to its own v1 Node", () => {
  const agent = podAgent("n1");
  const why = /exactly one owner reference, to the v1 Node n1/;
  const node = (fields) => ({ apiVersion: "v1", kind: "Node", name: "n1", uid: "u", ...fields });
  assertAllowed(create(agent, gpuNode("n1", { owners: [node({})] })), "its Node");
  for (const [owners, what] of [
    [null, "no ownerReferences"],
    [[], "an empty list"],
    [[node({}), node({})], "two"],
    [[node({}), { apiVersion: "apps/v1", kind: "DaemonSet", name: "gpu-agent", uid: "d" }],
      "its Node and another"],
    [[node({ name: "n2" })], "another node"],
    [[node({ kind: "Pod" })], "a Pod named n1"],
    [[node({ apiVersion: "example.com/v1" })], "a Node of another API group"],
  ]) {
    assertRefused(create(agent, gpuNode("n1", { owners })), why, what);
  }
});

test("the agent creates its GPUNode without finalizers", () => {
  const agent = podAgent("n1");
  assertAllowed(create(agent, gpuNode("n1")), "none");
  assertRefused(create(agent, gpuNode("n1", { finalizers: ["example.com/keep"] })),
    /without finalizers/, "one");
});

test("A8: the agent may not change the binder's status.conditions", () => {
  const agent = podAgent("n1");
  const why = /may not change status.conditions/;
  const bound = gpuNode("n1", { conditions: BOUND });
  assertAllowed(update(agent, bound, gpuNode("n1", { conditions: BOUND,
    devices: [{ allocatable: 3 }] })), "conditions kept");
  const changed = [{ ...BOUND[0], status: "False" }];
  assertRefused(update(agent, bound, gpuNode("n1", { conditions: changed })), why, "changed");
  assertRefused(update(agent, bound, gpuNode("n1")), why, "removed");
  assertRefused(update(agent, gpuNode("n1"), gpuNode("n1", { conditions: BOUND })), why,
    "forged where there were none");
  assertAllowed(update(agent, gpuNode("n1", { conditions: [] }), gpuNode("n1")),
    "an empty list is none");
});

test("the agent updates its GPUNode only through /status; every subresource is matched", () => {
  const agent = podAgent("n1");
  assertRefused(update(agent, gpuNode("n1"), gpuNode("n1"), ""),
    /only through the status subresource/, "main resource");
  // A subresource the CRD may grow (scale): matched, so the node rule holds there too.
  assertRefused(update(agent, gpuNode("n2"), gpuNode("n2"), "scale"), /not n2/, "scale of n2");
  const rules = policy.spec.matchConstraints.resourceRules;
  assert.ok(rules.some((rule) => rule.resources.includes("gpunodes/*")));
});

test("a bare-metal agent is bound to its node by its user name", () => {
  const agent = bareMetalAgent("metal-1");
  assertAllowed(create(agent, gpuNode("metal-1")), "create");
  assertAllowed(update(agent, gpuNode("metal-1", { conditions: BOUND }),
    gpuNode("metal-1", { conditions: BOUND, devices: [{ allocatable: 1 }] })), "status patch");
  assertRefused(update(agent, gpuNode("n2"), gpuNode("n2")),
    /gpu-agent on node metal-1 may write only GPUNode metal-1, not n2/, "another node");
  assertRefused(update(agent, gpuNode("metal-1", { conditions: BOUND }), gpuNode("metal-1")),
    /status.conditions/, "the binder's conditions");
  assertRefused(create(agent, gpuNode("metal-1", { owners: [] })), /owner reference/,
    "no owner");
  // A member of the group whose name carries no node: refused, not let through.
  const unnamed = { username: "metal-host", groups: [BARE_METAL_GROUP] };
  assertRefused(update(unnamed, gpuNode("metal-1"), gpuNode("metal-1")),
    /carry no node name/, "group member without a node name");
  const empty = { username: BARE_METAL_PREFIX, groups: [BARE_METAL_GROUP] };
  assertRefused(create(empty, gpuNode("")), /carry no node name/, "empty node name");
  // The name alone (bound to the role some other way) is matched and bound all the same.
  const nameOnly = { username: BARE_METAL_PREFIX + "metal-1", groups: ["system:authenticated"] };
  assertRefused(update(nameOnly, gpuNode("n2"), gpuNode("n2")), /not n2/, "name, no group");
  // The node-name extra means nothing for a user that is not the pod's service account.
  const extraOnly = { username: "someone", groups: [BARE_METAL_GROUP],
    extra: { [NODE_NAME]: ["n2"] } };
  assertRefused(update(extraOnly, gpuNode("n2"), gpuNode("n2")), /carry no node name/,
    "a group member claiming an extra");
});

test("the group the policy binds is the one the agent's ClusterRoleBinding grants", () => {
  const groups = clusterRoleBinding.subjects.filter((s) => s.kind === "Group").map((s) => s.name);
  assert.deepEqual(groups, [BARE_METAL_GROUP]);
  assert.ok(policy.spec.matchConditions.some((c) => c.expression.includes(`'${BARE_METAL_GROUP}'`)));
});

test("requests for other resources are outside the policy", () => {
  const pod = admissionRequest({
    kind: { group: "", version: "v1", kind: "Pod" },
    resource: { group: "", version: "v1", resource: "pods" },
    name: "n2", namespace: "default", operation: "UPDATE", userInfo: podAgent("n1"),
  });
  const write = { request: pod, object: {}, oldObject: {} };
  const decision = admit(policy, write);
  record(write, "a pod update", { allowed: true, result: decision });
  assert.equal(decision.matched, false);
});
