// The chaos test's independent invariant checker: what cozy-gpu promises tenants, decided from
// API objects alone (`kubectl get -A -o json` Lists), written from the documented rules
// (docs/controller.md: "The resources", "The model", "The reconciler: what each finalizer waits
// for", "Usage records", "The binder"; docs/gpunode.md; api/keys.h; the CRDs under
// charts/gpu/templates/crds/). It shares no code with the controller's model on purpose: a bug
// in the model cannot hide here by being decided the same way twice. Node's standard library
// only.
//
// Invariants (ids are stable; the behaviour IDs are docs/behaviours.md's):
//   unit-held-twice    per node and resource name, the counts of Bound GPUDevices whose class
//                      names that resource never exceed what the node's GPUNode lists as
//                      allocatable (summed over its functions' `resources`); a device Bound to
//                      an existing Node without a GPUNode is one too (D2, D3, D6, C13).
//   class-fit          (--settled) a Bound device's node exists and its class's nodeSelector
//                      selects it; a class that is gone leaves its set where it is (D9) and a
//                      running VM's set never moves, so neither is reported (C7).
//   budget             for each ResourceQuota key requests.gpu.cozystack.io/<class> and
//                      .../total, the units held (Bound or Lost: D11) in the quota's namespace and
//                      every namespace naming it by a tenant.cozystack.io/<ns> label stay within
//                      the quantity (C3, E3).
//   budget-unreadable  such a key whose value is no quantity (C2).
//   bound-stays-bound  (--previous) a device Bound on X before is Bound on X now, unless a move
//                      was allowed: Node X gone, cordoned with onCordon Move, not Ready (then,
//                      now, or between for as long as the NotReady grace: its Ready condition
//                      turned True again at least the grace after the previous snapshot), a
//                      NoSchedule/NoExecute taint its class does not tolerate, its class no
//                      longer selecting X, X serving fewer units than are held there, a VM start
//                      (a new attachment or bind request) or a set being gathered (D5, D7, D8,
//                      D10).
//   running-vm-moved   (--previous) a VMI Running on X before that has not ended keeps every
//                      device that was Bound on X attached and Bound on X; only Node X gone
//                      releases them. A deleting device keeps its binding too (D13).
//   launcher-unpinned  a running VMI's virt-launcher pods (owner reference to the VMI's uid,
//                      label kubevirt.io=virt-launcher) carry the required node affinity
//                      matchFields metadata.name In [X] in every term, and spec.nodeName, when
//                      set, is X (E13).
//   vm-gpus-elsewhere  a VMI that has not ended, on node X (its status.nodeName, or the node a
//                      launcher pod of it that has not ended is bound to, before KubeVirt writes
//                      the VMI's), has every device attached to it that is Bound, Bound on X: the
//                      GPUs of a VM that starts or runs never leave its node; only Node X gone
//                      releases them (C7, D5, E13).
//   usage-record       (--settled, workloads.json present) exactly one Workload per device
//                      holding units, in its namespace, owned by it, status {kind: gpu, type:
//                      <class>, resources: {gpu.cozystack.io/<class>: "<count>"}, operational:
//                      phase == Bound}; none for a device holding nothing or gone; the namespace
//                      has the WorkloadMonitor cozy-gpu-usage selecting the reserved key (D16,
//                      D19). Pods' records (gpupod-…, C11) are not checked.
//   left-over          (--settled) a template device whose VMI is gone (D14); an attachment whose
//                      VMI is gone past the attachment grace (D18); a deleting device no VMI
//                      uses that still holds units (D19) or still carries device-protection
//                      (D13); a deleting class no device names that still carries
//                      class-protection (D15).
//   pending-without-reason  a Pending device (with --settled, also one with no phase older
//                      than 10 s) that is not being deleted says why: a bindResponse Failed
//                      with a message, or a condition with status False and a message; with
//                      --settled a bind request left unanswered is reported too (D4, D9).
//
// CLI: node invariants.mjs [--previous PREV_DIR] [--settled] [--attachment-grace SECONDS]
//        [--not-ready-grace SECONDS] DIR
// (the graces are the replicas' --attachment-grace and --not-ready-grace)
// DIR holds gpunodes.json gpuclasses.json gpudevices.json vmis.json pods.json namespaces.json
// resourcequotas.json nodes.json, optionally workloads.json workloadmonitors.json (absent:
// Cozystack's usage kinds are not served, usage-record is skipped) and `taken-at` (epoch
// seconds). Prints `VIOLATION <invariant> <kind> <ns>/<name>: <message>` (cluster-scoped
// objects as `<name>`), then `invariants: <N> devices, <M> nodes checked, <V> violations`.
// Exit 0 clean, 1 on any violation, 2 on unreadable input or arguments.

import { readFileSync, existsSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

// api/keys.h and api/usage_record.h, spelled out again on purpose.
export const KEYS = {
  deviceFinalizer: 'gpu.cozystack.io/device-protection',
  classFinalizer: 'gpu.cozystack.io/class-protection',
  templateDeviceLabel: 'gpu.cozystack.io/template-device',
  tenantLabelPrefix: 'tenant.cozystack.io/',
  budgetKeyPrefix: 'requests.gpu.cozystack.io/',
  totalBudgetName: 'total',
  usageMonitorLabel: 'gpu.cozystack.io/usage-monitor',
  workloadMonitorNameLabel: 'workloads.cozystack.io/monitor',
  usageMonitorName: 'cozy-gpu-usage',
  launcherLabel: 'kubevirt.io',
  launcherLabelValue: 'virt-launcher',
};

export const REQUIRED_FILES = ['gpunodes.json', 'gpuclasses.json', 'gpudevices.json', 'vmis.json',
  'pods.json', 'namespaces.json', 'resourcequotas.json', 'nodes.json'];
export const OPTIONAL_FILES = ['workloads.json', 'workloadmonitors.json'];
export const DEFAULT_ATTACHMENT_GRACE_SECONDS = 120;
// A device with no phase at all is one the binder has not reached yet; past this it must say why.
export const UNPHASED_AGE_SECONDS = 10;

// Kubernetes' own taints, left to the cordon and the Ready condition (C8).
const IGNORED_TAINTS = new Set(['node.kubernetes.io/unschedulable', 'node.kubernetes.io/not-ready',
  'node.kubernetes.io/unreachable']);

// ---- reading objects ----

const metaOf = (o) => (o && o.metadata) || {};
const nameOf = (o) => metaOf(o).name || '';
const nsOf = (o) => metaOf(o).namespace || '';
const uidOf = (o) => metaOf(o).uid || '';
const keyOf = (o) => `${nsOf(o)}/${nameOf(o)}`;
const labelsOf = (o) => metaOf(o).labels || {};
const deleting = (o) => Boolean(metaOf(o).deletionTimestamp);
const finalizers = (o) => metaOf(o).finalizers || [];
const statusOf = (o) => (o && o.status) || {};
const phaseOf = (d) => statusOf(d).phase || '';
const itemsOf = (list) => (Array.isArray(list) ? list : (list && Array.isArray(list.items) ? list.items : []));

// A Bound device's node; null when not Bound to one.
const boundNode = (d) => (phaseOf(d) === 'Bound' && statusOf(d).nodeName ? statusOf(d).nodeName : null);
// Holds units of its class (api::HoldsUsage): Bound to a node, or Lost (D11).
const holds = (d) => phaseOf(d) === 'Lost' || boundNode(d) !== null;
const vmiEnded = (v) => ['Succeeded', 'Failed'].includes(phaseOf(v));
const deviceCount = (d) => Number((d.spec || {}).count) || 0;
const className = (d) => (d.spec || {}).className || '';
const resourceNameOf = (cls) => (((cls || {}).spec || {}).source || {}).devicePlugin?.resourceName || '';

function describe(d) {
  const ph = phaseOf(d) || 'no phase';
  const node = statusOf(d).nodeName;
  return node ? `${ph} on ${node}` : ph;
}

function epochOf(text) {
  if (!text) return null;
  const ms = Date.parse(text);
  return Number.isNaN(ms) ? null : ms / 1000;
}

// ---- Kubernetes quantities, rounded up to a whole number (api::ParseWholeQuantity) ----

const BINARY = { Ki: 1n, Mi: 2n, Gi: 3n, Ti: 4n, Pi: 5n, Ei: 6n };
const DECIMAL = { n: -9n, u: -6n, m: -3n, '': 0n, k: 3n, M: 6n, G: 9n, T: 12n, P: 15n, E: 18n };

// {value: BigInt} or {error: string}.
export function parseQuantity(input) {
  const text = typeof input === 'number' && Number.isInteger(input) ? String(input) : input;
  if (typeof text !== 'string') return { error: `${JSON.stringify(input)} is not a quantity string` };
  const m = /^([+-]?)(\d+(?:\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$/.exec(text);
  if (!m) return { error: `"${text}" is not a quantity` };
  const [, sign, number, suffix = ''] = m;
  const [whole, fraction = ''] = number.split('.');
  let numerator = BigInt((whole || '0') + fraction);
  let denominator = 10n ** BigInt(fraction.length);
  if (suffix in BINARY) {
    numerator *= 1024n ** BINARY[suffix];
  } else {
    const exponent = suffix in DECIMAL ? DECIMAL[suffix] : BigInt(suffix.slice(1));
    if (exponent > 1000n || exponent < -1000n) return { error: `"${text}" is out of range` };
    if (exponent >= 0n) numerator *= 10n ** exponent;
    else denominator *= 10n ** -exponent;
  }
  if (sign === '-' && numerator !== 0n) return { error: `"${text}" is negative` };
  return { value: (numerator + denominator - 1n) / denominator };
}

// ---- selectors and taints ----

// null when `selector` (a LabelSelector) selects `labels`, else why not.
export function whyNotSelected(selector, labels) {
  if (!selector) return null;
  for (const [key, value] of Object.entries(selector.matchLabels || {})) {
    if (labels[key] !== value) return `matchLabels ${key}=${value} (node has ${key in labels ? `${key}=${labels[key]}` : `no ${key}`})`;
  }
  for (const req of selector.matchExpressions || []) {
    const has = Object.hasOwn(labels, req.key);
    const values = req.values || [];
    const shown = `${req.key} ${req.operator}${values.length ? ` [${values.join(', ')}]` : ''}`;
    let ok;
    switch (req.operator) {
      case 'In': ok = has && values.includes(labels[req.key]); break;
      case 'NotIn': ok = !has || !values.includes(labels[req.key]); break;
      case 'Exists': ok = has; break;
      case 'DoesNotExist': ok = !has; break;
      default: return `matchExpressions ${shown}: unknown operator selects nothing`;
    }
    if (!ok) return `matchExpressions ${shown} (node has ${has ? `${req.key}=${labels[req.key]}` : `no ${req.key}`})`;
  }
  return null;
}

export function tolerates(toleration, taint) {
  const op = toleration.operator || 'Equal';
  if (op !== 'Equal' && op !== 'Exists') return false;  // Gt, Lt tolerate nothing (C9)
  if (toleration.effect && toleration.effect !== taint.effect) return false;
  if (op === 'Exists') return !toleration.key || toleration.key === taint.key;
  return toleration.key === taint.key && (toleration.value || '') === (taint.value || '');
}

// The node's NoSchedule/NoExecute taints no toleration in `tolerations` tolerates (C7, C8).
function untoleratedTaints(node, tolerations) {
  return ((node.spec || {}).taints || []).filter((t) =>
    (t.effect === 'NoSchedule' || t.effect === 'NoExecute') && !IGNORED_TAINTS.has(t.key) &&
    !(tolerations || []).some((tol) => tolerates(tol, t)));
}

const nodeReady = (node) => ((node.status || {}).conditions || []).some((c) => c.type === 'Ready' && c.status === 'True');
// When the node's Ready condition last changed (epoch seconds), or null.
function readySince(node) {
  const ready = ((node.status || {}).conditions || []).find((c) => c.type === 'Ready');
  const t = ready && Date.parse(ready.lastTransitionTime);
  return Number.isFinite(t) ? t / 1000 : null;
}
// A snapshot's lists take a few seconds before its `taken-at` is written: a Ready condition that
// changed this long before it may have changed after the Node was listed.
const SNAPSHOT_SPAN_SECONDS = 5;
const DEFAULT_NOT_READY_GRACE_SECONDS = 300; // gpu-controller's --not-ready-grace default
const cordoned = (node) => Boolean((node.spec || {}).unschedulable);

// resource name -> units, summed over the GPUNode's functions (docs/gpunode.md, "Units a node
// serves" in docs/controller.md).
function allocatableOf(gpuNode) {
  const units = new Map();
  for (const device of statusOf(gpuNode).devices || []) {
    for (const r of device.resources || []) {
      const n = Math.max(0, Number(r.allocatable) || 0);
      units.set(r.name, (units.get(r.name) || 0) + n);
    }
  }
  return units;
}

// ---- one snapshot, indexed ----

class View {
  constructor(s) {
    this.takenAt = Number(s.takenAt) || 0;
    this.devices = itemsOf(s.gpudevices);
    this.nodes = new Map(itemsOf(s.nodes).map((n) => [nameOf(n), n]));
    this.gpuNodes = new Map(itemsOf(s.gpunodes).map((n) => [nameOf(n), n]));
    this.classes = new Map(itemsOf(s.gpuclasses).map((c) => [nameOf(c), c]));
    this.vmis = new Map(itemsOf(s.vmis).map((v) => [keyOf(v), v]));
    this.pods = itemsOf(s.pods);
    this.namespaces = new Map(itemsOf(s.namespaces).map((n) => [nameOf(n), n]));
    this.quotas = itemsOf(s.resourcequotas);
    this.workloads = s.workloads == null ? null : itemsOf(s.workloads);
    this.monitors = s.workloadmonitors == null ? null : itemsOf(s.workloadmonitors);
    this.devicesByKey = new Map(this.devices.map((d) => [keyOf(d), d]));
  }

  // The VMI a device's attachment names, if it exists now (by name, and uid once recorded).
  attachedVmi(d) {
    const att = statusOf(d).attachment;
    if (!att || !att.vmiName) return null;
    const vmi = this.vmis.get(`${nsOf(d)}/${att.vmiName}`);
    if (!vmi || (att.vmiUID && att.vmiUID !== uidOf(vmi))) return null;
    return vmi;
  }

  // Whether the attachment of `d` is to `vmi` (its name, and its uid when recorded).
  static attachedTo(d, vmi) {
    const att = statusOf(d).attachment;
    return Boolean(att && nsOf(d) === nsOf(vmi) && att.vmiName === nameOf(vmi) &&
      (!att.vmiUID || att.vmiUID === uidOf(vmi)));
  }

  // Whether the device's VM runs on its node now: a running set never moves.
  vmRunsOnItsNode(d) {
    const vmi = this.attachedVmi(d);
    return Boolean(vmi && !vmiEnded(vmi) && boundNode(d) && statusOf(vmi).nodeName === boundNode(d));
  }

  // Bound units per node and resource name; devices whose class is gone are left out (their
  // resource name is unknown).
  boundUnits() {
    if (this.bound) return this.bound;
    const byNode = new Map();
    this.bound = byNode;
    for (const d of this.devices) {
      const node = boundNode(d);
      const resource = resourceNameOf(this.classes.get(className(d)));
      if (!node || !resource) continue;
      if (!byNode.has(node)) byNode.set(node, new Map());
      const perResource = byNode.get(node);
      if (!perResource.has(resource)) perResource.set(resource, []);
      perResource.get(resource).push(d);
    }
    return byNode;
  }

  // Whether node `name` (as this snapshot has it) could not keep device `d`, of which `held`
  // units of its resource were Bound there: why, or null.
  whyNodeCannotKeep(d, name, held) {
    const node = this.nodes.get(name);
    if (!node) return `Node ${name} is gone`;
    const cls = this.classes.get(className(d));
    const spec = (cls || {}).spec || {};
    if (cordoned(node) && spec.onCordon !== 'Stay') return `node ${name} is cordoned and class ${className(d)} moves on a cordon`;
    if (!nodeReady(node)) return `node ${name} is not Ready`;
    const taints = untoleratedTaints(node, spec.tolerations);
    if (taints.length) return `node ${name} carries ${taints.map((t) => `${t.key}:${t.effect}`).join(', ')}, not tolerated by class ${className(d)}`;
    if (cls) {
      const why = whyNotSelected(spec.nodeSelector, labelsOf(node));
      if (why) return `class ${className(d)} no longer selects node ${name}: ${why}`;
    }
    const gpuNode = this.gpuNodes.get(name);
    const resource = resourceNameOf(cls);
    if (!gpuNode) return `node ${name} has no GPUNode`;
    if (resource) {
      const served = allocatableOf(gpuNode).get(resource) || 0;
      if (held > served) return `node ${name} serves ${served} ${resource}, fewer than the ${held} held there`;
    }
    return null;
  }
}

// ---- the invariants ----

function unitHeldTwice(cur, report) {
  for (const d of cur.devices) {
    const node = boundNode(d);
    if (node && !cur.gpuNodes.has(node) && cur.nodes.has(node)) {
      report('unit-held-twice', d, `Bound to node ${node}, which has no GPUNode: it serves no units`);
    }
  }
  for (const [node, perResource] of cur.boundUnits()) {
    const gpuNode = cur.gpuNodes.get(node);
    if (!gpuNode) continue;
    const served = allocatableOf(gpuNode);
    for (const [resource, devices] of perResource) {
      const held = devices.reduce((s, d) => s + deviceCount(d), 0);
      const allocatable = served.get(resource) || 0;
      if (held > allocatable) {
        const names = devices.map((d) => `${keyOf(d)} x${deviceCount(d)}`).join(', ');
        report('unit-held-twice', { kind: 'GPUNode', namespace: '', name: node },
          `node ${node} ${resource}: ${held} units Bound (${names}) > ${allocatable} allocatable`);
      }
    }
  }
}

function classFit(cur, report) {
  for (const d of cur.devices) {
    const node = boundNode(d);
    if (!node) continue;
    const nodeObject = cur.nodes.get(node);
    if (!nodeObject) {
      report('class-fit', d, `Bound to node ${node}, whose Node is gone, in a settled cluster`);
      continue;
    }
    const cls = cur.classes.get(className(d));
    if (!cls) continue;  // a class that is gone leaves its set where it is (D9)
    const why = whyNotSelected((cls.spec || {}).nodeSelector, labelsOf(nodeObject));
    if (!why) continue;
    if (cur.vmRunsOnItsNode(d)) continue;  // a running VM's set never moves
    report('class-fit', d, `Bound to node ${node}, which class ${className(d)} does not select: ${why}`);
  }
}

function budgets(cur, report) {
  const held = cur.devices.filter(holds);
  for (const quota of cur.quotas) {
    const tenant = nsOf(quota);
    for (const [key, value] of Object.entries((quota.spec || {}).hard || {})) {
      if (!key.startsWith(KEYS.budgetKeyPrefix)) continue;
      const cls = key.slice(KEYS.budgetKeyPrefix.length);
      const parsed = parseQuantity(value);
      if (parsed.error) {
        report('budget-unreadable', quota, `spec.hard["${key}"]: ${parsed.error}`);
        continue;
      }
      const inSubtree = held.filter((d) => {
        if (cls !== KEYS.totalBudgetName && className(d) !== cls) return false;
        if (nsOf(d) === tenant) return true;
        const ns = cur.namespaces.get(nsOf(d));
        return Boolean(ns && Object.hasOwn(labelsOf(ns), KEYS.tenantLabelPrefix + tenant));
      });
      const used = inSubtree.reduce((s, d) => s + deviceCount(d), 0);
      if (BigInt(used) > parsed.value) {
        const names = inSubtree.map((d) => `${keyOf(d)} ${phaseOf(d)} x${deviceCount(d)}`).join(', ');
        report('budget', quota, `${key} of ${tenant} is ${value}, yet ${used} units are held in its subtree (${names})`);
      }
    }
  }
}

// Why a Bound device's move off `node` between `prev` and `cur` was allowed, or null.
function whyMoveAllowed(prev, cur, pd, d, node, notReadyGrace) {
  if (!cur.nodes.has(node)) return `Node ${node} is gone`;
  // The units held there before the move: a node serving fewer now (a failed GPU) moves sets.
  const resource = resourceNameOf(prev.classes.get(className(pd)) || cur.classes.get(className(d)));
  const held = (prev.boundUnits().get(node)?.get(resource) || []).reduce((s, x) => s + deviceCount(x), 0);
  const why = prev.whyNodeCannotKeep(pd, node, held) || cur.whyNodeCannotKeep(d, node, held);
  if (why) return why;
  // Ready in both snapshots, yet not Ready between them (a kubelet stopped and back): a move once
  // it had been not Ready for the grace. It turned not Ready after the previous snapshot listed it
  // Ready, and Ready again at `since`, so that long is the most it can have been not Ready.
  const since = readySince(cur.nodes.get(node));
  const notReadyAtMost = since === null ? 0 : since - (prev.takenAt - SNAPSHOT_SPAN_SECONDS);
  if (notReadyAtMost >= notReadyGrace) {
    return `node ${node} was not Ready between the snapshots, up to ${Math.round(notReadyAtMost)} s`;
  }
  const before = statusOf(pd);
  const now = statusOf(d);
  const sameAttachment = JSON.stringify([before.attachment?.vmiName, before.attachment?.vmiUID]) ===
    JSON.stringify([now.attachment?.vmiName, now.attachment?.vmiUID]);
  if (!sameAttachment) return 'attached to another VMI: a VM start may move its set';
  if (before.bindRequest?.id !== now.bindRequest?.id) return 'a VM start asked for its set';
  if (before.bindRequest && before.bindRequest.id !== before.bindResponse?.id) return 'a VM start asked for its set';
  const vmiName = before.attachment?.vmiName;
  if (vmiName) {
    const set = prev.devices.filter((x) => nsOf(x) === nsOf(pd) && statusOf(x).attachment?.vmiName === vmiName);
    if (set.some((x) => boundNode(x) !== node)) return 'its set was split or partly Lost: gathered (D8)';
  }
  return null;
}

// Devices (current) of VMIs that ran on their node in `prev` and have not ended in `cur`,
// as [vmi, node, previous devices].
function runningVms(prev, cur) {
  const out = [];
  for (const pv of prev.vmis.values()) {
    const node = statusOf(pv).nodeName;
    if (phaseOf(pv) !== 'Running' || !node) continue;
    const cv = cur.vmis.get(keyOf(pv));
    if (!cv || uidOf(cv) !== uidOf(pv) || vmiEnded(cv)) continue;
    const devices = prev.devices.filter((d) => View.attachedTo(d, pv) && boundNode(d) === node);
    if (devices.length) out.push([cv, node, devices]);
  }
  return out;
}

function boundStaysBound(prev, cur, notReadyGrace, report) {
  const protectedKeys = new Set();
  for (const [, node, devices] of runningVms(prev, cur)) {
    if (cur.nodes.has(node)) devices.forEach((d) => protectedKeys.add(keyOf(d)));
  }
  for (const pd of prev.devices) {
    const node = boundNode(pd);
    if (!node || protectedKeys.has(keyOf(pd))) continue;
    const d = cur.devicesByKey.get(keyOf(pd));
    if (!d || uidOf(d) !== uidOf(pd) || deleting(d) || boundNode(d) === node) continue;
    if (whyMoveAllowed(prev, cur, pd, d, node, notReadyGrace)) continue;
    report('bound-stays-bound', d, `was Bound on ${node}, now ${describe(d)}, though node ${node} could keep it ` +
      `(schedulable or onCordon Stay, Ready, no untolerated taint, selected by class ${className(d)}, units enough) ` +
      'and no VM start or gather asked for a move');
  }
}

function runningVmMoved(prev, cur, report) {
  for (const [vmi, node, devices] of runningVms(prev, cur)) {
    if (!cur.nodes.has(node)) continue;  // only a Node that is gone releases a running set
    for (const pd of devices) {
      const d = cur.devicesByKey.get(keyOf(pd));
      if (!d || uidOf(d) !== uidOf(pd)) continue;
      const attached = View.attachedTo(d, vmi);
      if (attached && boundNode(d) === node) continue;
      const att = statusOf(d).attachment;
      report('running-vm-moved', d, `VMI ${keyOf(vmi)} runs on ${node} (Running before, ${phaseOf(vmi) || 'no phase'} now) ` +
        `and its device was Bound there; now ${describe(d)}` +
        (attached ? '' : `, attached to ${att ? `${att.vmiName} ${att.vmiUID || '(no uid)'}` : 'no VMI'}`) +
        (deleting(d) ? ' (being deleted: a deleting device keeps its binding while its VMI runs, D13)' : ''));
    }
  }
}

// Whether a pod's required node affinity pins it to `node` in every term.
function whyNotPinned(pod, node) {
  const required = (((pod.spec || {}).affinity || {}).nodeAffinity || {}).requiredDuringSchedulingIgnoredDuringExecution;
  const terms = (required || {}).nodeSelectorTerms || [];
  if (!terms.length) return 'no required node affinity';
  for (const [i, term] of terms.entries()) {
    const pinned = (term.matchFields || []).some((f) => f.key === 'metadata.name' && f.operator === 'In' &&
      Array.isArray(f.values) && f.values.length === 1 && f.values[0] === node);
    if (!pinned) return `nodeSelectorTerms[${i}] has no matchFields metadata.name In [${node}]`;
  }
  const scheduled = (pod.spec || {}).nodeName;
  if (scheduled && scheduled !== node) return `spec.nodeName is ${scheduled}`;
  return null;
}

function launchersPinned(prev, cur, report) {
  const pairs = new Map();  // vmi key -> [vmi, node]
  for (const vmi of cur.vmis.values()) {
    const node = statusOf(vmi).nodeName;
    if (phaseOf(vmi) !== 'Running' || !node) continue;
    if (cur.devices.some((d) => View.attachedTo(d, vmi) && boundNode(d) === node)) pairs.set(keyOf(vmi), [vmi, node]);
  }
  if (prev) {
    for (const [vmi, node] of runningVms(prev, cur)) {
      if (cur.nodes.has(node) && !pairs.has(keyOf(vmi))) pairs.set(keyOf(vmi), [vmi, node]);
    }
  }
  for (const [vmi, node] of pairs.values()) {
    for (const pod of cur.pods) {
      if (!isLauncherOf(pod, vmi)) continue;
      if (['Succeeded', 'Failed'].includes(phaseOf(pod))) continue;
      const why = whyNotPinned(pod, node);
      if (why) report('launcher-unpinned', pod, `launcher of VMI ${keyOf(vmi)}, whose GPUs are on ${node}: ${why}`);
    }
  }
}

// A launcher pod of `vmi` (its owner reference to the VMI's uid, KubeVirt's launcher label).
const isLauncherOf = (pod, vmi) => nsOf(pod) === nsOf(vmi) &&
  labelsOf(pod)[KEYS.launcherLabel] === KEYS.launcherLabelValue &&
  (metaOf(pod).ownerReferences || []).some((o) => o.uid === uidOf(vmi));

function vmGpusElsewhere(cur, report) {
  for (const vmi of cur.vmis.values()) {
    if (vmiEnded(vmi)) continue;
    const where = new Map();  // node -> what puts the VM there
    if (statusOf(vmi).nodeName) where.set(statusOf(vmi).nodeName, 'its status.nodeName');
    for (const pod of cur.pods) {
      const at = (pod.spec || {}).nodeName;
      if (!at || !isLauncherOf(pod, vmi) || ['Succeeded', 'Failed'].includes(phaseOf(pod))) continue;
      if (!where.has(at)) where.set(at, `its launcher ${nameOf(pod)} is bound there`);
    }
    for (const [node, why] of where) {
      if (!cur.nodes.has(node)) continue;  // only a Node that is gone releases them
      for (const d of cur.devices) {
        const at = boundNode(d);
        if (!at || at === node || !View.attachedTo(d, vmi)) continue;
        report('vm-gpus-elsewhere', d, `attached to VMI ${keyOf(vmi)}, which is on ${node} (${why}), ` +
          `but ${describe(d)}`);
      }
    }
  }
}

// "gpudevice-<device>" when that is a DNS subdomain; null when the controller shortens it.
function expectedRecordName(device) {
  const name = `gpudevice-${device}`;
  return name.length <= 253 && name.split('.')[0].length <= 63 ? name : null;
}

function usageRecords(cur, report) {
  const records = cur.workloads.filter((w) => labelsOf(w)[KEYS.workloadMonitorNameLabel] === KEYS.usageMonitorName);
  const byOwner = new Map();
  const namespacesWithRecords = new Set();
  for (const r of records) {
    const owners = metaOf(r).ownerReferences || [];
    const owner = owners.find((o) => o.kind === 'GPUDevice');
    if (!owner) {
      if (owners.some((o) => o.kind === 'Pod') || nameOf(r).startsWith('gpupod-')) continue;  // C11's
      if (nameOf(r).startsWith('gpudevice-')) report('usage-record', r, 'a device usage record with no GPUDevice owner');
      continue;
    }
    namespacesWithRecords.add(nsOf(r));
    if (!byOwner.has(owner.uid)) byOwner.set(owner.uid, []);
    byOwner.get(owner.uid).push(r);
  }
  const deviceUids = new Set();
  for (const d of cur.devices) {
    deviceUids.add(uidOf(d));
    const recs = byOwner.get(uidOf(d)) || [];
    if (!holds(d)) {
      for (const r of recs) report('usage-record', r, `device ${keyOf(d)} holds no units (${describe(d)}), yet its record remains`);
      continue;
    }
    if (recs.length === 0) {
      report('usage-record', d, `holds ${deviceCount(d)} x ${className(d)} (${describe(d)}) but has no usage record`);
      continue;
    }
    if (recs.length > 1) report('usage-record', d, `has ${recs.length} usage records: ${recs.map(keyOf).join(', ')}`);
    for (const r of recs) checkRecord(d, r, report);
  }
  for (const [uid, recs] of byOwner) {
    if (deviceUids.has(uid)) continue;
    for (const r of recs) report('usage-record', r, `its owner GPUDevice (uid ${uid}) is gone`);
  }
  if (cur.monitors == null) return;
  for (const ns of namespacesWithRecords) {
    const monitor = cur.monitors.find((m) => nsOf(m) === ns && nameOf(m) === KEYS.usageMonitorName);
    if (!monitor) {
      report('usage-record', { kind: 'WorkloadMonitor', namespace: ns, name: KEYS.usageMonitorName },
        `namespace ${ns} has GPU usage records but no WorkloadMonitor ${KEYS.usageMonitorName}`);
      continue;
    }
    const selector = (monitor.spec || {}).selector || {};
    if (JSON.stringify(selector) !== JSON.stringify({ [KEYS.usageMonitorLabel]: 'true' })) {
      report('usage-record', monitor, `spec.selector is ${JSON.stringify(selector)}, not the reserved key ${KEYS.usageMonitorLabel}: "true" (D16)`);
    }
  }
}

function checkRecord(d, r, report) {
  const problems = [];
  if (nsOf(r) !== nsOf(d)) problems.push(`in namespace ${nsOf(r)}, not ${nsOf(d)}`);
  const expected = expectedRecordName(nameOf(d));
  if (expected && nameOf(r) !== expected) problems.push(`named ${nameOf(r)}, not ${expected}`);
  const owner = (metaOf(r).ownerReferences || []).find((o) => o.kind === 'GPUDevice');
  if (owner.name !== nameOf(d)) problems.push(`owner named ${owner.name}`);
  const st = statusOf(r);
  const cls = className(d);
  const wantResources = { [`gpu.cozystack.io/${cls}`]: String(deviceCount(d)) };
  if (st.kind !== 'gpu') problems.push(`status.kind ${JSON.stringify(st.kind)}, not "gpu"`);
  if (st.type !== cls) problems.push(`status.type ${JSON.stringify(st.type)}, not "${cls}"`);
  if (JSON.stringify(st.resources) !== JSON.stringify(wantResources)) {
    problems.push(`status.resources ${JSON.stringify(st.resources)}, not ${JSON.stringify(wantResources)}`);
  }
  const operational = phaseOf(d) === 'Bound';
  if (st.operational !== operational) problems.push(`status.operational ${JSON.stringify(st.operational)}, not ${operational} (device ${describe(d)})`);
  if (problems.length) report('usage-record', r, `record of ${keyOf(d)}: ${problems.join('; ')}`);
}

function leftOvers(cur, grace, report) {
  for (const d of cur.devices) {
    const att = statusOf(d).attachment;
    const vmi = cur.attachedVmi(d);
    const attachedAt = epochOf(att?.attachedAt);
    const age = attachedAt === null ? Infinity : cur.takenAt - attachedAt;
    const vmiGone = Boolean(att && att.vmiName && !vmi && age > grace);
    const gone = att ? `VMI ${nsOf(d)}/${att.vmiName}${att.vmiUID ? ` (uid ${att.vmiUID})` : ''} is gone` : '';
    const since = attachedAt === null ? 'with no attachedAt' : `attached ${Math.round(age)}s before the snapshot, grace ${grace}s`;
    const template = labelsOf(d)[KEYS.templateDeviceLabel] === 'true';
    if (deleting(d)) {
      if (vmi) continue;  // D13: kept while its VMI runs
      if (finalizers(d).includes(KEYS.deviceFinalizer)) {
        report('left-over', d, `being deleted, no VMI uses it, still carries ${KEYS.deviceFinalizer} (D13)`);
      }
      if (holds(d)) report('left-over', d, `being deleted, no VMI uses it, still holds units (${describe(d)}): not released (D19)`);
      continue;
    }
    if (template && !att) {
      report('left-over', d, 'a template device attached to no VMI was not deleted (D14)');
    } else if (template && vmiGone) {
      report('left-over', d, `a template device whose ${gone} (${since}) was not deleted (D14)`);
    } else if (vmiGone) {
      report('left-over', d, `attachment not cleared: ${gone} (${since}) (D18)`);
    }
  }
  for (const cls of cur.classes.values()) {
    if (!deleting(cls) || !finalizers(cls).includes(KEYS.classFinalizer)) continue;
    if (cur.devices.some((d) => className(d) === nameOf(cls))) continue;
    report('left-over', cls, `being deleted, no GPUDevice names it, still carries ${KEYS.classFinalizer} (D15)`);
  }
}

function pendingWithoutReason(cur, settled, report) {
  for (const d of cur.devices) {
    if (deleting(d)) continue;
    const ph = phaseOf(d);
    const created = epochOf(metaOf(d).creationTimestamp);
    const old = created === null || cur.takenAt - created > UNPHASED_AGE_SECONDS;
    if (!(ph === 'Pending' || (ph === '' && settled && old))) continue;
    const st = statusOf(d);
    const request = st.bindRequest;
    const response = st.bindResponse;
    if (request && request.id !== response?.id) {
      if (settled) report('pending-without-reason', d, `${ph || 'no phase'}: bind request ${request.id} is unanswered in a settled cluster (D4)`);
      continue;
    }
    if (response && response.result === 'Succeeded') {
      report('pending-without-reason', d, `${ph || 'no phase'}, yet its bind request ${response.id} was answered Succeeded (${response.message || 'no message'})`);
      continue;
    }
    const answered = response && response.result === 'Failed' && response.message;
    const condition = (st.conditions || []).find((c) => c.status === 'False' && c.message);
    if (answered || condition) continue;
    report('pending-without-reason', d, `${ph || 'no phase'} ${settled && ph === '' ? `${UNPHASED_AGE_SECONDS}s after creation ` : ''}` +
      `and its status says no reason (no Failed bindResponse with a message, no False condition with a message)`);
  }
}

// ---- the entry point ----

// `snapshot`, `options.previous`: {gpunodes, gpuclasses, gpudevices, vmis, pods, namespaces,
// resourcequotas, nodes, workloads?, workloadmonitors?, takenAt} (Lists or arrays of items);
// options.settled, options.attachmentGraceSeconds, options.notReadyGraceSeconds. Returns
// [{invariant, object, message}].
export function check(snapshot, options = {}) {
  const violations = [];
  const report = (invariant, object, message) => {
    const ref = object.metadata
      ? { kind: object.kind || '', namespace: nsOf(object), name: nameOf(object) }
      : object;
    violations.push({ invariant, object: ref, message });
  };
  const cur = new View(snapshot);
  const prev = options.previous ? new View(options.previous) : null;
  const settled = Boolean(options.settled);
  const grace = options.attachmentGraceSeconds ?? DEFAULT_ATTACHMENT_GRACE_SECONDS;
  unitHeldTwice(cur, report);
  if (settled) classFit(cur, report);
  budgets(cur, report);
  if (prev) {
    boundStaysBound(prev, cur, options.notReadyGraceSeconds ?? DEFAULT_NOT_READY_GRACE_SECONDS, report);
    runningVmMoved(prev, cur, report);
  }
  launchersPinned(prev, cur, report);
  vmGpusElsewhere(cur, report);
  if (settled && cur.workloads != null) usageRecords(cur, report);
  if (settled) leftOvers(cur, grace, report);
  pendingWithoutReason(cur, settled, report);
  return violations;
}

// An input the CLI cannot read: the file and what is wrong.
export class InputError extends Error {}

function readList(dir, file, kindHint) {
  const path = join(dir, file);
  let text;
  try {
    text = readFileSync(path, 'utf8');
  } catch (e) {
    throw new InputError(`${path}: cannot read: ${e.code || e.message}`);
  }
  let list;
  try {
    list = JSON.parse(text);
  } catch (e) {
    throw new InputError(`${path}: not JSON: ${e.message}`);
  }
  if (!list || typeof list !== 'object' || !Array.isArray(list.items)) {
    throw new InputError(`${path}: not a List (no "items" array) as \`kubectl get ${kindHint} -A -o json\` writes`);
  }
  for (const [i, item] of list.items.entries()) {
    if (!item || typeof item !== 'object' || typeof metaOf(item).name !== 'string') {
      throw new InputError(`${path}: items[${i}] has no metadata.name`);
    }
  }
  return list;
}

export function loadSnapshot(dir) {
  if (!existsSync(dir)) throw new InputError(`${dir}: no such directory`);
  const snapshot = {};
  for (const file of REQUIRED_FILES) snapshot[file.replace('.json', '')] = readList(dir, file, file.replace('.json', ''));
  for (const file of OPTIONAL_FILES) {
    if (existsSync(join(dir, file))) snapshot[file.replace('.json', '')] = readList(dir, file, file.replace('.json', ''));
  }
  const takenAtPath = join(dir, 'taken-at');
  let text;
  try {
    text = readFileSync(takenAtPath, 'utf8').trim();
  } catch (e) {
    throw new InputError(`${takenAtPath}: cannot read: ${e.code || e.message}`);
  }
  if (!/^\d+(\.\d+)?$/.test(text)) throw new InputError(`${takenAtPath}: "${text}" is not epoch seconds`);
  snapshot.takenAt = Number(text);
  return snapshot;
}

const USAGE = 'usage: node invariants.mjs [--previous PREV_DIR] [--settled] [--attachment-grace SECONDS] ' +
  '[--not-ready-grace SECONDS] DIR';

export function main(argv, out = console.log, err = console.error) {
  const options = { settled: false };
  let previousDir = null;
  let dir = null;
  for (let i = 0; i < argv.length; ++i) {
    const arg = argv[i];
    if (arg === '--settled') options.settled = true;
    else if (arg === '--previous' && i + 1 < argv.length) previousDir = argv[++i];
    else if ((arg === '--attachment-grace' || arg === '--not-ready-grace') && i + 1 < argv.length) {
      const value = argv[++i];
      if (!/^\d+$/.test(value)) { err(`${arg}: "${value}" is not whole seconds\n${USAGE}`); return 2; }
      options[arg === '--attachment-grace' ? 'attachmentGraceSeconds' : 'notReadyGraceSeconds'] = Number(value);
    } else if (!arg.startsWith('--') && dir === null) dir = arg;
    else { err(`unexpected argument "${arg}"\n${USAGE}`); return 2; }
  }
  if (dir === null) { err(USAGE); return 2; }
  let snapshot;
  try {
    snapshot = loadSnapshot(dir);
    if (previousDir !== null) options.previous = loadSnapshot(previousDir);
  } catch (e) {
    if (e instanceof InputError) { err(`invariants: unreadable input: ${e.message}`); return 2; }
    throw e;
  }
  const violations = check(snapshot, options);
  for (const v of violations) {
    const where = v.object.namespace ? `${v.object.namespace}/${v.object.name}` : v.object.name;
    out(`VIOLATION ${v.invariant} ${v.object.kind} ${where}: ${v.message}`);
  }
  out(`invariants: ${itemsOf(snapshot.gpudevices).length} devices, ${itemsOf(snapshot.nodes).length} nodes checked, ${violations.length} violations`);
  return violations.length ? 1 : 0;
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  process.exitCode = main(process.argv.slice(2));
}
