#!/usr/bin/env bash
# Installs the system tools the integration tests drive, on a fresh Debian machine (as root):
#   - prometheus (Debian package; ships `promtool`): rule tests, metric lint, a real scrape
#   - chromium (/usr/bin/chromium): the headless browser test of the status page
#   - systemd (ships `systemd-analyze`): verification of deploy/systemd/lockprobe.service
# and then, without root, the pinned tools of the packaging checks (scripts/setup-packaging-tools.sh)
# and of the contract checks (scripts/setup-contract-tools.sh: schemathesis, junitparser), and
# axe-core for the accessibility check of the pages (scripts/setup-page-tools.sh).
# Idempotent: a tool already on PATH is not reinstalled, and `apt-get update` runs at most
# once per invocation, only when something is missing.
set -euo pipefail

# tool on PATH -> Debian package that ships it
declare -A PACKAGE_FOR=(
  [promtool]=prometheus
  [prometheus]=prometheus
  [chromium]=chromium
  [systemd-analyze]=systemd
)

missing=()
for tool in promtool prometheus chromium systemd-analyze; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    pkg="${PACKAGE_FOR[$tool]}"
    [[ " ${missing[*]-} " == *" $pkg "* ]] || missing+=("$pkg")
  fi
done

if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "install-test-deps: need root to install: ${missing[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  # The Debian prometheus package would start a system-wide Prometheus on :9090; the tests
  # start their own on loopback, so keep package scripts from starting daemons while we
  # install (the standard policy-rc.d mechanism), and restore whatever was there before.
  policy=/usr/sbin/policy-rc.d
  backup=""
  if [[ -e $policy ]]; then
    backup=$(mktemp)
    cp -p "$policy" "$backup"
  fi
  restore_policy() {
    if [[ -n $backup ]]; then mv -f "$backup" "$policy"; else rm -f "$policy"; fi
  }
  trap restore_policy EXIT
  printf '#!/bin/sh\nexit 101\n' >"$policy"
  chmod 755 "$policy"

  echo "install-test-deps: installing ${missing[*]}"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Versions, and a hard failure if anything is still missing.
promtool --version 2>&1 | head -n1
prometheus --version 2>&1 | head -n1
# The Debian launcher sources /etc/chromium.d/*, which can be noisy on stderr.
chromium --version 2>/dev/null | head -n1
systemd-analyze --version | head -n1

bash "$(dirname "$0")/setup-packaging-tools.sh"
bash "$(dirname "$0")/setup-contract-tools.sh"
bash "$(dirname "$0")/setup-page-tools.sh"
