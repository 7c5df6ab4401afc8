// The recorded policy cases (record.mjs) that realserver.test.mjs does not replay, by id, with
// the reason; docs/policies.md "On a real API server" lists them too. Each is still checked to be
// what its entry says (`check`), so the list cannot go stale unseen:
// - "refused-before-admission": sent, the API server refuses it before any admission policy
//   runs (its schema or its validation), with a message matching `message`;
// - "setup-refused": the stored object the case updates cannot be created (`message`);
// - "allowed-instead": sent, the API server allows it: what it hands to admission is not what
//   the case wrote, so the refusal the case asserts cannot happen on a real server;
// - "unsendable": no client can send that request; not sent.
// realserver.test.mjs also refuses to replay a case of a shape no client can send (an empty
// extra value list, an object without apiVersion or metadata, a CONNECT subresource) unless it
// is listed here.

const P = "policy.test.mjs";
const PS = "policies.test.mjs";
const NODE_POLICY = "the agent creates its GPUNode with exactly one owner reference, to its own v1 Node";
const BARE_METAL = "a bare-metal agent is bound to its node by its user name";
const F1_OWN = "F1 A9: the agent in a pod may create its own node's GPUNode and patch its status";
const F9 = "F9: adding the usage-monitor key in a tenant namespace is refused for every caller";
const F12 = "F12: the usage-monitor expressions read only metadata and never error";
const F14 = "F14: a GPU-requesting pod needs kubevirt-controller and a VMI owner";
const F18 = "F18: a namespace with a tenant.cozystack.io/ label must carry the tenant-namespace label";
const BROKEN_NAMESPACE = {
  check: "setup-refused", message: "gpu-tenant-namespace-label",
  why: "the stored namespace carries a tenant.cozystack.io/ label without the tenant-namespace " +
    "label: the very policy under test refuses to store it, so only a namespace made before the " +
    "chart was installed can be in that state",
};

const DEVICES_WITHOUT_IDS = {
  check: "refused-before-admission", message: "status\\.devices\\[0\\]\\.vendorID: Required value",
  why: "the case's GPUNode status lists a device without the vendorID, deviceID and classCode " +
    "the GPUNode CRD requires: the API server refuses the status write before admission",
};
const NO_NAME = {
  check: "refused-before-admission", message: "name or generateName is required",
  why: "the GPUNode has neither name nor generateName: the API server refuses it before " +
    "admission, so the policy's 'generated name' message cannot be reached this way",
};
const DUPLICATE_OWNERS = {
  check: "allowed-instead",
  why: "two identical owner references: the API server removes the duplicate before admission " +
    "(and warns), so the policy sees exactly one owner reference, to the Node: allowed",
};
const DEPLOYMENT_WITHOUT_SPEC = {
  check: "refused-before-admission", message: "spec\\.selector: Required value",
  why: "the case's Deployment has no spec: the API server refuses it before admission",
};
const REQUEST_WITHOUT_LIMIT = {
  check: "refused-before-admission",
  message: "Limit must be set for non overcommitable resources",
  why: "the case's pod requests a GPU resource without a limit: the API server refuses an " +
    "extended resource request without an equal limit before admission",
};
const DUPLICATE_CONTAINER = {
  check: "refused-before-admission", message: "Duplicate value: \"c0\"",
  why: "the case's pod has an init container named like its container (c0): the API server " +
    "refuses it before admission",
};

export const NOT_REPLAYED = {
  // --- policy.test.mjs (the node-bound policy) ---
  [`${P} › ${F1_OWN} › status patch`]: DEVICES_WITHOUT_IDS,
  [`${P} › ${F1_OWN} › status patch without conditions`]: {
    ...DEVICES_WITHOUT_IDS, message: "status\\.devices\\[0\\]\\.pciAddress: Required value" },
  [`${P} › F1 A9: the agent on n1 writing n2's GPUNode is refused, and told why › generateName`]:
    NO_NAME,
  [`${P} › F2: credentials without the node-name extra are refused › empty list`]: {
    check: "unsendable",
    why: "the node-name extra with an empty list of values: impersonation headers (and every " +
      "authenticator) carry a key only with at least one value",
  },
  [`${P} › ${NODE_POLICY} › two`]: DUPLICATE_OWNERS,
  [`${P} › A8: the agent may not change the binder's status.conditions › conditions kept`]: {
    ...DEVICES_WITHOUT_IDS, message: "status\\.devices\\[0\\]\\.pciAddress: Required value" },
  [`${P} › the agent updates its GPUNode only through /status; every subresource is matched › scale of n2`]: {
    check: "refused-before-admission", message: "not found",
    why: "the GPUNode CRD has no scale subresource: the API server answers 404 before admission",
  },
  [`${P} › ${BARE_METAL} › status patch`]: DEVICES_WITHOUT_IDS,
  [`${P} › ${BARE_METAL} › empty node name`]: { ...NO_NAME,
    why: "the GPUNode (and its owner reference) has an empty name: the API server refuses it " +
      "before admission" },
  [`${P} › requests for other resources are outside the policy › a pod update`]: {
    check: "unsendable", why: "the pod and its stored object are empty ({}): no such object " +
      "can be stored or sent",
  },
  // --- policies.test.mjs ---
  ...Object.fromEntries(["GPUs off", "GPUs on"].flatMap((render) => [
    ...["kubernetes-admin", "system:serviceaccount:cozy-system:cozystack-controller", "alice",
      "system:serviceaccount:cozy-kubevirt:kubevirt-controller"].map((user) =>
      [`${PS} › ${F9} › ${render}: ${user} creates a Deployment`, DEPLOYMENT_WITHOUT_SPEC]),
    [`${PS} › ${F12} › ${render}: scale`, {
      check: "setup-refused", message: "spec\\.selector: Required value",
      why: "the stored Deployment whose scale is written has no spec: the API server does not " +
        "store it",
    }],
    [`${PS} › ${F12} › ${render}: no metadata`, {
      check: "unsendable",
      why: "pods/exec is a CONNECT, never a CREATE, and takes no PodExecOptions body: no client " +
        "sends this request (and a CONNECT does not match the policy's operations)",
    }],
    [`${PS} › ${F12} › ${render}: neither with metadata`, {
      check: "unsendable",
      why: "a pod update whose object and stored object have no metadata: no such object can " +
        "be stored or sent",
    }],
    [`${PS} › ${F14} › ${render}: second container requests`, REQUEST_WITHOUT_LIMIT],
    [`${PS} › ${F14} › ${render}: migration target`, REQUEST_WITHOUT_LIMIT],
    [`${PS} › ${F14} › ${render}: init container`, DUPLICATE_CONTAINER],
    [`${PS} › ${F18} › ${render}: a broken namespace fixed`, BROKEN_NAMESPACE],
    [`${PS} › ${F18} › ${render}: a broken namespace being deleted`, BROKEN_NAMESPACE],
  ])),
};
