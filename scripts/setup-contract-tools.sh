#!/usr/bin/env bash
# Installs the pinned Python tools of the contract checks inside the repository, so nothing
# system-wide changes: .test-tools/contract-venv with schemathesis (tests/contract_fuzz.rs)
# and junitparser (tests/probe_validate.rs), from scripts/contract-tools.txt.
# A venv of its own: its pins would otherwise have to agree with the packaging tools'.
# Needs python3 (3.9+) with venv. Idempotent: skipped while its stamp is newer than the pins.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

venv="$root/.test-tools/contract-venv"
pins="$root/scripts/contract-tools.txt"
stamp="$venv/.lockprobe-installed"
if ! [[ -f "$stamp" && "$stamp" -nt "$pins" && -x "$venv/bin/schemathesis" ]]; then
  echo "setup-contract-tools: installing $(grep -cE '^[A-Za-z]' "$pins") pinned Python packages into .test-tools/contract-venv" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-input --no-deps -r "$pins"
  "$venv/bin/pip" check --disable-pip-version-check >/dev/null
  touch "$stamp"
fi

# Versions, and a hard failure if anything is missing.
"$venv/bin/schemathesis" --version
"$venv/bin/python" -c 'import importlib.metadata as m; print("junitparser", m.version("junitparser"))'
