// The node-bound ValidatingAdmissionPolicy of the chart, evaluated with a real CEL
// implementation (@bufbuild/cel) the way the API server applies it: matchConstraints, then
// matchConditions (any false: not matched), then every validation (any false: denied), and
// failurePolicy Fail for an expression that errors. Covers SEEDS-CATALOG F1 and F2.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";

let run, parseAllDocuments;
try {
  ({ run } = await import("@bufbuild/cel"));
  ({ parseAllDocuments } = await import("yaml"));
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

// CEL maps are Maps and CEL ints are bigints; convert plain JSON the way the server binds it.
function toCel(value) {
  if (Array.isArray(value)) return value.map(toCel);
  if (value !== null && typeof value === "object") {
    return new Map(Object.entries(value).map(([k, v]) => [k, toCel(v)]));
  }
  if (typeof value === "number" && Number.isInteger(value)) return BigInt(value);
  return value;
}

function ruleMatches(rules, request) {
  const resource = request.subResource
    ? `${request.resource.resource}/${request.subResource}` : request.resource.resource;
  return rules.some((rule) =>
    rule.apiGroups.some((g) => g === "*" || g === request.resource.group) &&
    rule.apiVersions.some((v) => v === "*" || v === request.resource.version) &&
    rule.operations.some((o) => o === "*" || o === request.operation) &&
    rule.resources.some((r) => r === "*" || r === resource));
}

// Returns {matched, allowed, messages} as the API server would decide for this request.
function admit(request) {
  if (!ruleMatches(policy.spec.matchConstraints.resourceRules, request)) {
    return { matched: false, allowed: true, messages: [] };
  }
  const vars = { request: toCel(request), object: toCel({ metadata: { name: request.name } }) };
  const failClosed = (policy.spec.failurePolicy ?? "Fail") === "Fail";
  for (const condition of policy.spec.matchConditions ?? []) {
    let result;
    try {
      result = run(condition.expression, vars);
    } catch (error) {
      if (failClosed) return { matched: true, allowed: false, messages: [String(error)] };
      return { matched: false, allowed: true, messages: [] };
    }
    if (result !== true) return { matched: false, allowed: true, messages: [] };
  }
  const messages = [];
  for (const validation of policy.spec.validations) {
    let result;
    try {
      result = run(validation.expression, vars);
    } catch (error) {
      result = failClosed ? false : true;
    }
    if (result !== true) {
      let message = validation.message ?? `failed rule: ${validation.expression}`;
      if (validation.messageExpression) {
        try { message = run(validation.messageExpression, vars); } catch { /* keep message */ }
      }
      messages.push(message);
    }
  }
  return { matched: true, allowed: messages.length === 0, messages };
}

function request({ user = AGENT, nodeName, name, operation = "UPDATE", subResource = "status",
  extra } = {}) {
  const userExtra = extra ?? (nodeName === undefined ? {} : { [NODE_NAME]: [nodeName] });
  return {
    kind: { group: "gpu.cozystack.io", version: "v1alpha1", kind: "GPUNode" },
    resource: { group: "gpu.cozystack.io", version: "v1alpha1", resource: "gpunodes" },
    subResource, name, namespace: "", operation,
    userInfo: { username: user, uid: "u-1", groups: ["system:serviceaccounts"], extra: userExtra },
    dryRun: false,
  };
}

test("the binding denies through the policy", () => {
  assert.equal(binding.spec.policyName, policy.metadata.name);
  assert.deepEqual(binding.spec.validationActions, ["Deny"]);
  assert.equal(policy.spec.failurePolicy, "Fail");
});

test("F1: the agent may create and patch its own node's GPUNode", () => {
  for (const [operation, subResource] of [["CREATE", ""], ["UPDATE", "status"], ["UPDATE", ""]]) {
    const decision = admit(request({ nodeName: "n1", name: "n1", operation, subResource }));
    assert.equal(decision.matched, true);
    assert.equal(decision.allowed, true, `${operation} ${subResource}: ${decision.messages}`);
  }
});

test("F1: the agent on n1 writing n2's GPUNode is refused, and told why", () => {
  for (const [operation, subResource] of [["CREATE", ""], ["UPDATE", "status"], ["DELETE", ""]]) {
    const decision = admit(request({ nodeName: "n1", name: "n2", operation, subResource }));
    assert.equal(decision.allowed, false, `${operation} ${subResource}`);
    assert.match(decision.messages.join(" "), /node n1 may write only GPUNode n1, not n2/);
  }
});

test("F2: a token without the node-name extra is refused", () => {
  const decision = admit(request({ name: "n1" }));
  assert.equal(decision.matched, true);
  assert.equal(decision.allowed, false);
  assert.match(decision.messages.join(" "), /carries no node name/);
  const emptyList = admit(request({ name: "n1", extra: { [NODE_NAME]: [] } }));
  assert.equal(emptyList.allowed, false);
  const podOnly = { "authentication.kubernetes.io/pod-name": ["p"] };
  const otherExtra = admit(request({ name: "n1", extra: podOnly }));
  assert.equal(otherExtra.allowed, false);
});

test("F2: other users are not matched at all", () => {
  for (const user of ["kubernetes-admin", "system:serviceaccount:cozy-gpu:gpu-controller",
    "system:serviceaccount:kube-system:gpu-agent"]) {
    const decision = admit(request({ user, name: "n2" }));
    assert.equal(decision.matched, false, user);
    assert.equal(decision.allowed, true, user);
  }
});

test("requests for other resources are outside the policy", () => {
  const pod = request({ nodeName: "n1", name: "n2" });
  pod.resource = { group: "", version: "v1", resource: "pods" };
  assert.equal(admit(pod).matched, false);
});
