// Records the cases the policy tests assert, so realserver.test.mjs can send each one to a real
// kube-apiserver (docs/policies.md, "On a real API server"). Off unless the environment variable
// COZY_RECORD_POLICY_CASES names a file; then every recorded case is appended to it as one JSON
// line. Recording only writes down what a test asserts: it never changes a result.
//
// A case is
//   {source, test, what, id, render, scope, request, object, oldObject, cluster, expect,
//    evaluator}
// - source, test, what: the test file, the node:test test it belongs to, the assertion's text;
//   id: "source › test › what", with " #N" added to the Nth repetition of the same text;
// - render: "off" or "on", the chart rendered with GPUs off (its default values) or on
//   (gpu-on-values.yaml), whose policies the case was decided by;
// - scope: null when every binding of the render decided the case (admitAll), or the one
//   policy's name when the test evaluated only that policy (admit);
// - request, object, oldObject: the write as admission.mjs saw it (request is the
//   AdmissionRequest: userInfo {username, uid, groups, extra}, operation, subResource,
//   namespace, name, resource, kind);
// - cluster: what the case assumed of the cluster: {namespaces: {name: Namespace}, objects:
//   [the parameter objects: the settings ConfigMap, GPUClasses]};
// - expect: {allowed: true}, or {allowed: false, policy, pattern: {source, flags}} where the
//   denial of `policy` (its binding's, in the form kube-apiserver words it:
//   "ValidatingAdmissionPolicy 'P' with binding 'B' denied request: MESSAGE") matches pattern;
// - evaluator: what admission.mjs decided: {allowed, denials: [{binding, denial}], errors}.
import { appendFileSync } from "node:fs";
import path from "node:path";

const FILE = process.env.COZY_RECORD_POLICY_CASES || "";
export const recording = FILE !== "";

let current = "";
const seen = new Map();

// node:test's test(), remembering which test is running so its cases can be named. Test
// bodies here are synchronous and run one after the other.
export function recordingTest(nodeTest) {
  if (!recording) return nodeTest;
  return (name, ...rest) => {
    const fn = rest.pop();
    return nodeTest(name, ...rest, (...args) => {
      current = name;
      try {
        return fn(...args);
      } finally {
        current = "";
      }
    });
  };
}

const regex = (pattern) => ({ source: pattern.source, flags: pattern.flags });

// recordCase({source, what, render, scope, write, cluster, pattern, policy, allowed, result}):
// one assertion. result is what admit()/admitAll() returned.
export function recordCase({ source, what, render, scope = null, write, cluster = {}, allowed,
  policy = null, pattern = null, result }) {
  if (!recording) return;
  const base = `${path.basename(source)} › ${current} › ${what}`;
  const n = (seen.get(base) ?? 0) + 1;
  seen.set(base, n);
  const decisions = result.decisions ??
    [{ binding: scope, ...result }];
  const entry = {
    source: path.basename(source), test: current, what, id: n === 1 ? base : `${base} #${n}`,
    render, scope,
    request: write.request, object: write.object ?? null, oldObject: write.oldObject ?? null,
    cluster: { namespaces: cluster.namespaces ?? {}, objects: cluster.objects ?? [] },
    expect: allowed ? { allowed: true } :
      { allowed: false, policy, pattern: pattern ? regex(pattern) : null },
    evaluator: {
      allowed: result.allowed,
      denials: decisions.filter((d) => !d.allowed).map((d) => ({ binding: d.binding,
        denial: d.denial })),
      errors: decisions.flatMap((d) => d.errors ?? []),
    },
  };
  appendFileSync(FILE, JSON.stringify(entry) + "\n");
}
