// Validates the Prometheus Operator objects (monitoring.coreos.com) in a rendered
// multi-document manifest, which kubernetes-validate has no schema for:
//
//   node scripts/k8s-validate/validate.mjs FILE.yaml... [--json OUT.json] [--rules-dir DIR] [--no-check]
//
// Two checks per object, both from the pinned @kubernetes-models/prometheus-operator:
//  1. its JSON schema (types, required fields, enums, duration patterns), via the model's
//     validate();
//  2. unknown fields: the schemas allow extra properties, so a misspelt key (`intreval`)
//     would pass them; the package's TypeScript declarations do not, so every object is
//     type-checked as a literal of its interface (excess property checks) with the pinned
//     TypeScript compiler, in memory.
// A monitoring.coreos.com kind the package has no model for is an error, not a skip.
// --json writes every document as a JSON array (for the Rust test's cross-checks);
// --rules-dir writes each PrometheusRule's spec as DIR/<name>.json, a rule file promtool reads;
// --no-check only parses and writes those (the type check takes seconds).
// Exit 0 when all passed, 1 when any failed, 64 on bad usage. Prints one line per object:
// `ok KIND/NAME ...` or `FAIL KIND/NAME: why`, so one run can hold good and broken files.

import { readFileSync, writeFileSync, existsSync, mkdirSync } from "node:fs";
import { basename, dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { parseAllDocuments } from "yaml";

const here = dirname(fileURLToPath(import.meta.url));
const pkg = "@kubernetes-models/prometheus-operator";
const pkgDir = join(here, "node_modules", pkg);
const GROUP = "monitoring.coreos.com";

function usage(msg) {
  console.error(`validate.mjs: ${msg}\nusage: node validate.mjs FILE.yaml... [--json OUT.json] [--rules-dir DIR] [--no-check]`);
  process.exit(64);
}

const args = process.argv.slice(2);
const inputs = [];
let jsonOut, rulesDir, check = true;
for (let i = 0; i < args.length; i++) {
  if (args[i] === "--json") jsonOut = args[++i] ?? usage("--json needs a file");
  else if (args[i] === "--rules-dir") rulesDir = args[++i] ?? usage("--rules-dir needs a directory");
  else if (args[i] === "--no-check") check = false;
  else if (!args[i].startsWith("-")) inputs.push(args[i]);
  else usage(`unexpected argument ${args[i]}`);
}
if (!inputs.length) usage("no input file");

const version = JSON.parse(readFileSync(join(pkgDir, "package.json"), "utf8")).version;
let failed = 0;
const fail = (what, msg) => {
  failed++;
  console.log(`FAIL ${what}: ${msg}`);
};

// Parse: any YAML error (duplicate keys included) fails the file.
const docs = [];
const from = new Map(); // document -> the file it came from
for (const input of inputs) {
  for (const doc of parseAllDocuments(readFileSync(input, "utf8"), { uniqueKeys: true })) {
    if (doc.errors.length) fail(input, doc.errors.map((e) => e.message).join("; "));
    const value = doc.toJS();
    if (value === null || value === undefined) continue;
    docs.push(value);
    if (typeof value === "object") from.set(value, input);
  }
}

const ours = docs.filter((d) => typeof d?.apiVersion === "string" && d.apiVersion.startsWith(`${GROUP}/`));
const checked = []; // [label, kind, apiVersion, doc] for the TypeScript pass
for (const doc of check ? ours : []) {
  const label = `${doc.kind}/${doc.metadata?.name ?? "?"} in ${basename(from.get(doc))}`;
  const groupVersion = doc.apiVersion; // monitoring.coreos.com/v1
  const modelFile = join(pkgDir, groupVersion, `${doc.kind}.js`);
  if (!/^[A-Za-z0-9]+$/.test(String(doc.kind)) || !existsSync(modelFile)) {
    fail(label, `no model for ${groupVersion} ${doc.kind} in ${pkg} ${version}`);
    continue;
  }
  const Model = (await import(pathToFileURL(modelFile).href))[doc.kind];
  try {
    new Model(doc).validate();
    checked.push([label, doc.kind, groupVersion, doc]);
  } catch (e) {
    fail(label, `schema: ${e.message}`);
  }
}

// Unknown fields, by TypeScript's excess property checks on one in-memory source file.
if (checked.length) {
  const ts = (await import("typescript")).default;
  const file = join(here, "__manifests__.ts");
  const lines = [];
  const owner = []; // line number -> object label
  checked.forEach(([label, kind, groupVersion], i) => {
    lines.push(`import type { I${kind} as T${i} } from "${pkg}/${groupVersion}/${kind}";`);
    owner.push(label);
  });
  checked.forEach(([label, , , doc], i) => {
    for (const line of `export const o${i}: T${i} = ${JSON.stringify(doc, null, 2)};`.split("\n")) {
      lines.push(line);
      owner.push(label);
    }
  });
  const source = lines.join("\n") + "\n";
  const options = {
    strict: true,
    noEmit: true,
    skipLibCheck: true,
    target: ts.ScriptTarget.ES2022,
    module: ts.ModuleKind.ESNext,
    moduleResolution: ts.ModuleResolutionKind.Bundler,
    types: [],
  };
  const host = ts.createCompilerHost(options);
  const { getSourceFile, fileExists, readFile } = host;
  host.getSourceFile = (name, lang, ...rest) =>
    name === file ? ts.createSourceFile(name, source, lang, true) : getSourceFile.call(host, name, lang, ...rest);
  host.fileExists = (name) => name === file || fileExists.call(host, name);
  host.readFile = (name) => (name === file ? source : readFile.call(host, name));
  const program = ts.createProgram([file], options, host);
  const diagnostics = ts.getPreEmitDiagnostics(program);
  const bad = new Set();
  for (const d of diagnostics) {
    const text = ts.flattenDiagnosticMessageText(d.messageText, "\n  ");
    if (d.file && d.file.fileName === file) {
      const { line } = d.file.getLineAndCharacterOfPosition(d.start ?? 0);
      const label = owner[line] ?? "typescript";
      bad.add(label);
      fail(label, `type: ${text} (generated line ${line + 1}: ${lines[line]?.trim()})`);
    } else {
      fail("typescript", text);
    }
  }
  for (const [label] of checked) if (!bad.has(label)) console.log(`ok ${label} (${pkg} ${version}: schema and fields)`);
}

if (jsonOut) writeFileSync(jsonOut, JSON.stringify(docs, null, 2) + "\n");
if (rulesDir) {
  mkdirSync(rulesDir, { recursive: true });
  for (const doc of ours.filter((d) => d.kind === "PrometheusRule")) {
    writeFileSync(join(rulesDir, `${doc.metadata.name}.json`), JSON.stringify(doc.spec, null, 2) + "\n");
  }
}
const verdict = !check ? "not checked (--no-check)" : failed ? `${failed} failure(s)` : "all valid";
console.log(`${ours.length} ${GROUP} object(s) in ${inputs.join(", ")}: ${verdict}`);
process.exit(failed ? 1 : 0);
