// A ValidatingAdmissionPolicy evaluated the way the API server applies one
// (kubernetes/apiserver pkg/admission/plugin/policy/validating and pkg/admission/plugin/cel),
// with a real CEL implementation (@bufbuild/cel):
//
// - matchConstraints.resourceRules, with "*", "<resource>/*" and "*/<subresource>";
// - matchConditions: any false and the policy does not apply; else any error: under
//   failurePolicy Fail the request is DENIED, under Ignore the policy does not apply;
// - variables, lazily as the API server does: one that errors is an error only where it is used;
// - every validation: false denies with its message (or messageExpression); an error denies
//   under Fail and is skipped under Ignore; a non-bool result is an error.
//
// @bufbuild/cel's run() never throws: it returns a CelError value (isCelError), so an error is
// looked for in the result. A harness that only caught exceptions would read every erroring
// expression as "not matched" or "passed", i.e. fail open where the API server fails closed.
//
// The variables are bound as the API server binds them (CreateAdmissionRequest, then
// runtime.DefaultUnstructuredConverter): `object` and `oldObject` whole (null on CREATE and
// DELETE respectively), `request` as an AdmissionRequest with Go's omitempty applied, so an empty
// subResource, name, namespace, groups list or extra map is ABSENT and reading it unguarded is an
// error, as it is in the API server.
import { run, isCelError } from "@bufbuild/cel";
import { strings } from "@bufbuild/cel/ext";

// Kubernetes' CEL environment has the strings extension (substring, split, ...) in every
// version that serves admissionregistration.k8s.io/v1 policies.
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
  operation, userInfo, dryRun = false }) {
  return {
    ...omitEmpty({
      kind, resource, subResource,
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

function subresourceMatches(pattern, resource, subResource) {
  const full = subResource ? `${resource}/${subResource}` : resource;
  if (pattern === "*/*") return true;
  if (pattern === "*") return !subResource;
  const [patternResource, patternSub] = pattern.split("/");
  if (patternSub === undefined) return pattern === full;
  if (patternResource === "*") return subResource === patternSub;
  if (patternSub === "*") return patternResource === resource && Boolean(subResource);
  return pattern === full;
}

function ruleMatches(rule, req) {
  const scope = rule.scope ?? "*";
  return (scope === "*" || scope === (req.namespace ? "Namespaced" : "Cluster")) &&
    rule.apiGroups.some((g) => g === "*" || g === req.resource.group) &&
    rule.apiVersions.some((v) => v === "*" || v === req.resource.version) &&
    rule.operations.some((o) => o === "*" || o === req.operation) &&
    rule.resources.some((r) => subresourceMatches(r, req.resource.resource, req.subResource));
}

// What this harness does not model is refused rather than evaluated wrongly.
function assertSupported(policy) {
  const constraints = policy.spec.matchConstraints ?? {};
  for (const unsupported of ["excludeResourceRules", "objectSelector", "namespaceSelector"]) {
    if (constraints[unsupported]) {
      throw new Error(`admission harness: matchConstraints.${unsupported} is not modelled`);
    }
  }
  for (const unsupported of ["paramKind", "auditAnnotations"]) {
    if (policy.spec[unsupported]) {
      throw new Error(`admission harness: spec.${unsupported} is not modelled`);
    }
  }
  for (const rule of constraints.resourceRules ?? []) {
    if (rule.resourceNames?.length) {
      throw new Error("admission harness: resourceNames are not modelled");
    }
  }
}

// The API server's decision on one request for one policy (bound with validationActions Deny).
// request: admissionRequest(...) plus the object and oldObject of the write (plain JSON).
// Returns {matched, allowed, messages, errors}: errors are evaluation errors (each denies under
// Fail), messages are what the caller would be told.
export function admit(policy, { request, object = null, oldObject = null }) {
  assertSupported(policy);
  const failurePolicy = policy.spec.failurePolicy ?? "Fail";
  const rules = policy.spec.matchConstraints?.resourceRules ?? [];
  if (!rules.some((rule) => ruleMatches(rule, request))) {
    return { matched: false, allowed: true, messages: [], errors: [] };
  }
  const bindings = {
    request: toCel(request),
    object: toCel(object),
    oldObject: toCel(oldObject),
    params: null,
    namespaceObject: null,  // the policies here are about cluster-scoped objects
  };

  const conditionErrors = [];
  for (const condition of policy.spec.matchConditions ?? []) {
    const result = evaluateBool(condition.expression, bindings);
    if ("error" in result) {
      conditionErrors.push(`matchCondition ${condition.name}: ${result.error}`);
    } else if (result.value === false) {
      return { matched: false, allowed: true, messages: [], errors: [] };
    }
  }
  if (conditionErrors.length > 0) {
    if (failurePolicy === "Fail") {
      return { matched: true, allowed: false, messages: conditionErrors, errors: conditionErrors };
    }
    return { matched: false, allowed: true, messages: [], errors: conditionErrors };
  }

  // A variable that errors is left out of `variables`, so using it is an error ("no such key")
  // and an expression that does not reach it is unaffected: what lazy evaluation gives.
  const variables = new Map();
  for (const variable of policy.spec.variables ?? []) {
    const result = evaluate(variable.expression, { ...bindings, variables });
    if (!("error" in result)) variables.set(variable.name, result.value);
  }
  const scope = { ...bindings, variables };

  const messages = [];
  const errors = [];
  for (const validation of policy.spec.validations ?? []) {
    const result = evaluateBool(validation.expression, scope);
    if ("error" in result) {
      const message = `expression '${validation.expression}' resulted in error: ${result.error}`;
      errors.push(message);
      if (failurePolicy === "Fail") messages.push(message);
      continue;
    }
    if (result.value) continue;
    let message = validation.message ?? `failed expression: ${validation.expression}`;
    if (validation.messageExpression) {
      const text = evaluate(validation.messageExpression, scope);
      if ("error" in text) {
        errors.push(`messageExpression: ${text.error}`);
      } else if (typeof text.value === "string" && text.value.trim() !== "") {
        message = text.value.trim();
      }
    }
    messages.push(message);
  }
  return { matched: true, allowed: messages.length === 0, messages, errors };
}
