#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs what the tests need (Prometheus and
# promtool, Chromium, the local Cosmos DB-compatible server, and the rollout gate's
# baseline, an earlier revision of this repository built from its history), checks
# formatting and lints (rustfmt.toml; clippy with warnings as errors), builds the API
# documentation with warnings as errors (a broken link or an undocumented public item
# fails), then runs every test and the documentation's examples.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-test-deps.sh
bash scripts/setup-cosmos.sh
bash scripts/build-baseline.sh
cargo fmt --check
cargo clippy --all-targets --locked -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --locked
cargo test --all-targets --locked
cargo test --doc --locked
