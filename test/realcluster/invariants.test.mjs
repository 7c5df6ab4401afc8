// The chaos test's invariant checker (invariants.mjs) on crafted snapshots: a clean cluster
// passes, and every invariant is shown failing on a snapshot (or previous/current pair) made
// to violate it, beside the exceptions the documented rules allow (docs/controller.md, "The
// model", "The reconciler: what each finalizer waits for", "Usage records"). No cluster needed.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { check, parseQuantity } from './invariants.mjs';

const SCRIPT = join(dirname(fileURLToPath(import.meta.url)), 'invariants.mjs');
const NOW = 1796112000;  // 2026-12-01T08:00:00Z
const iso = (seconds) => new Date(seconds * 1000).toISOString().replace('.000Z', 'Z');
const EARLIER = iso(NOW - 3600);

// ---- object builders ----

function node(name, { labels = { gpu: 'a100' }, unschedulable = false, ready = true, taints = [] } = {}) {
  return {
    apiVersion: 'v1', kind: 'Node', metadata: { name, uid: `uid-node-${name}`, labels },
    spec: { ...(unschedulable ? { unschedulable: true } : {}), ...(taints.length ? { taints } : {}) },
    status: { conditions: [{ type: 'Ready', status: ready ? 'True' : 'Unknown', lastTransitionTime: EARLIER }] },
  };
}

function gpuNode(name, units = { 'nvidia.com/GA100': 4 }) {
  const devices = [];
  let fn = 0;
  for (const [resource, count] of Object.entries(units)) {
    for (let i = 0; i < count; ++i) {
      devices.push({ pciAddress: `0000:0${fn}:00.0`, vendorID: '10de', deviceID: '20b5', classCode: '030200',
        resources: [{ name: resource, allocatable: 1, allocated: 0 }], allocatable: 1, allocated: 0, health: 'Healthy' });
      ++fn;
    }
  }
  return { apiVersion: 'gpu.cozystack.io/v1alpha1', kind: 'GPUNode', metadata: { name },
    status: { resourceNames: Object.keys(units), devices } };
}

function gpuClass(name, { resourceName = 'nvidia.com/GA100', selector = { matchLabels: { gpu: 'a100' } },
  onCordon, tolerations, deletingSince, finalizers = ['gpu.cozystack.io/class-protection'] } = {}) {
  return {
    apiVersion: 'gpu.cozystack.io/v1alpha1', kind: 'GPUClass',
    metadata: { name, uid: `uid-class-${name}`, finalizers, ...(deletingSince ? { deletionTimestamp: deletingSince } : {}) },
    spec: { vendor: 'NVIDIA', model: 'A100', mode: 'passthrough', source: { devicePlugin: { resourceName } },
      ...(selector ? { nodeSelector: selector } : {}), ...(onCordon ? { onCordon } : {}),
      ...(tolerations ? { tolerations } : {}) },
  };
}

// phase/node/vmi describe the status; vmi: [name, uid] attaches it.
function device(ns, name, { cls = 'a100', count = 1, phase = 'Bound', node: at = 'gpu-1', vmi, attachedAt = EARLIER,
  template = false, deletingSince, finalizers = ['gpu.cozystack.io/device-protection'], uid = `uid-dev-${ns}-${name}`,
  bindRequest, bindResponse, conditions, created = EARLIER } = {}) {
  const status = {};
  if (phase) status.phase = phase;
  if (phase === 'Bound' && at) status.nodeName = at;
  if (vmi) status.attachment = { vmiName: vmi[0], ...(vmi[1] ? { vmiUID: vmi[1] } : {}), ...(attachedAt ? { attachedAt } : {}) };
  if (bindRequest) status.bindRequest = bindRequest;
  if (bindResponse) status.bindResponse = bindResponse;
  if (conditions) status.conditions = conditions;
  return {
    apiVersion: 'gpu.cozystack.io/v1alpha1', kind: 'GPUDevice',
    metadata: { namespace: ns, name, uid, creationTimestamp: created, finalizers,
      ...(template ? { labels: { 'gpu.cozystack.io/template-device': 'true' } } : {}),
      ...(deletingSince ? { deletionTimestamp: deletingSince } : {}) },
    spec: { className: cls, count },
    status,
  };
}

function vmi(ns, name, { uid = `uid-vmi-${ns}-${name}`, phase = 'Running', node: at = 'gpu-1' } = {}) {
  return { apiVersion: 'kubevirt.io/v1', kind: 'VirtualMachineInstance',
    metadata: { namespace: ns, name, uid, creationTimestamp: EARLIER },
    status: { phase, ...(at ? { nodeName: at } : {}) } };
}

function launcher(ns, name, vmiObject, { pinnedTo = 'gpu-1', nodeName = pinnedTo, phase = 'Running' } = {}) {
  const affinity = pinnedTo ? { nodeAffinity: { requiredDuringSchedulingIgnoredDuringExecution: {
    nodeSelectorTerms: [{ matchFields: [{ key: 'metadata.name', operator: 'In', values: [pinnedTo] }] }] } } } : undefined;
  return { apiVersion: 'v1', kind: 'Pod',
    metadata: { namespace: ns, name, uid: `uid-pod-${name}`, labels: { 'kubevirt.io': 'virt-launcher' },
      ownerReferences: [{ apiVersion: 'kubevirt.io/v1', kind: 'VirtualMachineInstance', name: vmiObject.metadata.name,
        uid: vmiObject.metadata.uid, controller: true }] },
    spec: { ...(affinity ? { affinity } : {}), ...(nodeName ? { nodeName } : {}), containers: [{ name: 'compute' }] },
    status: { phase } };
}

const namespace = (name, ancestors = []) => ({ apiVersion: 'v1', kind: 'Namespace',
  metadata: { name, labels: Object.fromEntries([['gpu.cozystack.io/tenant-namespace', 'true'],
    ...ancestors.map((a) => [`tenant.cozystack.io/${a}`, ''])]) } });

const quota = (ns, name, hard) => ({ apiVersion: 'v1', kind: 'ResourceQuota', metadata: { namespace: ns, name }, spec: { hard } });

// The record the controller writes for `d` (api/usage_record.h).
function record(d, overrides = {}) {
  return { apiVersion: 'cozystack.io/v1alpha1', kind: 'Workload',
    metadata: { namespace: d.metadata.namespace, name: `gpudevice-${d.metadata.name}`,
      labels: { 'workloads.cozystack.io/monitor': 'cozy-gpu-usage', 'app.kubernetes.io/managed-by': 'gpu-controller' },
      ownerReferences: [{ apiVersion: 'gpu.cozystack.io/v1alpha1', kind: 'GPUDevice', name: d.metadata.name, uid: d.metadata.uid }] },
    status: { kind: 'gpu', type: d.spec.className, resources: { [`gpu.cozystack.io/${d.spec.className}`]: String(d.spec.count) },
      operational: d.status.phase === 'Bound', ...overrides } };
}

const monitor = (ns) => ({ apiVersion: 'cozystack.io/v1alpha1', kind: 'WorkloadMonitor',
  metadata: { namespace: ns, name: 'cozy-gpu-usage' },
  spec: { selector: { 'gpu.cozystack.io/usage-monitor': 'true' }, kind: 'gpu', type: 'gpu' } });

// A settled cluster that keeps every promise: two a100 nodes of 4, a running VM with a
// 2-GPU order on gpu-1, a held order of a VM that is off on gpu-2, a Lost order, budgets
// in the tenant root, usage records and their monitor.
function clean() {
  const train = vmi('tenant-a', 'train');
  const devices = [
    device('tenant-a', 'train', { count: 2, vmi: ['train', train.metadata.uid] }),
    device('tenant-a', 'held', { node: 'gpu-2' }),
    device('tenant-b', 'lost', { phase: 'Lost' }),
  ];
  return {
    takenAt: NOW,
    nodes: [node('gpu-1'), node('gpu-2'), node('cpu-1', { labels: {} })],
    gpunodes: [gpuNode('gpu-1'), gpuNode('gpu-2')],
    gpuclasses: [gpuClass('a100')],
    gpudevices: devices,
    vmis: [train],
    pods: [launcher('tenant-a', 'virt-launcher-train-abcde', train)],
    namespaces: [namespace('tenant-root'), namespace('tenant-a', ['tenant-root']), namespace('tenant-b', ['tenant-root'])],
    resourcequotas: [quota('tenant-root', 'gpu', { 'requests.gpu.cozystack.io/a100': '4', 'requests.gpu.cozystack.io/total': '4' }),
      quota('tenant-a', 'gpu', { 'requests.gpu.cozystack.io/total': '3', 'requests.cpu': '10' })],
    workloads: devices.map((d) => record(d)),
    workloadmonitors: [monitor('tenant-a'), monitor('tenant-b')],
  };
}

const copy = (s) => structuredClone(s);
const dev = (s, key) => s.gpudevices.find((d) => `${d.metadata.namespace}/${d.metadata.name}` === key);
const ids = (violations) => violations.map((v) => v.invariant);
const only = (violations, invariant) => {
  assert.ok(violations.length > 0, `expected ${invariant}, got no violation`);
  assert.deepEqual([...new Set(ids(violations))], [invariant], JSON.stringify(violations, null, 1));
  return violations;
};
const none = (violations) => assert.deepEqual(violations, [], JSON.stringify(violations, null, 1));
const settled = { settled: true };

// ---- clean ----

test('a clean settled cluster, checked against itself as previous, has no violation', () => {
  const s = clean();
  none(check(s, { settled: true, previous: copy(s) }));
});

// ---- unit-held-twice ----

test('unit-held-twice D2 D3: Bound units on a node past its GPUNode allocatable, named with the numbers', () => {
  const s = clean();
  s.gpudevices.push(device('tenant-b', 'extra', { count: 3 }), device('tenant-a', 'other-class', { cls: 'h100' }));
  s.gpuclasses.push(gpuClass('h100', { resourceName: 'nvidia.com/GH100' }));
  s.workloads.push(record(dev(s, 'tenant-b/extra')), record(dev(s, 'tenant-a/other-class')));
  s.resourcequotas = [];
  const v = check(s);
  const held = v.filter((x) => x.invariant === 'unit-held-twice');
  assert.equal(held.length, 2, JSON.stringify(v));
  assert.deepEqual(held.map((x) => x.object), [
    { kind: 'GPUNode', namespace: '', name: 'gpu-1' }, { kind: 'GPUNode', namespace: '', name: 'gpu-1' }]);
  assert.match(held[0].message, /node gpu-1 nvidia.com\/GA100: 5 units Bound \(tenant-a\/train x2, tenant-b\/extra x3\) > 4 allocatable/);
  assert.match(held[1].message, /nvidia.com\/GH100: 1 units Bound .* > 0 allocatable/);
});

test('unit-held-twice C13: allocatable is summed over the functions, an mdev parent serving several', () => {
  const s = clean();
  const gn = s.gpunodes[0];
  gn.status.devices = [{ pciAddress: '0000:01:00.0', vendorID: '10de', deviceID: '20b5', classCode: '030000',
    resources: [{ name: 'nvidia.com/GA100', allocatable: 2, allocated: 0 }] }];
  none(check(s, settled));
  gn.status.devices[0].resources[0].allocatable = 1;
  only(check(s, settled), 'unit-held-twice');
});

test('unit-held-twice: a device Bound to an existing node without a GPUNode', () => {
  const s = clean();
  s.gpunodes = s.gpunodes.filter((g) => g.metadata.name !== 'gpu-2');
  const v = only(check(s), 'unit-held-twice');
  assert.equal(v[0].object.name, 'held');
  assert.match(v[0].message, /node gpu-2, which has no GPUNode/);
});

// ---- class-fit ----

test('class-fit C7: a Bound device on a node its class does not select, only when settled', () => {
  const s = clean();
  dev(s, 'tenant-a/held').status.nodeName = 'cpu-1';
  s.gpunodes.push(gpuNode('cpu-1'));
  none(check(s));
  const v = only(check(s, settled), 'class-fit');
  assert.equal(v[0].object.name, 'held');
  assert.match(v[0].message, /Bound to node cpu-1, which class a100 does not select: matchLabels gpu=a100 \(node has no gpu\)/);
});

test('class-fit: matchExpressions In, NotIn, Exists, DoesNotExist', () => {
  const cases = [
    [{ matchExpressions: [{ key: 'gpu', operator: 'In', values: ['a100', 'h100'] }] }, true],
    [{ matchExpressions: [{ key: 'gpu', operator: 'In', values: ['h100'] }] }, false],
    [{ matchExpressions: [{ key: 'gpu', operator: 'NotIn', values: ['h100'] }] }, true],
    [{ matchExpressions: [{ key: 'gpu', operator: 'NotIn', values: ['a100'] }] }, false],
    [{ matchExpressions: [{ key: 'gpu', operator: 'Exists' }] }, true],
    [{ matchExpressions: [{ key: 'pool', operator: 'Exists' }] }, false],
    [{ matchExpressions: [{ key: 'pool', operator: 'DoesNotExist' }] }, true],
    [{ matchExpressions: [{ key: 'gpu', operator: 'DoesNotExist' }] }, false],
    [{}, true],
  ];
  for (const [selector, selects] of cases) {
    const s = clean();
    s.gpuclasses[0].spec.nodeSelector = selector;
    s.vmis = [];  // no running VM: its set would stay regardless
    s.pods = [];
    const v = check(s, settled).filter((x) => x.invariant === 'class-fit');
    assert.equal(v.length, selects ? 0 : 2, `${JSON.stringify(selector)}: ${JSON.stringify(v)}`);
  }
});

test('class-fit D9: a class that is gone leaves its set where it is; a running VM set stays too', () => {
  const s = clean();
  s.gpuclasses = [];
  s.workloads = s.workloads.map((w) => w);  // records stay as they were
  none(check(s, settled).filter((x) => x.invariant === 'class-fit'));
  const t = clean();
  t.gpuclasses[0].spec.nodeSelector = { matchLabels: { gpu: 'h100' } };
  const v = only(check(t, settled), 'class-fit');
  assert.deepEqual(v.map((x) => x.object.name), ['held']);  // train's VM runs on gpu-1: it stays
});

test('class-fit: a device Bound to a Node that is gone, in a settled cluster', () => {
  const s = clean();
  s.nodes = s.nodes.filter((n) => n.metadata.name !== 'gpu-2');
  const v = only(check(s, settled), 'class-fit');
  assert.match(v[0].message, /node gpu-2, whose Node is gone/);
  none(check(s));
});

// ---- budget ----

test('budget C3 D11: a tenant root budget caps its subtree, a Lost order counting', () => {
  const s = clean();
  s.resourcequotas[0].spec.hard['requests.gpu.cozystack.io/a100'] = '3';
  const v = only(check(s), 'budget');
  assert.equal(v[0].object.namespace, 'tenant-root');
  assert.match(v[0].message, /requests.gpu.cozystack.io\/a100 of tenant-root is 3, yet 4 units are held in its subtree \(.*tenant-b\/lost Lost x1/);
});

test('budget: the total key, and a budget of a sub-tenant counts only its own subtree', () => {
  const s = clean();
  s.resourcequotas[1].spec.hard['requests.gpu.cozystack.io/total'] = '2';
  const v = only(check(s), 'budget');
  assert.equal(v[0].object.namespace, 'tenant-a');
  assert.match(v[0].message, /total of tenant-a is 2, yet 3 units/);
});

test('budget: quantities with suffixes read as the API server writes them', () => {
  assert.equal(parseQuantity('4').value, 4n);
  assert.equal(parseQuantity('2k').value, 2000n);
  assert.equal(parseQuantity('1Ki').value, 1024n);
  assert.equal(parseQuantity('1500m').value, 2n);
  assert.equal(parseQuantity('1e3').value, 1000n);
  assert.ok(parseQuantity('-1').error);
  assert.ok(parseQuantity('lots').error);
  const s = clean();
  s.resourcequotas[0].spec.hard['requests.gpu.cozystack.io/a100'] = '3500m';
  none(check(s));
});

test('budget: several quotas in one namespace each apply; a namespace outside the subtree does not count', () => {
  const s = clean();
  s.resourcequotas.push(quota('tenant-root', 'tighter', { 'requests.gpu.cozystack.io/a100': '2' }));
  const v = only(check(s), 'budget');
  assert.deepEqual(v.map((x) => x.object.name), ['tighter']);
  const t = clean();
  t.namespaces.push(namespace('other'));
  t.gpudevices.push(device('other', 'outside', { node: 'gpu-2', count: 3 }));
  t.gpunodes[1] = gpuNode('gpu-2', { 'nvidia.com/GA100': 8 });
  none(check(t));
});

test('budget-unreadable C2: a budget that does not read is a violation of its own', () => {
  const s = clean();
  s.resourcequotas[1].spec.hard['requests.gpu.cozystack.io/a100'] = 'four';
  const v = only(check(s), 'budget-unreadable');
  assert.match(v[0].message, /"four" is not a quantity/);
});

// ---- bound-stays-bound ----

test('bound-stays-bound: a held order moved off a node that could keep it', () => {
  const prev = clean();
  const cur = copy(prev);
  dev(cur, 'tenant-a/held').status.nodeName = 'gpu-1';
  const v = only(check(cur, { previous: prev }), 'bound-stays-bound');
  assert.match(v[0].message, /was Bound on gpu-2, now Bound on gpu-1/);
  dev(cur, 'tenant-a/held').status = { phase: 'Lost' };
  only(check(cur, { previous: prev }), 'bound-stays-bound');
});

test('bound-stays-bound D10: a move off a cordoned node is allowed for onCordon Move, not for Stay', () => {
  const prev = clean();
  prev.nodes[1] = node('gpu-2', { unschedulable: true });
  const cur = copy(prev);
  dev(cur, 'tenant-a/held').status = { phase: 'Lost' };
  none(check(cur, { previous: prev }));
  for (const s of [prev, cur]) s.gpuclasses[0].spec.onCordon = 'Stay';
  only(check(cur, { previous: prev }), 'bound-stays-bound');
});

test('bound-stays-bound C7: a node Ready in both snapshots but not Ready between them for the grace may have lost its sets', () => {
  const prev = clean();
  const cur = copy(prev);
  dev(cur, 'tenant-a/held').status.nodeName = 'gpu-1';
  cur.takenAt = NOW + 90;
  // Ready again a minute after the previous snapshot: a kubelet stopped and back, not Ready for
  // up to a minute (plus the snapshot's span), past a grace of 60 s and not past one of 70 s.
  cur.nodes[1].status.conditions[0].lastTransitionTime = iso(NOW + 60);
  none(check(cur, { previous: prev, notReadyGraceSeconds: 60 }));
  const v = only(check(cur, { previous: prev, notReadyGraceSeconds: 70 }), 'bound-stays-bound');
  assert.match(v[0].message, /was Bound on gpu-2, now Bound on gpu-1/);
  // The default grace is gpu-controller's, 300 s.
  only(check(cur, { previous: prev }), 'bound-stays-bound');
  // Ready since before the previous snapshot: nothing happened to it.
  cur.nodes[1].status.conditions[0].lastTransitionTime = iso(NOW - 60);
  only(check(cur, { previous: prev, notReadyGraceSeconds: 0 }), 'bound-stays-bound');
  // Another node's NotReady between the snapshots allows nothing on this one.
  cur.nodes[0].status.conditions[0].lastTransitionTime = iso(NOW + 60);
  only(check(cur, { previous: prev, notReadyGraceSeconds: 0 }), 'bound-stays-bound');
});

test('bound-stays-bound C7: moves off a NotReady node, an untolerated taint, a class no longer selecting, a Node gone', () => {
  const variants = {
    'not Ready': (s) => { s.nodes[1] = node('gpu-2', { ready: false }); },
    'untolerated taint': (s) => { s.nodes[1] = node('gpu-2', { taints: [{ key: 'maintenance', value: 'x', effect: 'NoExecute' }] }); },
    'class no longer selects': (s) => { s.nodes[1] = node('gpu-2', { labels: { gpu: 'h100' } }); },
    'Node gone': (s) => { s.nodes.splice(1, 1); },
    'fewer units served than held': (s) => { s.gpunodes[1].status.devices = []; },
  };
  for (const [what, change] of Object.entries(variants)) {
    const prev = clean();
    const cur = copy(prev);
    change(cur);
    dev(cur, 'tenant-a/held').status = { phase: 'Lost' };
    none(check(cur, { previous: prev }).filter((x) => x.invariant === 'bound-stays-bound'), what);
  }
  // A tolerated taint, and Kubernetes' own unschedulable taint without the cordon (C8), allow nothing.
  for (const taints of [[{ key: 'nvidia.com/gpu', effect: 'NoSchedule' }], [{ key: 'node.kubernetes.io/unschedulable', effect: 'NoSchedule' }]]) {
    const prev = clean();
    prev.gpuclasses[0].spec.tolerations = [{ key: 'nvidia.com/gpu', operator: 'Exists', effect: 'NoSchedule' }];
    prev.nodes[1] = node('gpu-2', { taints });
    const cur = copy(prev);
    dev(cur, 'tenant-a/held').status = { phase: 'Lost' };
    only(check(cur, { previous: prev }), 'bound-stays-bound');
  }
});

test('bound-stays-bound D8: a VM start moves its held set; a deleting or recreated device is not judged', () => {
  const prev = clean();
  const cur = copy(prev);
  Object.assign(dev(cur, 'tenant-a/held').status, { nodeName: 'gpu-1',
    attachment: { vmiName: 'infer', attachedAt: iso(NOW - 5) }, bindRequest: { id: 'r1' }, bindResponse: { id: 'r1', result: 'Succeeded' } });
  none(check(cur, { previous: prev }).filter((x) => x.invariant === 'bound-stays-bound'));
  const deletingNow = copy(prev);
  dev(deletingNow, 'tenant-a/held').metadata.deletionTimestamp = iso(NOW - 1);
  dev(deletingNow, 'tenant-a/held').status = { phase: 'Pending' };
  none(check(deletingNow, { previous: prev }).filter((x) => x.invariant === 'bound-stays-bound'));
  const recreated = copy(prev);
  dev(recreated, 'tenant-a/held').metadata.uid = 'another';
  dev(recreated, 'tenant-a/held').status = {};
  none(check(recreated, { previous: prev }).filter((x) => x.invariant === 'bound-stays-bound'));
});

test('bound-stays-bound D7 D8: a set split over nodes in the previous snapshot may be gathered onto one', () => {
  const prev = clean();
  prev.vmis = [];
  prev.pods = [];
  prev.resourcequotas = [];
  Object.assign(dev(prev, 'tenant-a/held').status, { attachment: { vmiName: 'pair', attachedAt: EARLIER } });
  prev.gpudevices.push(device('tenant-a', 'pair-b', { node: 'gpu-1', vmi: ['pair'] }));
  prev.workloads.push(record(dev(prev, 'tenant-a/pair-b')));
  const cur = copy(prev);
  dev(cur, 'tenant-a/held').status.nodeName = 'gpu-1';
  none(check(cur, { previous: prev }));
  // The same move of a set that was whole on gpu-2 is no gather.
  dev(prev, 'tenant-a/pair-b').status.nodeName = 'gpu-2';
  dev(cur, 'tenant-a/pair-b').status.nodeName = 'gpu-2';
  only(check(cur, { previous: prev }), 'bound-stays-bound');
});

// ---- running-vm-moved ----

test('running-vm-moved: a running VM set never moves, not even off a cordoned, NotReady or tainted node', () => {
  for (const gpu1 of [node('gpu-1', { unschedulable: true }), node('gpu-1', { ready: false }),
    node('gpu-1', { taints: [{ key: 'maintenance', effect: 'NoExecute' }] })]) {
    const prev = clean();
    prev.nodes[0] = gpu1;
    const cur = copy(prev);
    dev(cur, 'tenant-a/train').status.nodeName = 'gpu-2';
    cur.workloads = cur.workloads.map((w) => w);
    // Checked against the snapshot before, and on this one alone: its GPU is not on its node.
    const v = check(cur, { previous: prev });
    assert.deepEqual(ids(v), ['running-vm-moved', 'vm-gpus-elsewhere'], JSON.stringify(v));
    assert.match(v[0].message, /VMI tenant-a\/train runs on gpu-1 .* now Bound on gpu-2/);
  }
});

test('running-vm-moved: detached or Lost while the VM runs; allowed once the Node is gone or the VMI ended', () => {
  const prev = clean();
  const detached = copy(prev);
  delete dev(detached, 'tenant-a/train').status.attachment;
  only(check(detached, { previous: prev }), 'running-vm-moved');
  const lost = copy(prev);
  dev(lost, 'tenant-a/train').status = { phase: 'Lost', attachment: dev(prev, 'tenant-a/train').status.attachment };
  only(check(lost, { previous: prev }), 'running-vm-moved');
  const nodeGone = copy(lost);
  nodeGone.nodes.splice(0, 1);
  none(check(nodeGone, { previous: prev }));
  // Once the VMI ends its set is judged as any set: node gpu-1 could keep it.
  const ended = copy(lost);
  ended.vmis[0].status.phase = 'Succeeded';
  only(check(ended, { previous: prev }), 'bound-stays-bound');
});

test('running-vm-moved D13: a deleting device of a running VM keeps its binding', () => {
  const prev = clean();
  const cur = copy(prev);
  const train = dev(cur, 'tenant-a/train');
  train.metadata.deletionTimestamp = iso(NOW - 10);
  none(check(cur, { previous: prev, settled: true }));
  train.status = { phase: 'Pending', attachment: train.status.attachment };
  const v = check(cur, { previous: prev });
  assert.ok(ids(v).includes('running-vm-moved'), JSON.stringify(v));
});

// ---- launcher-unpinned ----

test('launcher-unpinned E13: a running VM launcher not pinned by matchFields to the node of its GPUs', () => {
  const s = clean();
  s.pods[0] = launcher('tenant-a', 'virt-launcher-train-abcde', s.vmis[0], { pinnedTo: null, nodeName: 'gpu-1' });
  let v = only(check(s), 'launcher-unpinned');
  assert.match(v[0].message, /no required node affinity/);
  s.pods[0] = launcher('tenant-a', 'virt-launcher-train-abcde', s.vmis[0], { pinnedTo: 'gpu-2', nodeName: 'gpu-1' });
  v = only(check(s), 'launcher-unpinned');
  assert.match(v[0].message, /no matchFields metadata.name In \[gpu-1\]/);
  s.pods[0] = launcher('tenant-a', 'virt-launcher-train-abcde', s.vmis[0], { pinnedTo: 'gpu-1', nodeName: 'gpu-2' });
  v = check(s);  // and a launcher bound to gpu-2 puts the VM away from its GPUs
  assert.deepEqual(ids(v), ['launcher-unpinned', 'vm-gpus-elsewhere'], JSON.stringify(v));
  assert.match(v[0].message, /spec.nodeName is gpu-2/);
  // A label-expression pin on the hostname is no pin (E13); a finished pod is not judged.
  s.pods[0] = launcher('tenant-a', 'virt-launcher-train-abcde', s.vmis[0]);
  s.pods[0].spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms.push(
    { matchExpressions: [{ key: 'kubernetes.io/hostname', operator: 'In', values: ['gpu-1'] }] });
  only(check(s), 'launcher-unpinned');
  s.pods[0].status.phase = 'Failed';
  none(check(s));
});

// ---- vm-gpus-elsewhere ----

test('vm-gpus-elsewhere C7 E13: a starting or running VM whose attached GPU is Bound on another node', () => {
  // The VM runs on gpu-1 (its status), its order moved to gpu-2.
  const s = clean();
  dev(s, 'tenant-a/train').status.nodeName = 'gpu-2';
  s.gpudevices = s.gpudevices.filter((d) => d.metadata.name !== 'held');
  s.workloads = s.workloads.filter((w) => w.metadata.name !== 'gpudevice-held');
  const v = only(check(s), 'vm-gpus-elsewhere');
  assert.match(v[0].message, /attached to VMI tenant-a\/train, which is on gpu-1 \(its status.nodeName\), but .*gpu-2/);
  // Starting: KubeVirt has not written the VMI's node yet, its launcher is bound to gpu-1.
  const t = copy(s);
  delete t.vmis[0].status.nodeName;
  t.vmis[0].status.phase = 'Scheduled';
  t.pods[0].spec.affinity = undefined;  // not judged by launcher-unpinned without the VMI's node
  const w = only(check(t), 'vm-gpus-elsewhere');
  assert.match(w[0].message, /its launcher virt-launcher-train-abcde is bound there/);
  // Only a Node that is gone releases them; an ended VM or launcher holds nothing there.
  const u = copy(s);
  u.nodes = u.nodes.filter((n) => n.metadata.name !== 'gpu-1');
  u.gpunodes = u.gpunodes.filter((n) => n.metadata.name !== 'gpu-1');
  assert.ok(!ids(check(u)).includes('vm-gpus-elsewhere'));
  const x = copy(t);
  x.pods[0].status.phase = 'Failed';
  none(check(x));
  const y = copy(s);
  y.vmis[0].status.phase = 'Succeeded';
  assert.ok(!ids(check(y)).includes('vm-gpus-elsewhere'));
});

// ---- usage-record ----

test('usage-record D16: a held device without a record, a record of a device holding nothing, a record of a gone device', () => {
  const s = clean();
  s.workloads = s.workloads.filter((w) => w.metadata.name !== 'gpudevice-held');
  let v = only(check(s, settled), 'usage-record');
  assert.match(v[0].message, /holds 1 x a100 \(Bound on gpu-2\) but has no usage record/);
  const t = clean();
  t.gpudevices.push(device('tenant-a', 'fresh', { phase: null, created: iso(NOW - 2) }));
  t.workloads.push(record(dev(t, 'tenant-a/fresh')));
  v = only(check(t, settled), 'usage-record');
  assert.match(v[0].message, /holds no units/);
  const u = clean();
  u.gpudevices = u.gpudevices.filter((d) => d.metadata.name !== 'lost');
  v = only(check(u, settled), 'usage-record');
  assert.match(v[0].message, /owner GPUDevice .* is gone/);
  none(check(u));  // records follow devices within a pass: only settled
});

test('usage-record: the record status shape, operational only while Bound, and two records for one device', () => {
  const cases = [
    { type: 'h100' }, { resources: { 'gpu.cozystack.io/a100': 2 } }, { operational: true }, { kind: 'raw' },
  ];
  for (const overrides of cases) {
    const s = clean();
    s.workloads[2] = record(dev(s, 'tenant-b/lost'), overrides);
    only(check(s, settled), 'usage-record');
  }
  const s = clean();
  const twin = record(dev(s, 'tenant-a/held'));
  twin.metadata.name = 'gpudevice-held-2';
  s.workloads.push(twin);
  const v = only(check(s, settled), 'usage-record');
  assert.match(v.map((x) => x.message).join('\n'), /has 2 usage records/);
});

test('usage-record D16: a namespace with records has the monitor selecting the reserved key; pod records and no Cozystack are skipped', () => {
  const s = clean();
  s.workloadmonitors = [monitor('tenant-a')];
  let v = only(check(s, settled), 'usage-record');
  assert.equal(v[0].object.kind, 'WorkloadMonitor');
  s.workloadmonitors.push(monitor('tenant-b'));
  s.workloadmonitors[1].spec.selector = { app: 'x' };
  v = only(check(s, settled), 'usage-record');
  assert.match(v[0].message, /reserved key/);
  const p = clean();
  p.workloads.push({ apiVersion: 'cozystack.io/v1alpha1', kind: 'Workload',
    metadata: { namespace: 'tenant-a', name: 'gpupod-raw', labels: { 'workloads.cozystack.io/monitor': 'cozy-gpu-usage' },
      ownerReferences: [{ apiVersion: 'v1', kind: 'Pod', name: 'raw', uid: 'uid-pod-raw' }] },
    status: { kind: 'gpu', type: 'raw', resources: { 'nvidia.com/GA100': '1' }, operational: true } });
  none(check(p, settled));
  const q = clean();
  delete q.workloads;
  delete q.workloadmonitors;
  q.resourcequotas = [];
  q.gpudevices.push(device('tenant-a', 'no-record', { node: 'gpu-2' }));
  none(check(q, settled));
});

test('usage-record D19: a deleting device released to Pending has no record', () => {
  const s = clean();
  const held = dev(s, 'tenant-a/held');
  held.metadata.deletionTimestamp = iso(NOW - 60);
  held.metadata.finalizers = ['example.com/hold'];
  held.status = { phase: 'Pending' };
  only(check(s, settled), 'usage-record');
  s.workloads = s.workloads.filter((w) => w.metadata.name !== 'gpudevice-held');
  none(check(s, settled));
});

// ---- left-over ----

test('left-over D14: a template device whose VMI is gone is deleted; one whose VMI runs stays', () => {
  const s = clean();
  const train = dev(s, 'tenant-a/train');
  train.metadata.labels = { 'gpu.cozystack.io/template-device': 'true' };
  none(check(s, settled));
  s.vmis = [];
  s.pods = [];
  const v = only(check(s, settled), 'left-over');
  assert.match(v[0].message, /template device whose VMI tenant-a\/train \(uid uid-vmi-tenant-a-train\) is gone/);
  delete train.status.attachment;
  only(check(s, settled), 'left-over');
});

test('left-over D18: an attachment whose VMI is gone past the grace is cleared; within the grace it stays', () => {
  const s = clean();
  dev(s, 'tenant-a/held').status.attachment = { vmiName: 'never', attachedAt: iso(NOW - 60) };
  none(check(s, settled));
  none(check(s, { settled: true, attachmentGraceSeconds: 60 }));
  const v = only(check(s, { settled: true, attachmentGraceSeconds: 30 }), 'left-over');
  assert.match(v[0].message, /attachment not cleared: VMI tenant-a\/never is gone \(attached 60s before the snapshot, grace 30s\)/);
  // A VMI recreated under the same name is another VMI.
  const t = clean();
  t.vmis[0].metadata.uid = 'uid-new';
  t.pods = [];
  const w = only(check(t, settled), 'left-over');
  assert.equal(w[0].object.name, 'train');
});

test('left-over D13 D19: a deleting device no VMI uses keeps neither the finalizer nor its units', () => {
  const s = clean();
  const held = dev(s, 'tenant-a/held');
  held.metadata.deletionTimestamp = iso(NOW - 60);
  const v = check(s, settled).filter((x) => x.invariant === 'left-over');
  assert.equal(v.length, 2, JSON.stringify(v));
  assert.match(v[0].message, /still carries gpu.cozystack.io\/device-protection \(D13\)/);
  assert.match(v[1].message, /still holds units \(Bound on gpu-2\): not released \(D19\)/);
  // While its VMI runs it keeps both (D13).
  const t = clean();
  dev(t, 'tenant-a/train').metadata.deletionTimestamp = iso(NOW - 60);
  none(check(t, settled));
});

test('left-over D15: a deleting class no device names loses class-protection; one still named keeps it', () => {
  const s = clean();
  s.gpuclasses.push(gpuClass('h100', { resourceName: 'nvidia.com/GH100', deletingSince: iso(NOW - 60) }));
  const v = only(check(s, settled), 'left-over');
  assert.equal(v[0].object.kind, 'GPUClass');
  s.gpudevices.push(device('tenant-a', 'waits', { cls: 'h100', phase: 'Lost' }));
  s.workloads.push(record(dev(s, 'tenant-a/waits')));
  none(check(s, settled).filter((x) => x.invariant === 'left-over'));
  none(check(s).filter((x) => x.invariant === 'left-over'));
});

// ---- pending-without-reason ----

test('pending-without-reason D9: a Pending order says why; a Failed answer or a False condition with a message does', () => {
  const s = clean();
  s.gpudevices.push(device('tenant-a', 'waits', { phase: 'Pending' }));
  let v = only(check(s), 'pending-without-reason');
  assert.match(v[0].message, /Pending and its status says no reason/);
  Object.assign(dev(s, 'tenant-a/waits').status, { bindRequest: { id: 'r1' }, bindResponse: { id: 'r1', result: 'Failed', reason: 'Refused', message: 'no node has 1 free a100' } });
  none(check(s, settled));
  dev(s, 'tenant-a/waits').status.bindResponse.message = '';
  only(check(s), 'pending-without-reason');
  dev(s, 'tenant-a/waits').status = { phase: 'Pending', conditions: [{ type: 'Bound', status: 'False', reason: 'NoRoom', message: 'no node has room' }] };
  none(check(s, settled));
});

test('pending-without-reason D4: an unanswered request only when settled; an order with no phase only when old and settled', () => {
  const s = clean();
  s.gpudevices.push(device('tenant-a', 'asked', { phase: 'Pending', bindRequest: { id: 'r2' } }));
  none(check(s));
  let v = only(check(s, settled), 'pending-without-reason');
  assert.match(v[0].message, /bind request r2 is unanswered/);
  const t = clean();
  t.gpudevices.push(device('tenant-a', 'new', { phase: null, created: iso(NOW - 3) }));
  none(check(t, settled));
  dev(t, 'tenant-a/new').metadata.creationTimestamp = iso(NOW - 30);
  none(check(t));
  v = only(check(t, settled), 'pending-without-reason');
  assert.match(v[0].message, /no phase 10s after creation/);
  // A deleting device released to Pending (D19) is leaving; it owes no reason.
  const u = clean();
  u.gpudevices.push(device('tenant-a', 'gone', { phase: 'Pending', deletingSince: iso(NOW - 5), finalizers: ['example.com/hold'] }));
  none(check(u, settled));
});

// ---- the command ----

function writeSnapshot(s, { skip = [], takenAt = String(NOW) } = {}) {
  const dir = mkdtempSync(join(tmpdir(), 'invariants-'));
  const files = { gpunodes: s.gpunodes, gpuclasses: s.gpuclasses, gpudevices: s.gpudevices, vmis: s.vmis, pods: s.pods,
    namespaces: s.namespaces, resourcequotas: s.resourcequotas, nodes: s.nodes, workloads: s.workloads, workloadmonitors: s.workloadmonitors };
  for (const [name, items] of Object.entries(files)) {
    if (skip.includes(name) || items === undefined) continue;
    writeFileSync(join(dir, `${name}.json`), JSON.stringify({ apiVersion: 'v1', kind: 'List', items }));
  }
  writeFileSync(join(dir, 'taken-at'), takenAt);
  return dir;
}

const run = (...args) => spawnSync(process.execPath, [SCRIPT, ...args], { encoding: 'utf8' });

test('the command: exit 0 and the summary on a clean pair, 1 with a VIOLATION line per violation', (t) => {
  const prev = clean();
  const cur = copy(prev);
  dev(cur, 'tenant-a/held').status.nodeName = 'gpu-1';
  const dirs = [writeSnapshot(prev), writeSnapshot(cur)];
  t.after(() => dirs.forEach((d) => rmSync(d, { recursive: true })));
  let r = run('--settled', '--previous', dirs[0], dirs[0]);
  assert.equal(r.status, 0, r.stderr + r.stdout);
  assert.equal(r.stdout, 'invariants: 3 devices, 3 nodes checked, 0 violations\n');
  r = run('--settled', '--attachment-grace', '60', '--previous', dirs[0], dirs[1]);
  assert.equal(r.status, 1, r.stderr);
  const lines = r.stdout.trim().split('\n');
  assert.equal(lines.length, 2, r.stdout);
  assert.match(lines[0], /^VIOLATION bound-stays-bound GPUDevice tenant-a\/held: was Bound on gpu-2, now Bound on gpu-1, /);
  assert.equal(lines[1], 'invariants: 3 devices, 3 nodes checked, 1 violations');
  // gpu-2 not Ready between the two for up to a minute: a move past a --not-ready-grace of 60 s.
  const blip = copy(cur);
  blip.nodes[1].status.conditions[0].lastTransitionTime = iso(NOW + 60);
  dirs.push(writeSnapshot(blip, { takenAt: String(NOW + 90) }));
  assert.equal(run('--not-ready-grace', '60', '--previous', dirs[0], dirs[2]).status, 0);
  assert.equal(run('--not-ready-grace', '70', '--previous', dirs[0], dirs[2]).status, 1);
  // Cluster-scoped objects print by name alone.
  cur.gpunodes[0].status.devices = [];
  const over = writeSnapshot(cur);
  dirs.push(over);
  r = run(over);
  assert.equal(r.status, 1);
  assert.match(r.stdout, /^VIOLATION unit-held-twice GPUNode gpu-1: node gpu-1 nvidia.com\/GA100: 3 units Bound \(tenant-a\/train x2, tenant-a\/held x1\) > 0 allocatable$/m);
});

test('the command: exit 2 naming the file on unreadable input', (t) => {
  const s = clean();
  const missing = writeSnapshot(s, { skip: ['vmis'] });
  const badTime = writeSnapshot(s, { takenAt: 'yesterday' });
  const notList = writeSnapshot(s);
  writeFileSync(join(notList, 'nodes.json'), '{"kind": "Node"}');
  const notJson = writeSnapshot(s);
  writeFileSync(join(notJson, 'pods.json'), '{"items": [');
  t.after(() => [missing, badTime, notList, notJson].forEach((d) => rmSync(d, { recursive: true })));
  for (const [dir, what] of [[missing, /vmis.json: cannot read: ENOENT/], [badTime, /taken-at: "yesterday" is not epoch seconds/],
    [notList, /nodes.json: not a List/], [notJson, /pods.json: not JSON/]]) {
    const r = run(dir);
    assert.equal(r.status, 2, r.stdout);
    assert.match(r.stderr, what);
  }
  assert.equal(run().status, 2);
  assert.equal(run('--attachment-grace', 'soon', missing).status, 2);
  assert.match(run('--not-ready-grace', '20s', missing).stderr, /--not-ready-grace: "20s" is not whole seconds/);
});
