// Which CEL functions, macros and syntax each Kubernetes minor's API server compiles (H6).
//
// The API server builds its CEL environment from versioned option sets: each library has the
// minor that introduced it (kubernetes/kubernetes,
// staging/src/k8s.io/apiserver/pkg/cel/environment/base.go, `baseOptsWithoutStrictCost`).
// The functions of each library are those of its package: k8s.io/apiserver/pkg/cel/library
// (urls.go, regex.go, lists.go, authz.go, quantity.go, ip.go, cidr.go, format.go, semver.go,
// image.go) and github.com/google/cel-go/ext (strings.go with StringsVersion, sets.go,
// comprehensions.go). Listed from those sources:
//
//   minor  what                                           base.go entry
//   1.0*   CEL standard functions and macros, URLs,       the first entry ("CEL epoch was
//          regex (find, findAll), lists (isSorted, sum,   actually 1.23"); strings at
//          min, max, indexOf, lastIndexOf), strings       StringsVersion(0) until 1.29
//          version 0 (charAt, indexOf, lastIndexOf,
//          lowerAscii, upperAscii, replace, split,
//          substring, trim)
//   1.27   authorizer library (authz)                     UnversionedLib(library.Authz)
//   1.28   optional types (?. and [?], optional.*),       cel.OptionalTypes(),
//          quantity library                               UnversionedLib(library.Quantity)
//   1.29   strings version 2 (format, strings.quote;      ext.Strings(StringsVersion(2)),
//          join counted here, the conservative reading),  ext.Sets()
//          sets (sets.contains, sets.equivalent,
//          sets.intersects)
//   1.30   ip and cidr libraries                          library.IP, library.CIDR
//   1.31   format library (format.dns1123Label() ...)     library.Format
//   1.32   two-variable comprehensions (all(k, v, ...),   ext.TwoVarComprehensions()
//          transformList, transformMap ...)
//   1.33   semver and image libraries                     library.SemverLib, library.Image
//
// (* 1.0 stands for "every minor that serves admissionregistration.k8s.io/v1 policies".)
// A name this table does not list is refused: an unknown function is as unsafe as a new one.
import { parse } from "@bufbuild/cel";

// The oldest minor the chart supports: charts/gpu/Chart.yaml kubeVersion ">=1.30.0-0".
export const OLDEST_MINOR = 30;

const since = (minor, names) => Object.fromEntries(names.map((n) => [n, minor]));

// Functions (global or member) and operators, by the name the parser gives them.
export const FUNCTIONS = {
  ...since(0, [
    // Operators.
    "_==_", "_!=_", "_<_", "_<=_", "_>_", "_>=_", "_&&_", "_||_", "!_", "-_", "_?_:_",
    "_+_", "_-_", "_*_", "_/_", "_%_", "_[_]", "@in", "@not_strictly_false",
    // Standard functions.
    "size", "contains", "startsWith", "endsWith", "matches", "int", "uint", "double",
    "string", "bytes", "bool", "type", "dyn", "duration", "timestamp", "getFullYear",
    "getMonth", "getDayOfYear", "getDayOfMonth", "getDate", "getDayOfWeek", "getHours",
    "getMinutes", "getSeconds", "getMilliseconds",
    // Kubernetes URLs, regex and lists libraries.
    "url", "isURL", "getScheme", "getHost", "getHostname", "getPort", "getEscapedPath",
    "getQuery", "find", "findAll", "isSorted", "sum", "min", "max", "indexOf", "lastIndexOf",
    // cel-go strings, version 0.
    "charAt", "lowerAscii", "upperAscii", "replace", "split", "substring", "trim",
  ]),
  ...since(27, ["path", "group", "serviceAccount", "resource", "subresource", "namespace",
    "name", "check", "allowed", "reason", "errored", "error"]),
  ...since(28, ["quantity", "isQuantity", "sign", "isGreaterThan", "isLessThan", "compareTo",
    "add", "sub", "asInteger", "isInteger", "asApproximateFloat", "optional.of",
    "optional.ofNonZeroValue", "optional.none", "hasValue", "value", "orValue", "or"]),
  ...since(29, ["format", "strings.quote", "join", "sets.contains", "sets.equivalent",
    "sets.intersects"]),
  ...since(30, ["ip", "isIP", "ip.isCanonical", "family", "isUnspecified", "isLoopback",
    "isLinkLocalMulticast", "isLinkLocalUnicast", "isGlobalUnicast", "cidr", "isCIDR",
    "containsIP", "containsCIDR", "prefixLength", "masked"]),
  ...since(31, ["format.named", "validate", "format.dns1123Label", "format.dns1123Subdomain",
    "format.qualifiedName", "format.labelValue", "format.uri", "format.uuid", "format.byte",
    "format.date", "format.datetime"]),
  ...since(32, ["transformList", "transformMap", "transformMapEntry"]),
  ...since(33, ["semver", "isSemver", "major", "minor", "patch", "image", "isImage",
    "containsDigest", "registry", "repository", "identifier", "tag", "digest"]),
};

// Macros, by the name the parser records them under; a two-variable form of a comprehension
// macro is a different macro, added in 1.32.
export const MACROS = {
  ...since(0, ["has", "all", "exists", "exists_one", "map", "filter"]),
  ...since(32, ["all/2", "exists/2", "existsOne/2", "exists_one/2", "transformList",
    "transformMap", "transformMapEntry"]),
  ...since(28, ["optMap", "optFlatMap"]),
};

const COMPREHENSIONS = new Set(["all", "exists", "exists_one", "existsOne", "map", "filter"]);

// A dotted global name (`strings.quote`, `format.dns1123Label`): the parser reads it as a
// member call on an identifier.
function callName(call) {
  const target = call.target;
  if (target?.exprKind?.case === "identExpr") {
    const dotted = `${target.exprKind.value.name}.${call.function}`;
    if (dotted in FUNCTIONS) return dotted;
  }
  return call.function;
}

function walk(expr, visit) {
  if (!expr?.exprKind) return;
  const { case: kind, value } = expr.exprKind;
  visit(kind, value);
  switch (kind) {
    case "callExpr":
      walk(value.target, visit);
      for (const arg of value.args) walk(arg, visit);
      break;
    case "selectExpr":
      walk(value.operand, visit);
      break;
    case "listExpr":
      for (const element of value.elements) walk(element, visit);
      break;
    case "structExpr":
      for (const entry of value.entries) {
        if (entry.keyKind?.case === "mapKey") walk(entry.keyKind.value, visit);
        walk(entry.value, visit);
      }
      break;
    case "comprehensionExpr":
      for (const part of ["iterRange", "accuInit", "loopCondition", "loopStep", "result"]) {
        walk(value[part], visit);
      }
      break;
    default:
      break;
  }
}

// The problems of one expression for a minor: [] when that minor's API server compiles every
// function and macro it uses. Syntax the parser does not know (`?.`, `[?`) is a problem too,
// since it cannot be checked.
export function checkExpression(expression, minor = OLDEST_MINOR) {
  let parsed;
  try {
    parsed = parse(expression);
  } catch (error) {
    return [`does not parse (${error.message.split("\n")[0]}): '${expression}'`];
  }
  const problems = [];
  const need = (what, name, table) => {
    const introduced = table[name];
    if (introduced === undefined) {
      problems.push(`${what} ${name} is unknown to the Kubernetes CEL environment table`);
    } else if (introduced > minor) {
      problems.push(`${what} ${name} needs Kubernetes 1.${introduced}, older than 1.${minor} lacks it`);
    }
  };
  for (const macro of Object.values(parsed.sourceInfo?.macroCalls ?? {})) {
    if (macro.exprKind?.case === "callExpr") need("macro", macro.exprKind.value.function, MACROS);
  }
  walk(parsed.expr, (kind, value) => {
    if (kind !== "callExpr") return;
    const name = callName(value);
    // A comprehension macro left unexpanded: the two-variable form (1.32), which this
    // parser does not expand.
    if (COMPREHENSIONS.has(name) && value.target && value.args.length === 3) {
      need("macro", `${name}/2`, MACROS);
      return;
    }
    need("function", name, FUNCTIONS);
  });
  return [...new Set(problems)];
}

// Every CEL expression of a ValidatingAdmissionPolicy, with where it stands.
export function policyExpressions(policy) {
  const spec = policy.spec ?? {};
  const name = policy.metadata?.name;
  const out = [];
  for (const c of spec.matchConditions ?? []) {
    out.push({ where: `${name} matchCondition ${c.name}`, expression: c.expression });
  }
  for (const v of spec.variables ?? []) {
    out.push({ where: `${name} variable ${v.name}`, expression: v.expression });
  }
  (spec.validations ?? []).forEach((v, i) => {
    out.push({ where: `${name} validation ${i}`, expression: v.expression });
    if (v.messageExpression) {
      out.push({ where: `${name} validation ${i} messageExpression`,
        expression: v.messageExpression });
    }
  });
  (spec.auditAnnotations ?? []).forEach((a) => {
    out.push({ where: `${name} auditAnnotation ${a.key}`, expression: a.valueExpression });
  });
  return out;
}
