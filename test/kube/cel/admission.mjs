// A ValidatingAdmissionPolicy and its binding evaluated the way the API server applies them
// (kubernetes/apiserver pkg/admission/plugin/policy/generic/policy_dispatcher.go,
// .../policy/validating/dispatcher.go and validator.go, .../webhook/predicates/rules and
// namespace and object matchers), with a real CEL implementation (@bufbuild/cel). What this
// models and where each rule comes from is in docs/testing.md "The admission-policy
// evaluator". In order, for one request:
//
// 1. matching: the policy's matchConstraints and the binding's matchResources must both match:
//    resourceRules (operations, apiGroups, apiVersions, resources with "*", "*/*", "r/*",
//    "*/sub", resourceNames, scope), none of excludeResourceRules, namespaceSelector (on the
//    namespace's labels; a Namespace request on its own labels; other cluster-scoped objects
//    always match) and objectSelector (object's OR oldObject's labels; a null object never
//    matches a non-empty selector). A matching error (unknown namespace) is a configuration
//    error, subject to failurePolicy;
// 2. params, before any expression runs: paramKind with the binding's paramRef (name or
//    selector, namespace, parameterNotFoundAction). No paramRef, or a namespace that cannot be
//    resolved, is a configuration error (failurePolicy). No parameter found: Allow skips the
//    binding, Deny is an error under failurePolicy (Fail denies). A selector may find several:
//    the policy runs once per parameter and any denial denies;
// 3. matchConditions, per parameter: any false and the policy does not apply; else any error:
//    Fail denies, Ignore skips;
// 4. variables in order, each erroring one an error only where it is used (lazy evaluation
//    gives the same results for side-effect-free CEL);
// 5. validations: false denies with messageExpression's result (a non-empty single-line
//    string) or message or "failed expression: ..."; an error (or a non-bool) denies under Fail
//    and is skipped under Ignore: never read as allowed;
// 6. the binding's validationActions: Deny denies, Warn warns, Audit records.
//
// Bindings: `object` and `oldObject` whole (null on CREATE and on DELETE respectively),
// `params`, `namespaceObject` (null for cluster-scoped requests), `request` as the
// AdmissionRequest the converter produces (omitempty fields absent), `variables`.
// `authorizer` is not modelled (no policy here uses it) and is refused if referenced.
//
// @bufbuild/cel's run() never throws: it returns a CelError value (isCelError), so errors are
// looked for in results. The CEL functions available are the standard ones and the cel-go
// strings extension; every expression must also pass the oldest-minor check
// (cel-versions.mjs), which the tests run on the rendered chart.
import { run, isCelError } from "@bufbuild/cel";
import { strings } from "@bufbuild/cel/ext";

const ENV = { funcs: strings };

// CEL maps are Maps and CEL ints are bigints; plain JSON converted as the server binds it.
export function toCel(value) {
  if (Array.isArray(value)) return value.map(toCel);
  if (value !== null && typeof value === "object") {
    return new Map(Object.entries(value).map(([k, v]) => [k, toCel(v)]));
  }
  if (typeof value === "number" && Number.isInteger(value)) return BigInt(value);
  return value;
}

// Go's encoding/json omitempty as the unstructured converter applies it: "", false, nil and
// empty maps and slices are left out.
function omitEmpty(fields) {
  const out = {};
  for (const [key, value] of Object.entries(fields)) {
    if (value === undefined || value === null || value === "" || value === false) continue;
    if (Array.isArray(value) && value.length === 0) continue;
    if (typeof value === "object" && !Array.isArray(value) && Object.keys(value).length === 0) {
      continue;
    }
    out[key] = value;
  }
  return out;
}

// The `request` variable for a request on `resource` ({group, version, resource}), as
// CreateAdmissionRequest builds it (admissionv1.AdmissionRequest).
export function admissionRequest({ kind, resource, subResource = "", name = "", namespace = "",
  operation, userInfo, dryRun = false, uid = "req-1" }) {
  return {
    ...omitEmpty({
      uid, kind, resource, subResource,
      requestKind: kind, requestResource: resource, requestSubResource: subResource,
      name, namespace, operation,
    }),
    // A struct, so always there; its own fields are omitempty.
    userInfo: omitEmpty({
      username: userInfo.username, uid: userInfo.uid,
      groups: userInfo.groups ?? [], extra: userInfo.extra ?? {},
    }),
    // A *bool the API server always sets, so present even when false.
    dryRun,
  };
}

function evaluate(expression, bindings) {
  if (/\bauthorizer\b/.test(expression)) {
    throw new Error(`admission harness: authorizer is not modelled: '${expression}'`);
  }
  let value;
  try {
    value = run(expression, bindings, ENV);
  } catch (error) {
    // run() is documented never to throw; should it, it is an error all the same.
    return { error: String(error) };
  }
  if (isCelError(value)) return { error: value.message };
  return { value };
}

function evaluateBool(expression, bindings) {
  const result = evaluate(expression, bindings);
  if ("error" in result) return result;
  if (typeof result.value !== "boolean") {
    return { error: `expression '${expression}' is not a bool: ${String(result.value)}` };
  }
  return result;
}

// A metav1.LabelSelector on a label map (labels.SelectorFromSet + requirements). An absent
// selector is the empty one, which matches everything.
export function selectorMatches(selector, labels = {}) {
  if (!selector) return true;
  for (const [key, value] of Object.entries(selector.matchLabels ?? {})) {
    if (labels[key] !== value) return false;
  }
  for (const { key, operator, values = [] } of selector.matchExpressions ?? []) {
    const present = Object.hasOwn(labels, key);
    switch (operator) {
      case "In": if (!present || !values.includes(labels[key])) return false; break;
      case "NotIn": if (present && values.includes(labels[key])) return false; break;
      case "Exists": if (!present) return false; break;
      case "DoesNotExist": if (present) return false; break;
      default: throw new Error(`admission harness: selector operator ${operator}`);
    }
  }
  return true;
}

function selectorIsEmpty(selector) {
  return !selector || (Object.keys(selector.matchLabels ?? {}).length === 0 &&
    (selector.matchExpressions ?? []).length === 0);
}

const isNamespaceRequest = (req) => req.resource.group === "" &&
  req.resource.resource === "namespaces";

// rules.Matcher: operation, group, version, resource/subresource (splitResource), scope, names.
function ruleMatches(rule, req) {
  const namespaced = !isNamespaceRequest(req) && Boolean(req.namespace);
  const scope = rule.scope ?? "*";
  const scopeOk = scope === "*" || (scope === "Namespaced" ? namespaced : !namespaced);
  const resourceOk = rule.resources.some((pattern) => {
    const [res, sub = ""] = pattern.split("/");
    return (res === "*" || res === req.resource.resource) &&
      (sub === "*" || sub === (req.subResource ?? ""));
  });
  const names = rule.resourceNames ?? [];
  return scopeOk && resourceOk &&
    rule.apiGroups.some((g) => g === "*" || g === req.resource.group) &&
    rule.apiVersions.some((v) => v === "*" || v === req.resource.version) &&
    rule.operations.some((o) => o === "*" || o === req.operation) &&
    (names.length === 0 || names.includes(req.name ?? ""));
}

const labelsOf = (object) => object?.metadata?.labels ?? {};

// The namespace matcher: a request on a Namespace uses that namespace's own labels (the
// object, or oldObject on DELETE); any other cluster-scoped request always matches.
function namespaceMatches(selector, write, cluster) {
  const req = write.request;
  if (!req.namespace && !isNamespaceRequest(req)) return { matches: true };
  if (selectorIsEmpty(selector)) return { matches: true };
  let labels;
  if (isNamespaceRequest(req) && !req.subResource) {
    labels = labelsOf(req.operation === "DELETE" ? write.oldObject : write.object);
  } else {
    const namespace = cluster.namespaces?.[req.namespace ?? req.name];
    if (!namespace) return { error: `namespace ${req.namespace} not found` };
    labels = labelsOf(namespace);
  }
  return { matches: selectorMatches(selector, labels) };
}

// The object matcher: either the object or the old object matches; a null one never does.
function objectMatches(selector, write) {
  if (selectorIsEmpty(selector)) return true;
  return [write.object, write.oldObject].some((o) => o != null &&
    selectorMatches(selector, labelsOf(o)));
}

function resourcesMatch(match, write, cluster, { rulesRequired }) {
  const req = write.request;
  const rules = match?.resourceRules ?? [];
  if (rulesRequired || rules.length > 0) {
    if (!rules.some((rule) => ruleMatches(rule, req))) return { matches: false };
  }
  if ((match?.excludeResourceRules ?? []).some((rule) => ruleMatches(rule, req))) {
    return { matches: false };
  }
  const ns = namespaceMatches(match?.namespaceSelector, write, cluster);
  if (ns.error || !ns.matches) return ns;
  return { matches: objectMatches(match?.objectSelector, write) };
}

// The scope of the kinds a policy here takes as parameter.
const PARAM_KIND_NAMESPACED = {
  "v1/ConfigMap": true,
  "gpu.cozystack.io/v1alpha1/GPUClass": false,
};

// The parameters the binding names: {params: [...]} or {error} or {allow: true}.
function resolveParams(policy, binding, write, cluster) {
  const paramKind = policy.spec.paramKind;
  if (!paramKind) return { params: [null] };
  const kindKey = `${paramKind.apiVersion}/${paramKind.kind}`;
  if (!(kindKey in PARAM_KIND_NAMESPACED)) {
    throw new Error(`admission harness: paramKind ${kindKey} is not modelled`);
  }
  const ref = binding.spec.paramRef;
  if (!ref) return { error: `binding ${binding.metadata.name} has no paramRef, policy needs ${kindKey}` };
  if (!ref.parameterNotFoundAction) {
    // Required by the API server's validation of the binding.
    throw new Error(`admission harness: binding ${binding.metadata.name}: paramRef.parameterNotFoundAction is required`);
  }
  if (Boolean(ref.name) === Boolean(ref.selector)) {
    throw new Error(`admission harness: binding ${binding.metadata.name}: exactly one of paramRef name and selector`);
  }
  const namespaced = PARAM_KIND_NAMESPACED[kindKey];
  let namespace = "";
  if (namespaced) {
    namespace = ref.namespace ?? write.request.namespace ?? "";
    if (!namespace) return { error: "paramRef has no namespace and the request is cluster-scoped" };
  } else if (ref.namespace) {
    return { error: `paramRef.namespace is set but ${kindKey} is cluster-scoped` };
  }
  const candidates = (cluster.objects ?? []).filter((o) =>
    `${o.apiVersion}/${o.kind}` === kindKey && (o.metadata.namespace ?? "") === namespace);
  const params = ref.name
    ? candidates.filter((o) => o.metadata.name === ref.name)
    : candidates.filter((o) => selectorMatches(ref.selector, labelsOf(o)));
  if (params.length > 0) return { params };
  if (ref.parameterNotFoundAction === "Allow") return { allow: true };
  return { error: "no params found for policy binding with `Deny` parameterNotFoundAction" };
}

// What the request tells and the caller is told, for one policy and binding.
function decision({ matched, denials = [], errors = [], warnings = [] }, policy, binding) {
  const name = policy.metadata.name;
  const bindingName = binding.metadata.name;
  return {
    matched,
    allowed: denials.length === 0,
    messages: denials.map((d) => d.message),
    reasons: denials.map((d) => d.reason),
    // What kubectl would print for the first denial.
    denial: denials.length === 0 ? "" :
      `ValidatingAdmissionPolicy '${name}' with binding '${bindingName}' denied request: ${denials[0].message}`,
    errors,
    warnings,
  };
}

// A binding that applies the policy everywhere it matches, with validationActions Deny.
export function defaultBinding(policy) {
  return {
    metadata: { name: policy.metadata.name },
    spec: { policyName: policy.metadata.name, validationActions: ["Deny"] },
  };
}

// The API server's decision on one request for one policy and one binding.
// write: {request: admissionRequest(...), object, oldObject} (plain JSON; null where absent).
// cluster: {namespaces: {name: Namespace}, objects: [candidate parameter objects],
//   unresolvedKinds: ["apiVersion/Kind" of parameter kinds the API server has not resolved]}.
// Returns {matched, allowed, messages, reasons, denial, errors, warnings}: errors are
// evaluation and configuration errors, each a denial under failurePolicy Fail.
export function admit(policy, write, { binding = defaultBinding(policy), cluster = {} } = {}) {
  for (const unsupported of ["auditAnnotations"]) {
    if (policy.spec[unsupported]) {
      throw new Error(`admission harness: spec.${unsupported} is not modelled`);
    }
  }
  if (binding.spec.policyName !== policy.metadata.name) {
    throw new Error(`admission harness: binding ${binding.metadata.name} is for ${binding.spec.policyName}`);
  }
  const actions = binding.spec.validationActions ?? [];
  if (actions.length === 0 || (actions.includes("Deny") && actions.includes("Warn"))) {
    throw new Error(`admission harness: binding ${binding.metadata.name}: validationActions ${actions}`);
  }
  const failurePolicy = policy.spec.failurePolicy ?? "Fail";
  const object = write.object ?? null;
  const oldObject = write.oldObject ?? null;
  const full = { request: write.request, object, oldObject };

  // A configuration or evaluation error that is not a validation's: the whole policy fails,
  // worded as the dispatcher wraps it ("failed to configure policy: ..." for the policy's own
  // matching, "failed to configure binding: ..." for the binding's matching and parameters).
  const failed = (error, of = "binding") => {
    const message = `failed to configure ${of}: ${error}`;
    return failurePolicy === "Fail"
      ? decision({ matched: true, denials: [{ message, reason: "Invalid" }], errors: [message] },
        policy, binding)
      : decision({ matched: false, errors: [message] }, policy, binding);
  };

  const constraints = resourcesMatch(policy.spec.matchConstraints, full, cluster,
    { rulesRequired: true });
  if (constraints.error) return failed(constraints.error, "policy");
  if (!constraints.matches) return decision({ matched: false }, policy, binding);
  // A parameter kind the API server has not resolved (cluster.unresolvedKinds, "apiVersion/Kind"):
  // a restarted server resolves a CRD's kind only some seconds after it is ready. The policy's
  // configuration error, taken once the policy matches and before its binding
  // (generic/policy_source.go ensureParamsForPolicyLocked, policy_dispatcher.go), under
  // failurePolicy.
  const paramKind = policy.spec.paramKind;
  if (paramKind && (cluster.unresolvedKinds ?? []).includes(`${paramKind.apiVersion}/${paramKind.kind}`)) {
    return failed("failed to find resource referenced by paramKind: " +
      `'${paramKind.apiVersion}, Kind=${paramKind.kind}'`, "policy");
  }
  const bound = resourcesMatch(binding.spec.matchResources, full, cluster,
    { rulesRequired: false });
  if (bound.error) return failed(bound.error);
  if (!bound.matches) return decision({ matched: false }, policy, binding);

  const resolved = resolveParams(policy, binding, full, cluster);
  if (resolved.error) return failed(resolved.error);
  if (resolved.allow) return decision({ matched: true }, policy, binding);

  const req = write.request;
  let namespaceObject = null;
  if (req.namespace && !isNamespaceRequest(req)) {
    namespaceObject = cluster.namespaces?.[req.namespace];
    if (!namespaceObject) return failed(`namespace ${req.namespace} not found`);
  }

  const all = { matched: false, denials: [], errors: [], warnings: [] };
  for (const param of resolved.params) {
    const one = evaluateOnce(policy, {
      request: toCel(req), object: toCel(object), oldObject: toCel(oldObject),
      params: toCel(param), namespaceObject: toCel(namespaceObject),
    }, failurePolicy);
    all.matched ||= one.matched;
    all.errors.push(...one.errors);
    if (actions.includes("Deny")) all.denials.push(...one.denials);
    if (actions.includes("Warn")) all.warnings.push(...one.denials.map((d) => d.message));
  }
  return decision(all, policy, binding);
}

function evaluateOnce(policy, bindings, failurePolicy) {
  const conditionErrors = [];
  for (const condition of policy.spec.matchConditions ?? []) {
    const result = evaluateBool(condition.expression, bindings);
    if ("error" in result) {
      conditionErrors.push(`matchCondition ${condition.name}: ${result.error}`);
    } else if (result.value === false) {
      return { matched: false, denials: [], errors: [] };
    }
  }
  if (conditionErrors.length > 0) {
    const denials = failurePolicy === "Fail"
      ? conditionErrors.map((message) => ({ message, reason: "Invalid" })) : [];
    return { matched: failurePolicy === "Fail", denials, errors: conditionErrors };
  }

  // In order; one that errors is left out, so using it is an error where it is used and
  // nowhere else, which is what lazy evaluation gives.
  const variables = new Map();
  const variableErrors = {};
  for (const variable of policy.spec.variables ?? []) {
    const result = evaluate(variable.expression, { ...bindings, variables });
    if ("error" in result) variableErrors[variable.name] = result.error;
    else variables.set(variable.name, result.value);
  }
  const scope = { ...bindings, variables };
  const explain = (expression, error) => {
    const used = Object.keys(variableErrors).filter((n) =>
      new RegExp(`\\bvariables\\.${n}\\b`).test(expression));
    return used.length === 0 ? error :
      `${error} (variables ${used.map((n) => `${n}: ${variableErrors[n]}`).join("; ")})`;
  };

  const denials = [];
  const errors = [];
  for (const validation of policy.spec.validations ?? []) {
    const result = evaluateBool(validation.expression, scope);
    if ("error" in result) {
      const message = `expression '${validation.expression}' resulted in error: ${explain(validation.expression, result.error)}`;
      errors.push(message);
      if (failurePolicy === "Fail") denials.push({ message, reason: "Invalid" });
      continue;
    }
    if (result.value) continue;
    // As validator.go words it: messageExpression's string, trimmed, unless empty, longer
    // than 5 KiB or holding a line feed; else message, trimmed; else the expression.
    let message = "";
    if (validation.messageExpression) {
      const text = evaluate(validation.messageExpression, scope);
      if ("error" in text) {
        errors.push(`messageExpression: ${explain(validation.messageExpression, text.error)}`);
      } else if (typeof text.value !== "string") {
        errors.push(`messageExpression: not a string: ${String(text.value)}`);
      } else {
        const trimmed = text.value.trim();
        if (Buffer.byteLength(trimmed) <= 5 * 1024 && !trimmed.includes("\n")) message = trimmed;
      }
    }
    if (message === "" && validation.message) message = validation.message.trim();
    if (message === "") message = `failed expression: ${validation.expression.trim()}`;
    denials.push({ message, reason: validation.reason ?? "Invalid" });
  }
  return { matched: true, denials, errors };
}

// Every policy and binding of a rendered chart on one request, as the API server runs them
// all: the request is allowed only when no binding denies. Returns {allowed, decisions}, one
// decision per binding, labelled with the binding's name.
export function admitAll(documents, write, cluster = {}) {
  const policies = new Map(documents.filter((d) => d.kind === "ValidatingAdmissionPolicy")
    .map((p) => [p.metadata.name, p]));
  const decisions = [];
  for (const binding of documents.filter((d) => d.kind === "ValidatingAdmissionPolicyBinding")) {
    const policy = policies.get(binding.spec.policyName);
    // A binding naming no policy is ignored by the API server (nothing to evaluate).
    if (!policy) continue;
    decisions.push({ binding: binding.metadata.name, ...admit(policy, write, { binding, cluster }) });
  }
  return { allowed: decisions.every((d) => d.allowed), decisions };
}
