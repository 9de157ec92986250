#!/usr/bin/env bash
# Runs every check and test of Portcullis. On first use it installs what the
# tests need (the real MCP peers: a Python venv with the official SDK, one with
# FastMCP, an npm folder with the TypeScript SDK and server-everything, and the
# official conformance suite with the Node 22 it needs, playwright-core and
# Debian's Chromium for the dashboard test) into cache directories outside the
# clone, and Debian's redis-server, postgresql and haproxy when running as
# root; later runs reuse them.
#
#   bash tests/run.sh
#
# Exits non-zero on any failure. Every test tier is required here
# (PORTCULLIS_TIERS=all, see tests/support/tiers.rs): a test whose peer is
# missing fails; none is skipped. A plain `cargo test` instead skips the tiers
# whose peers are absent and names them in one line.
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/portcullis-target}"
export PORTCULLIS_PEERS="${PORTCULLIS_PEERS:-$HOME/.cache/portcullis-peers}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
export PORTCULLIS_TIERS=all

step() { printf '\n== %s\n' "$*"; }

# Another apt run (unattended upgrades on a fresh machine, a second clone's
# run) may hold the Debian package lock: wait for it, up to ten minutes,
# instead of failing. The package lists of a fresh machine may be empty, so
# they are refreshed before the first install.
APT=(apt-get -o DPkg::Lock::Timeout=600)
apt_install() {
  "${APT[@]}" update -qq
  "${APT[@]}" install -y -qq "$@"
}

# The test build is the longest step on a fresh machine and needs only the CPU;
# the installs below mostly wait on the network and the disk. So the build
# starts first, in the background, and the installs run beside it.
step "compiling the tests in the background"
BUILD_LOG="$(mktemp)"
cargo test --locked --no-run >"$BUILD_LOG" 2>&1 &
BUILD_PID=$!
trap 'kill "$BUILD_PID" 2>/dev/null || true; rm -f "$BUILD_LOG"' EXIT

step "installing test peers and the conformance suite (first use only)"
# Debian's Chromium for the dashboard's browser test (tests/suite/browser.rs).
command -v chromium >/dev/null || apt_install chromium chromium-driver
bash tests/peers/setup.sh
bash tests/conformance/setup.sh
# podman and the locally built base images for the image and pod tests (tests/suite/container*.rs).
bash tests/container/images.sh

step "redis-server for the rate-limit tests (first use only)"
if ! command -v redis-server >/dev/null; then
  if [[ "$(id -u)" == 0 ]]; then
    apt_install redis-server
  else
    echo "redis-server is missing: run 'sudo apt-get install -y redis-server' (the rate-limit tests fail without it)"
  fi
fi
command -v redis-server || true

step "PostgreSQL and HAProxy for the fleet tests (first use only)"
# Debian's packages; the tests initialise their own cluster in a temp dir
# (tests/support/postgres.rs) and run their own balancer (tests/support/haproxy.rs).
have_postgres() { ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; }
have_haproxy() { command -v haproxy >/dev/null || [[ -x /usr/sbin/haproxy ]]; }
if ! have_postgres || ! have_haproxy; then
  if [[ "$(id -u)" == 0 ]]; then
    apt_install postgresql haproxy
  else
    echo "PostgreSQL or HAProxy is missing: run 'sudo apt-get install -y postgresql haproxy' (the fleet tests fail without them)"
  fi
fi

step "format"
cargo fmt --check

step "waiting for the test build"
if ! wait "$BUILD_PID"; then
  cat "$BUILD_LOG"
  exit 1
fi
tail -n 3 "$BUILD_LOG"

step "lint"
cargo clippy --all-targets --locked -- -D warnings
# The lean build without Redis support must stay clean too.
cargo clippy --lib --no-default-features --locked -- -D warnings

step "tests"
cargo test --locked --no-fail-fast
