// The node-bound ValidatingAdmissionPolicy of the chart, evaluated with a real CEL
// implementation (@bufbuild/cel) the way the API server applies it (admission.mjs): an
// expression that errors under failurePolicy Fail DENIES. Covers SEEDS-CATALOG F1 and F2.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";

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

// The chart as rendered (test/kube/CMakeLists.txt runs chart-render with a namespace other
// than the default into COZY_RENDERED_CHART), so the templated service account is checked.
const renderedFile = process.env.COZY_RENDERED_CHART;
const namespace = process.env.COZY_RELEASE_NAMESPACE;
if (!renderedFile || !namespace) {
  console.error("policy test: COZY_RENDERED_CHART and COZY_RELEASE_NAMESPACE must be set " +
    "(ctest sets them)");
  process.exit(1);
}
const documents = parseAllDocuments(readFileSync(renderedFile, "utf8")).map((d) => d.toJS());
const policy = documents.find((d) => d.kind === "ValidatingAdmissionPolicy");
const binding = documents.find((d) => d.kind === "ValidatingAdmissionPolicyBinding");

const NODE_NAME = "authentication.kubernetes.io/node-name";
const AGENT = `system:serviceaccount:${namespace}:gpu-agent`;
const AGENT_GROUPS = ["system:serviceaccounts", `system:serviceaccounts:${namespace}`,
  "system:authenticated"];

function podAgent(nodeName) {
  return {
    username: AGENT, uid: "u-1", groups: AGENT_GROUPS,
    extra: nodeName === undefined ? {} : { [NODE_NAME]: [nodeName] },
  };
}

function gpuNode(name) {
  return {
    apiVersion: "gpu.cozystack.io/v1alpha1", kind: "GPUNode",
    metadata: { name, ownerReferences: [{ apiVersion: "v1", kind: "Node", name, uid: "u" }] },
    spec: {}, status: { resourceNames: [] },
  };
}

function write(userInfo, { operation = "UPDATE", name, subResource = "status" }) {
  const request = admissionRequest({
    kind: { group: "gpu.cozystack.io", version: "v1alpha1", kind: "GPUNode" },
    resource: { group: "gpu.cozystack.io", version: "v1alpha1", resource: "gpunodes" },
    subResource, name, operation, userInfo,
  });
  const object = operation === "DELETE" ? null : gpuNode(name);
  const oldObject = operation === "CREATE" ? null : gpuNode(name);
  return { request, object, oldObject };
}

test("the binding denies through the policy", () => {
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
  const own = write(podAgent("n1"), { name: "n1" });
  const denied = admit(erroring, own);
  assert.equal(denied.matched, true);
  assert.equal(denied.allowed, false);
  assert.match(denied.messages.join(" "), /resulted in error: .*noSuchField/);
  erroring.spec.failurePolicy = "Ignore";
  assert.equal(admit(erroring, own).allowed, true);
  const notBool = structuredClone(policy);
  notBool.spec.validations.push({ expression: "'yes'" });
  assert.equal(admit(notBool, own).allowed, false);
});

test("harness: an erroring matchCondition denies under Fail unless another is false", () => {
  const erroring = structuredClone(policy);
  erroring.spec.matchConditions.push({ name: "broken", expression: "request.noSuchField" });
  const own = write(podAgent("n1"), { name: "n1" });
  const denied = admit(erroring, own);
  assert.equal(denied.allowed, false);
  assert.match(denied.messages.join(" "), /matchCondition broken/);
  const admin = { username: "kubernetes-admin", groups: ["system:masters"] };
  assert.equal(admit(erroring, write(admin, { name: "n2" })).matched, false);
  erroring.spec.failurePolicy = "Ignore";
  assert.deepEqual([admit(erroring, own).matched, admit(erroring, own).allowed], [false, true]);
});

test("F1: the agent may create and patch its own node's GPUNode", () => {
  for (const [operation, subResource] of [["CREATE", ""], ["UPDATE", "status"], ["UPDATE", ""]]) {
    const decision = admit(policy, write(podAgent("n1"), { name: "n1", operation, subResource }));
    assert.deepEqual(decision.errors, []);
    assert.equal(decision.matched, true);
    assert.equal(decision.allowed, true, `${operation} ${subResource}: ${decision.messages}`);
  }
});

test("F1: the agent on n1 writing n2's GPUNode is refused, and told why", () => {
  for (const [operation, subResource] of [["CREATE", ""], ["UPDATE", "status"], ["DELETE", ""]]) {
    const decision = admit(policy, write(podAgent("n1"), { name: "n2", operation, subResource }));
    assert.deepEqual(decision.errors, []);
    assert.equal(decision.allowed, false, `${operation} ${subResource}`);
    assert.match(decision.messages.join(" "), /node n1 may write only GPUNode n1, not n2/);
  }
});

// Refused either way, but where the token has no extras at all the API server leaves the
// (empty) extra map out and today's expression errors rather than returning false: denied by
// failurePolicy Fail, not by its own message.
test("F2: a token without the node-name extra is refused", () => {
  const none = admit(policy, write(podAgent(undefined), { name: "n1" }));
  assert.equal(none.matched, true);
  assert.equal(none.allowed, false);
  const emptyList = admit(policy, write({ ...podAgent("n1"), extra: { [NODE_NAME]: [] } },
    { name: "n1" }));
  assert.equal(emptyList.allowed, false);
  assert.match(emptyList.messages.join(" "), /carries no node name/);
  const podOnly = { ...podAgent("n1"), extra: { "authentication.kubernetes.io/pod-name": ["p"] } };
  assert.equal(admit(policy, write(podOnly, { name: "n1" })).allowed, false);
});

test("F2: other users are not matched at all", () => {
  for (const username of ["kubernetes-admin", "system:serviceaccount:cozy-gpu:gpu-controller",
    "system:serviceaccount:kube-system:gpu-agent"]) {
    const decision = admit(policy, write({ username, groups: AGENT_GROUPS }, { name: "n2" }));
    assert.equal(decision.matched, false, username);
    assert.equal(decision.allowed, true, username);
  }
});

test("requests for other resources are outside the policy", () => {
  const pod = admissionRequest({
    kind: { group: "", version: "v1", kind: "Pod" },
    resource: { group: "", version: "v1", resource: "pods" },
    name: "n2", namespace: "default", operation: "UPDATE", userInfo: podAgent("n1"),
  });
  assert.equal(admit(policy, { request: pod, object: {}, oldObject: {} }).matched, false);
});
