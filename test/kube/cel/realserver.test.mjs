// The policy tests' cases sent to a real kube-apiserver (docs/policies.md, "On a real API
// server"), so that what decides allow or deny is the API server's own admission chain and CEL,
// not admission.mjs. policies.test.mjs and policy.test.mjs record every case they assert
// (record.mjs, COZY_RECORD_POLICY_CASES); this replays each one:
//
// 1. the chart installed by real helm into the release namespace, GPUs off (its default values),
//    later upgraded with gpu-on-values.yaml, the renders the node tests decided on; the
//    webhook configurations of the GPUs-on render removed (no controller serves them here: they
//    would refuse every order; the policies are what is replayed); every policy waited for
//    (status.observedGeneration), then one refusal per policy retried until the API server
//    refuses it (its policy informer, and the parameter informers, have caught up);
// 2. per case, as the cluster's admin: the namespaces with the case's labels, the parameter
//    objects the case assumed (the settings ConfigMap, GPUClasses; a deleting one is created
//    with its blocking finalizer and deleted), the stored object of an UPDATE or DELETE (status
//    through /status; created with the namespace briefly out of the tenant selector where the
//    chart's own usage-monitor policy would refuse it);
// 3. the case's write as the case's caller, through impersonation (Impersonate-User, one
//    Impersonate-Group per group, Impersonate-Extra-<key> per value, Impersonate-Uid), with
//    dryRun=All, and the answer compared with what the node test asserted: allowed is a 2xx;
//    refused is a 403/422 naming a ValidatingAdmissionPolicy whose denial is, word for word, the
//    one admission.mjs gave for that binding, and matches the test's pattern when it names the
//    expected policy.
//
// The cases the real server cannot be sent faithfully are listed by id, with the reason, in
// realserver-not-replayed.mjs; each is still checked to be what the list says (e.g. refused by
// the schema before admission) and named in the output. A recorded case neither replayed nor
// listed, or a listed one not recorded, fails the run.
//
// Environment: COZY_RECORDED_POLICY_CASES (the recording, JSON lines), COZY_REAL_CLUSTER_DIR
// (scripts/cluster.sh's directory: kubeconfig, admin client certificate), COZY_HELM (default:
// helm on PATH), COZY_RELEASE_NAMESPACE (default gpu-system). Everything it creates is removed
// at the end, the chart's CRDs included, whatever happened.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { readFileSync, readdirSync } from "node:fs";
import { execFileSync } from "node:child_process";
import https from "node:https";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { isDeepStrictEqual } from "node:util";
import { setTimeout as sleep } from "node:timers/promises";

let parseAllDocuments, parseDocument, NOT_REPLAYED;
try {
  ({ parseAllDocuments, parseDocument } = await import("yaml"));
  ({ NOT_REPLAYED } = await import("./realserver-not-replayed.mjs"));
} catch (error) {
  console.error("realserver test: npm packages missing; run scripts/install-deps.sh " +
    "(npm ci --prefix test/kube/cel): " + error.message);
  process.exit(1);
}

const env = (name, fallback) => {
  const value = process.env[name] || fallback;
  if (!value) {
    console.error(`realserver test: ${name} must be set (ctest sets it)`);
    process.exit(1);
  }
  return value;
};
const HERE = path.dirname(fileURLToPath(import.meta.url));
const SOURCE_DIR = path.resolve(HERE, "../../..");
const CHART = path.join(SOURCE_DIR, "charts/gpu");
const GPU_ON_VALUES = path.join(HERE, "gpu-on-values.yaml");
const CLUSTER_DIR = env("COZY_REAL_CLUSTER_DIR");
const KUBECONFIG = path.join(CLUSTER_DIR, "kubeconfig");
const HELM = env("COZY_HELM", "helm");
const RELEASE_NS = env("COZY_RELEASE_NAMESPACE", "gpu-system");
const CASES = readFileSync(env("COZY_RECORDED_POLICY_CASES"), "utf8").split("\n")
  .filter((line) => line.trim() !== "").map((line) => JSON.parse(line));
// The test-only CRDs of the kinds the cases write that neither Kubernetes nor the chart
// serves: KubeVirt's VMI (test/fakes/crds), CDI's DataVolume, and cert-manager's Certificate
// and Issuer, which the GPUs-on render creates.
const TEST_CRD_FILES = [path.join(SOURCE_DIR, "test/fakes/crds/kubevirt.io_virtualmachineinstances.yaml"),
  ...readdirSync(path.join(HERE, "crds")).map((f) => path.join(HERE, "crds", f))];
const CHART_CRDS = ["gpuclasses.gpu.cozystack.io", "gpudevices.gpu.cozystack.io",
  "gpunodes.gpu.cozystack.io"];
const CALLERS_BINDING = "cozy-policy-replay-callers";
const PREEXISTING_NAMESPACES = new Set(["default", "kube-system", "kube-public", "kube-node-lease"]);

// --- The API server, as the cluster's admin --------------------------------------------------

const kubeconfig = parseDocument(readFileSync(KUBECONFIG, "utf8")).toJS();
const SERVER = kubeconfig.clusters[0].cluster.server;
const b64 = (s) => Buffer.from(s, "base64");
const agent = new https.Agent({
  ca: b64(kubeconfig.clusters[0].cluster["certificate-authority-data"]),
  cert: b64(kubeconfig.users[0].user["client-certificate-data"]),
  key: b64(kubeconfig.users[0].user["client-key-data"]),
  keepAlive: true, maxSockets: 4,
});

// call(METHOD, PATH, {body, headers, contentType}) → {status, body (parsed JSON or null), text}
function call(method, urlPath, { body, headers = {}, contentType = "application/json" } = {}) {
  const url = new URL(urlPath, SERVER);
  const data = body === undefined ? undefined : JSON.stringify(body);
  return new Promise((resolve, reject) => {
    const req = https.request(url, {
      method, agent, timeout: 30000,
      headers: { Accept: "application/json", ...(data ? { "Content-Type": contentType,
        "Content-Length": Buffer.byteLength(data) } : {}), ...headers },
    }, (res) => {
      const chunks = [];
      res.on("data", (c) => chunks.push(c));
      res.on("end", () => {
        const text = Buffer.concat(chunks).toString("utf8");
        let json = null;
        try { json = JSON.parse(text); } catch { /* not JSON */ }
        resolve({ status: res.statusCode, body: json, text });
      });
    });
    req.on("timeout", () => req.destroy(new Error(`${method} ${urlPath}: timed out`)));
    req.on("error", reject);
    if (data) req.write(data);
    req.end();
  });
}
const ok = (res) => res.status >= 200 && res.status < 300;
const describe = (res) => `${res.status} ${res.body?.message ?? res.text.slice(0, 300)}`;
async function must(method, urlPath, options, what = `${method} ${urlPath}`) {
  const res = await call(method, urlPath, options);
  if (!ok(res)) throw new Error(`${what}: ${describe(res)}`);
  return res.body;
}
async function until(seconds, what, fn) {
  const deadline = Date.now() + seconds * 1000;
  for (;;) {
    const value = await fn();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`${what}: not within ${seconds} s`);
    await sleep(200);
  }
}

function helm(...args) {
  try {
    return execFileSync(HELM, [...args, "--kubeconfig", KUBECONFIG], { encoding: "utf8",
      stdio: ["ignore", "pipe", "pipe"] });
  } catch (error) {
    throw new Error(`helm ${args.join(" ")}: ${error.stderr || error.message}`);
  }
}

// --- Resources and URLs ----------------------------------------------------------------------

const groupPath = ({ group, version }) => (group ? `/apis/${group}/${version}` : `/api/${version}`);
function collectionUrl(resource, namespace) {
  return `${groupPath(resource)}${namespace ? `/namespaces/${namespace}` : ""}/${resource.resource}`;
}
const objectUrl = (resource, namespace, name, subResource = "") =>
  `${collectionUrl(resource, namespace)}/${encodeURIComponent(name)}${subResource ? `/${subResource}` : ""}`;

// The resource serving KIND of APIVERSION, from discovery (cached once found).
const discovered = new Map();
async function resourceFor(apiVersion, kind) {
  const key = `${apiVersion}/${kind}`;
  if (discovered.has(key)) return discovered.get(key);
  const [group, version] = apiVersion.includes("/") ? apiVersion.split("/") : ["", apiVersion];
  const list = await must("GET", groupPath({ group, version }));
  const found = list.resources.find((r) => r.kind === kind && !r.name.includes("/"));
  if (!found) throw new Error(`no resource serves ${key}`);
  const resource = { group, version, resource: found.name, namespaced: found.namespaced };
  discovered.set(key, resource);
  return resource;
}

// What the API server sets itself, or refuses from a client, in an object it is sent.
const SERVER_FIELDS = ["uid", "resourceVersion", "creationTimestamp", "generation", "managedFields",
  "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"];
// A case's Pod goes to a scheduler no one runs: the cluster's kube-scheduler would otherwise write
// its status (PodScheduled) between the stored object's creation and the case's update (a 409).
const NO_SCHEDULER = "cozy-test-no-scheduler";
function sendable(object) {
  const copy = structuredClone(object);
  if (copy?.metadata) for (const field of SERVER_FIELDS) delete copy.metadata[field];
  if (copy?.kind === "Pod" && copy.spec && !copy.spec.nodeName && !copy.spec.schedulerName) {
    copy.spec.schedulerName = NO_SCHEDULER;
  }
  return copy;
}

// --- What the run created, removed again at the end --------------------------------------------

const created = new Map(); // url -> true, objects created as admin (finalizers stripped at the end)
const createdNamespaces = new Set();
const originalNamespaceLabels = new Map();

async function stripFinalizers(url) {
  const res = await call("PATCH", url, { body: { metadata: { finalizers: null } },
    contentType: "application/merge-patch+json" });
  return res.status === 404 || ok(res) ? res : Promise.reject(new Error(`${url}: ${describe(res)}`));
}
// Gone for good: finalizers dropped, deleted, and no longer found.
async function remove(url) {
  if ((await call("GET", url)).status === 404) {
    created.delete(url);
    return;
  }
  await stripFinalizers(url);
  const res = await call("DELETE", `${url}?gracePeriodSeconds=0`);
  if (!ok(res) && res.status !== 404) throw new Error(`DELETE ${url}: ${describe(res)}`);
  await until(30, `${url} deleted`, async () => (await call("GET", url)).status === 404);
  created.delete(url);
}

// --- The cluster a case assumed ---------------------------------------------------------------

// A policy of the replay's own shows what admission sees of a namespace: it refuses a ConfigMap
// of its name, saying the namespace's labels (admission reads namespaces from an informer, so a
// label change reaches it a moment later). Nothing else matches it.
const PROBE = "cozy-replay-namespace-probe";
const PROBE_POLICY = {
  apiVersion: "admissionregistration.k8s.io/v1", kind: "ValidatingAdmissionPolicy",
  metadata: { name: PROBE },
  spec: {
    failurePolicy: "Fail",
    matchConstraints: { resourceRules: [{ apiGroups: [""], apiVersions: ["v1"],
      operations: ["CREATE"], resources: ["configmaps"] }] },
    matchConditions: [{ name: "probe", expression: `object.metadata.name == '${PROBE}'` }],
    validations: [{ expression: "false", messageExpression: "'labels: ' + " +
      "(has(namespaceObject.metadata.labels) ? namespaceObject.metadata.labels.map(k, k + '=' + " +
      "namespaceObject.metadata.labels[k]).join(',') : '')" }],
  },
};
const PROBE_BINDING = {
  apiVersion: "admissionregistration.k8s.io/v1", kind: "ValidatingAdmissionPolicyBinding",
  metadata: { name: PROBE }, spec: { policyName: PROBE, validationActions: ["Deny"] },
};
// Until admission sees namespace NAME with exactly LABELS.
async function namespaceSeenAs(name, labels) {
  const want = Object.entries(labels).map(([k, v]) => `${k}=${v}`).sort().join(",");
  let seen = "";
  try {
    await until(15, `admission seeing namespace ${name}'s labels`, async () => {
      const res = await call("POST", `/api/v1/namespaces/${name}/configmaps?dryRun=All`, {
        body: { apiVersion: "v1", kind: "ConfigMap", metadata: { name: PROBE, namespace: name } } });
      const m = / denied request: labels: (.*)$/.exec(res.body?.message ?? "");
      seen = m ? m[1].split(",").filter(Boolean).sort().join(",") : describe(res);
      return seen === want;
    });
  } catch (error) {
    throw new Error(`${error.message}: wanted ${want}, last seen ${seen}`);
  }
}

const namespaceLabels = new Map(); // name -> labels as set now
async function setNamespaceLabels(name, labels) {
  const url = `/api/v1/namespaces/${name}`;
  const current = await call("GET", url);
  if (current.status === 404) {
    await must("POST", "/api/v1/namespaces", { body: { apiVersion: "v1", kind: "Namespace",
      metadata: { name, labels } } });
    createdNamespaces.add(name);
  } else {
    if (!ok(current)) throw new Error(`GET ${url}: ${describe(current)}`);
    if (!originalNamespaceLabels.has(name)) {
      originalNamespaceLabels.set(name, current.body.metadata.labels ?? {});
    }
    const ns = current.body;
    // kubernetes.io/metadata.name is the API server's own, always there.
    ns.metadata.labels = { ...labels, "kubernetes.io/metadata.name": name };
    await must("PUT", url, { body: ns });
  }
  namespaceLabels.set(name, JSON.stringify(labels));
  await namespaceSeenAs(name, { ...labels, "kubernetes.io/metadata.name": name });
}
async function ensureNamespaces(namespaces) {
  for (const [name, ns] of Object.entries(namespaces)) {
    const labels = { ...(ns.metadata?.labels ?? {}) };
    delete labels["kubernetes.io/metadata.name"];
    if (namespaceLabels.get(name) !== JSON.stringify(labels)) await setNamespaceLabels(name, labels);
  }
}

// The owner a stored object names, there for real (a minimal object of that kind and name), so
// the garbage collector does not delete the stored object as an orphan. Its uid is the
// server's, like every uid.
async function ensureOwner(ref, namespace) {
  const resource = await resourceFor(ref.apiVersion, ref.kind);
  const url = objectUrl(resource, resource.namespaced ? namespace : "", ref.name);
  const found = await call("GET", url);
  if (ok(found)) return found.body;
  const owner = await must("POST", collectionUrl(resource, resource.namespaced ? namespace : ""),
    { body: { apiVersion: ref.apiVersion, kind: ref.kind, metadata: { name: ref.name } } },
    `creating the owner ${ref.kind} ${ref.name}`);
  created.set(url, true);
  return owner;
}

// Creates OBJECT as admin, with its status (through /status where it is a subresource) and,
// when it carries a deletionTimestamp, deleted behind its finalizers. A write the chart's own
// policies refuse (the usage-monitor label in a tenant namespace) is made with the namespace
// out of the policies' selector for that moment. Returns the stored object.
async function createAsAdmin(object, namespaces) {
  const resource = await resourceFor(object.apiVersion, object.kind);
  const ns = resource.namespaced ? object.metadata.namespace : "";
  const url = objectUrl(resource, ns, object.metadata.name);
  await remove(url);
  const body = sendable(object);
  for (const ref of body.metadata.ownerReferences ?? []) ref.uid = (await ensureOwner(ref, ns)).metadata.uid;
  let res = await call("POST", collectionUrl(resource, ns), { body });
  if (!ok(res) && ns && /ValidatingAdmissionPolicy '/.test(res.body?.message ?? "")) {
    const labels = namespaces?.[ns]?.metadata?.labels ?? {};
    await setNamespaceLabels(ns, {});
    try {
      res = await until(10, `creating ${url} outside the tenant selector`, async () => {
        const r = await call("POST", collectionUrl(resource, ns), { body });
        return ok(r) || !/ValidatingAdmissionPolicy '/.test(r.body?.message ?? "") ? r : null;
      });
    } finally {
      await setNamespaceLabels(ns, labels);
    }
  }
  if (!ok(res)) return { error: `creating the stored object: ${describe(res)}` };
  created.set(url, true);
  let stored = res.body;
  if (object.status && !isDeepStrictEqual(stored.status ?? {}, object.status)) {
    const withStatus = { ...stored, status: object.status };
    const st = await call("PUT", `${url}/status`, { body: withStatus });
    if (!ok(st)) return { error: `writing the stored object's status: ${describe(st)}` };
    stored = st.body;
  }
  if (object.metadata.deletionTimestamp) {
    if (!(object.metadata.finalizers ?? []).length) {
      return { error: "a deleting object without a finalizer would be gone" };
    }
    await must("DELETE", url);
    stored = await must("GET", url);
    if (!stored.metadata.deletionTimestamp) return { error: "deleted, but no deletionTimestamp" };
  }
  return { stored, url };
}

// The parameter objects: every object of any case's cluster.objects is managed; a case's state
// is its own set of them, created exactly as recorded, the others absent.
const paramsNow = new Map(); // key -> JSON of the object as created
const keyOf = (o) => `${o.apiVersion}/${o.kind}/${o.metadata.namespace ?? ""}/${o.metadata.name}`;
const managedParams = new Map();
for (const c of CASES) for (const o of c.cluster.objects) managedParams.set(keyOf(o), o);
async function ensureParams(objects, namespaces) {
  const wanted = new Map(objects.map((o) => [keyOf(o), o]));
  let changed = false;
  for (const [key, sample] of managedParams) {
    const want = wanted.get(key);
    if (want && paramsNow.get(key) === JSON.stringify(want)) continue;
    if (!want && !paramsNow.has(key)) continue;
    changed = true;
    const resource = await resourceFor(sample.apiVersion, sample.kind);
    const url = objectUrl(resource, resource.namespaced ? sample.metadata.namespace : "",
      sample.metadata.name);
    await remove(url);
    paramsNow.delete(key);
    if (want) {
      const made = await createAsAdmin(want, namespaces);
      if (made.error) throw new Error(`parameter ${key}: ${made.error}`);
      paramsNow.set(key, JSON.stringify(want));
    }
  }
  // The parameter informers see the change within milliseconds; a second is plenty.
  if (changed) await sleep(1000);
}

// --- One case -----------------------------------------------------------------------------------

// The impersonation headers of the case's caller. Groups always travel (system:authenticated
// alone where the case had none: every authenticated request carries it, and a service
// account's name without groups would otherwise get that account's groups).
function impersonation(userInfo) {
  const headers = { "Impersonate-User": userInfo.username };
  const groups = userInfo.groups?.length ? userInfo.groups : ["system:authenticated"];
  headers["Impersonate-Group"] = groups;
  for (const [key, values] of Object.entries(userInfo.extra ?? {})) {
    headers[`Impersonate-Extra-${encodeURIComponent(key)}`] = values;
  }
  if (userInfo.uid) headers["Impersonate-Uid"] = userInfo.uid;
  return headers;
}

// Sets up the case's cluster and stored object. Returns {stored, url} or {error}.
async function setUp(c) {
  await ensureNamespaces(c.cluster.namespaces);
  await ensureParams(c.cluster.objects, c.cluster.namespaces);
  const r = c.request;
  if (r.operation === "CREATE" && r.subResource === "eviction") {
    // An eviction names its pod: a plain one of that name is there to be evicted.
    return createAsAdmin({ apiVersion: "v1", kind: "Pod", metadata: { name: r.name,
      namespace: r.namespace }, spec: { containers: [{ name: "c", image: "x" }] } },
    c.cluster.namespaces);
  }
  if (r.operation === "CREATE") return {};
  return createAsAdmin(c.oldObject, c.cluster.namespaces);
}

async function send(c, stored) {
  const r = c.request;
  const resource = r.resource;
  const headers = impersonation(r.userInfo);
  if (r.operation === "CREATE") {
    const url = r.subResource ? objectUrl(resource, r.namespace, r.name, r.subResource)
      : collectionUrl(resource, r.namespace);
    return call("POST", `${url}?dryRun=All`, { body: sendable(c.object), headers });
  }
  const url = objectUrl(resource, r.namespace, r.name, r.subResource);
  if (r.operation === "DELETE") return call("DELETE", `${url}?dryRun=All`, { headers });
  const body = sendable(c.object);
  body.metadata.resourceVersion = stored.metadata.resourceVersion;
  return call("PUT", `${url}?dryRun=All`, { body, headers });
}

const DENIAL = /ValidatingAdmissionPolicy '([^']*)' with binding '([^']*)' denied request: [\s\S]*$/;
function outcome(res) {
  if (ok(res)) return { allowed: true, status: res.status, text: `${res.status}` };
  const message = res.body?.message ?? res.text;
  const m = DENIAL.exec(message);
  return { allowed: false, status: res.status, message, policy: m?.[1], binding: m?.[2],
    denial: m?.[0], text: `${res.status} ${message}` };
}
const patternOf = (p) => (p ? new RegExp(p.source, p.flags) : null);

// null when the server's answer is the one the node test asserted, else what differs.
function difference(c, got) {
  const expected = c.expect.allowed ? "allowed" :
    `refused by ${c.expect.policy} matching ${patternOf(c.expect.pattern)}`;
  const differs = (why) => `expected ${expected}; got ${got.text}${why ? ` (${why})` : ""}`;
  if (c.expect.allowed) return got.allowed ? null : differs();
  if (got.allowed) return differs();
  if (!got.policy) return differs("not a policy's denial");
  if (![403, 422].includes(got.status)) return differs("status is not 403 or 422");
  const theirs = c.evaluator.denials.find((d) => d.binding === got.binding);
  if (!theirs) return differs(`admission.mjs allowed binding ${got.binding}`);
  if (theirs.denial !== got.denial) {
    return differs(`admission.mjs worded binding ${got.binding}'s denial "${theirs.denial}"`);
  }
  if (got.policy === c.expect.policy && !patternOf(c.expect.pattern).test(got.denial)) {
    return differs("the pattern does not match");
  }
  return null;
}

// The case sent until the answer is the expected one (informers catching up with a change
// made just before), for at most `seconds`. Returns {got, tries, diff}.
async function replay(c, seconds = 3) {
  const set = await setUp(c);
  if (set.error) return { setupError: set.error };
  try {
    const deadline = Date.now() + seconds * 1000;
    for (let tries = 1; ; tries++) {
      const got = outcome(await send(c, set.stored));
      const diff = difference(c, got);
      if (!diff || Date.now() > deadline) return { got, tries, diff };
      await sleep(250);
    }
  } finally {
    if (set.url) await remove(set.url);
  }
}

// --- The renders ---------------------------------------------------------------------------------

// Every expression of the installed policies: what the replay normalises (dryRun, the
// server-set metadata, system:authenticated) must be read by none of them.
async function policyExpressions() {
  const list = await must("GET", "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies");
  return list.items.filter((p) => p.metadata.name !== PROBE).flatMap((p) => [...(p.spec.matchConditions ?? []), ...(p.spec.variables ?? []),
    ...(p.spec.validations ?? [])].flatMap((e) => [e.expression, e.messageExpression ?? ""]));
}

async function waitForPolicies(expectedNames) {
  const url = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies";
  await until(60, "every policy type-checked for its generation", async () => {
    const list = await must("GET", url);
    const names = list.items.map((p) => p.metadata.name).filter((n) => n !== PROBE).sort();
    return isDeepStrictEqual(names, expectedNames) && list.items.every((p) =>
      p.status?.observedGeneration === p.metadata.generation);
  });
}

const ordered = (render) => {
  // Grouped by the parameters they assume, in recorded order within a group, so the
  // parameter objects change as seldom as possible.
  const cases = CASES.filter((c) => c.render === render);
  const groups = new Map();
  for (const c of cases) {
    const key = JSON.stringify(c.cluster.objects);
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push(c);
  }
  return [...groups.values()].flat();
};

// What a listed case is checked to be (realserver-not-replayed.mjs).
async function checkNotReplayed(c, entry) {
  if (entry.check === "unsendable") return null;
  const set = await setUp(c);
  try {
    if (entry.check === "setup-refused") {
      if (!set.error) return "its stored object was created after all: replay it";
      return entry.message && !new RegExp(entry.message).test(set.error)
        ? `setup refused, but not for /${entry.message}/: ${set.error}` : null;
    }
    if (set.error) return `setup failed: ${set.error}`;
    const got = outcome(await send(c, set.stored));
    if (entry.check === "refused-before-admission") {
      if (got.allowed || got.policy) return `expected a refusal before admission, got ${got.text}`;
      return entry.message && !new RegExp(entry.message).test(got.message)
        ? `refused, but not for /${entry.message}/: ${got.text}` : null;
    }
    if (entry.check === "allowed-instead") {
      // The API server's own handling makes the asserted refusal impossible: it allows.
      return got.allowed ? null : `expected the API server to allow it, got ${got.text}`;
    }
    return `unknown check ${entry.check}`;
  } finally {
    if (set.url) await remove(set.url);
  }
}

async function renderCases(t, render, policies) {
  const cases = ordered(render);
  // Warm-up: per policy, one of its refusals until the API server gives it.
  for (const name of policies) {
    // A refusal with parameters there, where there is one: it shows them found too.
    const refusals = cases.filter((c) => !NOT_REPLAYED[c.id] && !c.expect.allowed &&
      c.expect.policy === name);
    const probe = refusals.find((c) => c.cluster.objects.length > 0) ?? refusals[0];
    if (!probe) continue;
    const result = await replay(probe, 60);
    if (result.setupError || result.diff) {
      // kube-apiserver's shared ConfigMap informer, once the last policy taking ConfigMap
      // parameters is removed, is never run again in that process (kubernetes/kubernetes
      // #133827): every binding then finds no parameter, whatever exists.
      const deadInformer = probe.cluster.objects.some((o) => o.kind === "ConfigMap") &&
        /no params found/.test(result.diff ?? "") && !/no params found/.test(probe.expect.pattern?.source ?? "");
      throw new Error(`${render}: policy ${name} never refused ${probe.id} within 60 s: ` +
        (result.setupError ?? result.diff) + (deadInformer ? ". The settings ConfigMap " +
        "exists, yet the binding finds no parameter: this kube-apiserver removed every policy " +
        "taking ConfigMap parameters earlier (the chart uninstalled by another test?) and never " +
        "restarts its ConfigMap informer (kubernetes/kubernetes#133827); run this test on an " +
        "API server where that has not happened (docs/policies.md)" : ""));
    }
  }
  let slow = 0;
  for (const c of cases) {
    const entry = NOT_REPLAYED[c.id];
    if (entry) {
      await t.test(`not replayed: ${c.id}`, async (st) => {
        st.diagnostic(`why: ${entry.why}`);
        const wrong = await checkNotReplayed(c, entry);
        assert.equal(wrong, null, `${c.id} is listed as not replayable (${entry.check}), but ${wrong}`);
      });
      continue;
    }
    await t.test(c.id, async (st) => {
      const result = await replay(c);
      assert.equal(result.setupError, undefined, `${c.id}: ${result.setupError} ` +
        "(list it in realserver-not-replayed.mjs if the real server cannot hold it)");
      if (result.tries > 1 && !result.diff) {
        slow++;
        st.diagnostic(`the expected answer came at try ${result.tries}`);
      }
      assert.equal(result.diff, null, `${c.id}: ${result.diff}`);
    });
  }
  if (slow) t.diagnostic(`${slow} case(s) got their answer only on a retry`);
}

// --- The run --------------------------------------------------------------------------------------

const renderPolicies = (render) => [...new Set(CASES.filter((c) => c.render === render)
  .flatMap((c) => [c.expect.policy, ...c.evaluator.denials.map((d) => d.binding)])
  .filter(Boolean))];

before(async () => {
  await must("GET", "/version");
  // The test-only CRDs, Established.
  for (const file of TEST_CRD_FILES) {
    const crd = parseAllDocuments(readFileSync(file, "utf8")).map((d) => d.toJS()).find(Boolean);
    const url = `/apis/apiextensions.k8s.io/v1/customresourcedefinitions/${crd.metadata.name}`;
    if ((await call("GET", url)).status === 404) {
      await must("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", { body: crd });
    }
    created.set(url, true);
    await until(60, `${crd.metadata.name} Established`, async () =>
      (await must("GET", url)).status?.conditions?.some((x) => x.type === "Established" &&
        x.status === "True"));
  }
  // RBAC lets every caller of the cases write anything: what is tested is admission.
  const users = [...new Set(CASES.map((c) => c.request.userInfo.username))].sort();
  const bindingUrl = `/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/${CALLERS_BINDING}`;
  await call("DELETE", bindingUrl);
  await must("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", { body: {
    apiVersion: "rbac.authorization.k8s.io/v1", kind: "ClusterRoleBinding",
    metadata: { name: CALLERS_BINDING },
    roleRef: { apiGroup: "rbac.authorization.k8s.io", kind: "ClusterRole", name: "cluster-admin" },
    subjects: users.map((name) => ({ apiGroup: "rbac.authorization.k8s.io", kind: "User", name })),
  } });
  created.set(bindingUrl, true);
  // The namespace probe, answering.
  const admission = "/apis/admissionregistration.k8s.io/v1";
  for (const [kind, object] of [["validatingadmissionpolicies", PROBE_POLICY],
    ["validatingadmissionpolicybindings", PROBE_BINDING]]) {
    await call("DELETE", `${admission}/${kind}/${PROBE}`);
    await must("POST", `${admission}/${kind}`, { body: object });
    created.set(`${admission}/${kind}/${PROBE}`, true);
  }
  const ns = await must("GET", "/api/v1/namespaces/default");
  await namespaceSeenAs("default", ns.metadata.labels ?? {});
});

after(async () => {
  const problems = [];
  const attempt = async (what, fn) => {
    try { await fn(); } catch (error) { problems.push(`${what}: ${error.message}`); }
  };
  // Objects created as admin (parameters, stored objects), then the chart's custom objects
  // with their finalizers dropped, so neither a namespace nor a CRD waits on one.
  for (const url of [...created.keys()].filter((u) => !u.includes("customresourcedefinitions") &&
    !u.includes("clusterrolebindings"))) {
    await attempt(`removing ${url}`, () => remove(url));
  }
  await attempt("helm uninstall", async () => {
    if (helm("list", "-n", RELEASE_NS, "-q").split("\n").includes("gpu")) {
      helm("uninstall", "gpu", "-n", RELEASE_NS, "--wait");
    }
  });
  for (const crd of CHART_CRDS) {
    const [plural, ...group] = crd.split(".");
    await attempt(`objects of ${crd}`, async () => {
      const list = await call("GET", `/apis/${group.join(".")}/v1alpha1/${plural}`);
      for (const item of ok(list) ? list.body.items : []) {
        const ns = item.metadata.namespace;
        await stripFinalizers(`/apis/${group.join(".")}/v1alpha1${ns ? `/namespaces/${ns}` : ""}/${plural}/${item.metadata.name}`);
      }
    });
  }
  const crdUrls = [...CHART_CRDS.map((n) => `/apis/apiextensions.k8s.io/v1/customresourcedefinitions/${n}`),
    ...[...created.keys()].filter((u) => u.includes("customresourcedefinitions"))];
  for (const url of crdUrls) await attempt(`deleting ${url}`, () => remove(url));
  await attempt("the callers' binding", () =>
    remove(`/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/${CALLERS_BINDING}`));
  for (const [name, labels] of originalNamespaceLabels) {
    await attempt(`namespace ${name}'s labels`, async () => {
      const ns = await must("GET", `/api/v1/namespaces/${name}`);
      ns.metadata.labels = labels;
      await must("PUT", `/api/v1/namespaces/${name}`, { body: ns });
    });
  }
  for (const name of [...createdNamespaces, RELEASE_NS].filter((n) => !PREEXISTING_NAMESPACES.has(n))) {
    await attempt(`namespace ${name}`, async () => {
      const res = await call("DELETE", `/api/v1/namespaces/${name}`);
      if (!ok(res) && res.status !== 404) throw new Error(describe(res));
      await until(90, `namespace ${name} gone`, async () =>
        (await call("GET", `/api/v1/namespaces/${name}`)).status === 404);
    });
  }
  agent.destroy();
  assert.deepEqual(problems, [], "cleaning up the cluster");
});

// Why no client can send the case as recorded, if so.
function unsendable(c) {
  const reasons = [];
  for (const [key, values] of Object.entries(c.request.userInfo.extra ?? {})) {
    if (values.length === 0) reasons.push(`the extra ${key} has no value`);
  }
  for (const [what, o] of [["object", c.object], ["oldObject", c.oldObject]]) {
    if (o && (!o.apiVersion || !o.metadata)) reasons.push(`${what} has no apiVersion or metadata`);
  }
  if (["exec", "attach", "portforward", "proxy"].includes(c.request.subResource)) {
    reasons.push(`${c.request.subResource} is a CONNECT`);
  }
  return reasons;
}

test("the recording and the list of cases not replayed agree", (t) => {
  assert.ok(CASES.length > 0, "no recorded case: run the node tests with COZY_RECORD_POLICY_CASES");
  const ids = new Set(CASES.map((c) => c.id));
  assert.equal(ids.size, CASES.length, "case ids are unique");
  const stale = Object.keys(NOT_REPLAYED).filter((id) => !ids.has(id));
  assert.deepEqual(stale, [], "listed as not replayed, but not recorded");
  for (const c of CASES) {
    assert.ok(["off", "on"].includes(c.render), `${c.id}: render ${c.render}`);
    const reasons = unsendable(c);
    if (reasons.length) {
      assert.ok(NOT_REPLAYED[c.id], `${c.id}: no client can send it (${reasons.join("; ")}): ` +
        "list it in realserver-not-replayed.mjs");
    }
  }
  const listed = CASES.filter((c) => NOT_REPLAYED[c.id]).length;
  t.diagnostic(`${CASES.length} recorded cases: ${CASES.length - listed} replayed, ${listed} ` +
    "not replayed (each named below as 'not replayed: ID', with its reason)");
});

test("GPUs off: the chart installed by helm, every case decided by the API server", async (t) => {
  helm("install", "gpu", CHART, "-n", RELEASE_NS, "--create-namespace");
  const policies = renderPolicies("off");
  await waitForPolicies(expectedPolicies());
  await normalisationsUnread();
  await renderCases(t, "off", policies);
});

test("GPUs on: the chart upgraded with gpu-on-values.yaml, every case decided by the API server", async (t) => {
  helm("upgrade", "gpu", CHART, "-n", RELEASE_NS, "-f", GPU_ON_VALUES);
  // No controller serves the webhooks here, and they fail closed: the policies are replayed.
  for (const kind of ["validatingwebhookconfigurations", "mutatingwebhookconfigurations"]) {
    await remove(`/apis/admissionregistration.k8s.io/v1/${kind}/cozy-gpu`);
  }
  await waitForPolicies(expectedPolicies(GPU_ON_VALUES));
  await normalisationsUnread();
  await sleep(1000);
  await renderCases(t, "on", renderPolicies("on"));
});

// The policies helm renders for these values, by name.
function expectedPolicies(values) {
  const args = ["template", "gpu", CHART, "-n", RELEASE_NS, ...(values ? ["-f", values] : [])];
  let text;
  try {
    // helm template renders for the cluster's version with --validate.
    text = helm(...args, "--validate");
  } catch (error) {
    throw new Error(`helm template: ${error.message}`);
  }
  return parseAllDocuments(text).map((d) => d.toJS())
    .filter((d) => d?.kind === "ValidatingAdmissionPolicy").map((d) => d.metadata.name).sort();
}

async function normalisationsUnread() {
  const expressions = (await policyExpressions()).join("\n");
  for (const token of ["dryRun", "system:authenticated", "resourceVersion", "creationTimestamp",
    "managedFields", "generation", "uid", "kubernetes.io/metadata.name",
    "namespaceObject"]) {
    assert.ok(!expressions.includes(token), `a policy reads ${token}, which the replay normalises`);
  }
}
