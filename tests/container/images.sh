#!/usr/bin/env bash
# Prepares the container engine and the base images that the repository's Dockerfile
# names, for tests/suite/container*.rs. Runs once per machine: what exists is reused.
#
# What this substitutes for a public image registry, and why: these machines reach
# Debian's archive and the package registries but no image registry, so the images the
# Dockerfile starts FROM are built here from Debian packages under the same names:
#
#   docker.io/library/debian:bookworm-slim  mmdebstrap of bookworm (minbase) with
#                                           ca-certificates
#   docker.io/library/rust:1.95-bookworm    the same plus gcc and libc6-dev, with this
#                                           machine's Rust toolchain (the project's
#                                           version, 1.95) copied to /usr/local/rust,
#                                           because Debian's rustc is too old
#
# Both also trust the certificate authorities this machine trusts
# (/usr/local/share/ca-certificates), so cargo inside a build reaches the crates registry
# the way the host does. The Dockerfile itself is the one users build, unchanged.
#
# A third image is the real MCP server the pod test runs beside the gateway:
#   localhost/portcullis-test-mcp:2.3.0     the official Python SDK (mcp 2.3.0) serving
#                                           tests/peers/py_server.py
#
# Two more are the engines the fleet manifests (deploy/kubernetes/fleet) name, for the
# fleet test; Debian's packages on the debian image above, built with podman:
#   localhost/portcullis-test-redis:7.0     redis-server 7.0 (redis.Containerfile)
#   localhost/portcullis-test-postgres:15   postgresql-15 with a small entrypoint for
#                                           POSTGRES_USER/PASSWORD/DB and PGDATA
#                                           (postgres.Containerfile)
#
# Containers run with runc (crun fails on this hybrid cgroup setup) and without default
# ulimits (refused by the sandbox): /etc/containers/containers.conf says so.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
APT=(apt-get -o DPkg::Lock::Timeout=600 -y -qq)

say() { echo "portcullis containers: $*"; }

if ! command -v podman >/dev/null || ! command -v mmdebstrap >/dev/null || ! command -v runc >/dev/null; then
  [[ "$(id -u)" == 0 ]] || { say "podman, runc and mmdebstrap are missing: install them as root"; exit 1; }
  "${APT[@]}" update
  "${APT[@]}" install podman runc mmdebstrap uidmap
fi

CONF=/etc/containers/containers.conf
if ! grep -qs 'default_ulimits = \[\]' "$CONF"; then
  mkdir -p /etc/containers
  cat > "$CONF" <<'EOF'
[containers]
default_ulimits = []

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
  say "wrote $CONF"
fi

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
# Host CAs into the rootfs, then the bundle rebuilt there.
CA_HOOK='mkdir -p "$1/usr/local/share/ca-certificates"; cp /usr/local/share/ca-certificates/*.crt "$1/usr/local/share/ca-certificates/" 2>/dev/null || true; chroot "$1" update-ca-certificates >/dev/null'
BASE_PATH='ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'

if podman image exists docker.io/library/debian:bookworm-slim; then
  say "debian:bookworm-slim present"
else
  mmdebstrap --quiet --variant=minbase --include=ca-certificates --customize-hook="$CA_HOOK" \
    bookworm "$WORK/debian.tar"
  podman import --quiet --change "$BASE_PATH" "$WORK/debian.tar" docker.io/library/debian:bookworm-slim
  rm -f "$WORK/debian.tar"
  say "built debian:bookworm-slim"
fi

if podman image exists docker.io/library/rust:1.95-bookworm; then
  say "rust:1.95-bookworm present"
else
  SYSROOT="$(rustc --print sysroot)"
  VERSION="$(rustc --version)"
  [[ "$VERSION" == "rustc 1.95."* ]] || { say "the host toolchain is $VERSION, the Dockerfile names 1.95"; exit 1; }
  TOOLCHAIN_HOOK="mkdir -p \"\$1/usr/local/rust\" && cp -a $SYSROOT/bin $SYSROOT/lib $SYSROOT/libexec $SYSROOT/etc \"\$1/usr/local/rust/\""
  mmdebstrap --quiet --variant=minbase --include=ca-certificates,gcc,libc6-dev \
    --customize-hook="$CA_HOOK" --customize-hook="$TOOLCHAIN_HOOK" bookworm "$WORK/rust.tar"
  podman import --quiet \
    --change 'ENV PATH=/usr/local/cargo/bin:/usr/local/rust/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV CARGO_HOME=/usr/local/cargo' \
    "$WORK/rust.tar" docker.io/library/rust:1.95-bookworm
  rm -f "$WORK/rust.tar"
  say "built rust:1.95-bookworm ($VERSION)"
fi

if podman image exists localhost/portcullis-test-mcp:2.3.0; then
  say "portcullis-test-mcp:2.3.0 present"
else
  cp "$ROOT/tests/peers/py_server.py" "$HERE/mcp-server.Containerfile" "$WORK/"
  podman build --quiet --network host -f "$WORK/mcp-server.Containerfile" \
    -t localhost/portcullis-test-mcp:2.3.0 "$WORK" >/dev/null
  say "built portcullis-test-mcp:2.3.0"
fi

# Redis and PostgreSQL for the fleet manifests (deploy/kubernetes/fleet), from Debian's
# packages on the base image above; each build's time is printed when it happens.
build_local() {
  local image="$1" containerfile="$2"; shift 2
  if podman image exists "$image"; then
    say "$image present"
    return
  fi
  local started=$SECONDS
  cp "$HERE/$containerfile" "$@" "$WORK/"
  podman build --quiet --network host -f "$WORK/$containerfile" -t "$image" "$WORK" >/dev/null
  say "built $image in $((SECONDS - started)) s"
}
build_local localhost/portcullis-test-redis:7.0 redis.Containerfile
build_local localhost/portcullis-test-postgres:15 postgres.Containerfile "$HERE/postgres-entrypoint.sh"

# podman-compose (PyPI) plays deploy/compose/compose.yaml, in a venv of its own.
PEERS="${PORTCULLIS_PEERS:-$HOME/.cache/portcullis-peers}"
COMPOSE_VERSION=1.6.0
if [[ -x "$PEERS/compose-venv/bin/podman-compose" ]] \
    && "$PEERS/compose-venv/bin/podman-compose" --version 2>/dev/null | grep -q "podman-compose version $COMPOSE_VERSION"; then
  say "podman-compose $COMPOSE_VERSION present"
else
  mkdir -p "$PEERS"
  python3 -m venv "$PEERS/compose-venv"
  "$PEERS/compose-venv/bin/pip" install --quiet "podman-compose==$COMPOSE_VERSION"
  say "installed podman-compose $COMPOSE_VERSION in $PEERS/compose-venv"
fi
