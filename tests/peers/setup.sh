#!/usr/bin/env bash
# Installs the third-party MCP peers (real servers and clients) that the gateway is tested
# against, into a cache folder outside the clone:
#   $PORTCULLIS_PEERS/venv  Python venv with the official Python SDK (mcp)
#   $PORTCULLIS_PEERS/npm   npm folder with the official TypeScript SDK v2 and server-everything
# Idempotent: a stamp file records the pinned versions; when it matches, nothing is done.
set -euo pipefail

PEERS="${PORTCULLIS_PEERS:-$HOME/.cache/portcullis-peers}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

PY_PKGS=(mcp==2.3.0)
NPM_PKGS=(
  @modelcontextprotocol/server-everything@2026.8.31
  @modelcontextprotocol/server@2.4.0
  @modelcontextprotocol/node@2.1.2
  @modelcontextprotocol/client@2.4.0
  zod@4.6.7
)
STAMP_TEXT="stamp-v1 python=${PY_PKGS[*]} npm=${NPM_PKGS[*]}"
STAMP="$PEERS/stamp"

mkdir -p "$PEERS"
cp "$HERE/force-loopback.cjs" "$PEERS/force-loopback.cjs"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$STAMP_TEXT" \
      && -x "$PEERS/venv/bin/python" && -d "$PEERS/npm/node_modules" ]]; then
  echo "portcullis peers: up to date in $PEERS (venv: $PEERS/venv, npm: $PEERS/npm)"
  exit 0
fi
rm -f "$STAMP"

PYTHON="${PYTHON:-python3}"
if [[ ! -x "$PEERS/venv/bin/python" ]]; then
  "$PYTHON" -m venv "$PEERS/venv"
fi
"$PEERS/venv/bin/python" -m pip install --quiet --disable-pip-version-check "${PY_PKGS[@]}"
"$PEERS/venv/bin/python" -c 'import mcp, uvicorn, httpx2'

mkdir -p "$PEERS/npm"
if [[ ! -f "$PEERS/npm/package.json" ]]; then
  printf '{ "name": "portcullis-peers", "private": true }\n' > "$PEERS/npm/package.json"
fi
(cd "$PEERS/npm" && npm install --no-audit --no-fund --loglevel=error --save-exact "${NPM_PKGS[@]}" >/dev/null)
for p in server-everything server node client; do
  test -f "$PEERS/npm/node_modules/@modelcontextprotocol/$p/package.json"
done

printf '%s' "$STAMP_TEXT" > "$STAMP"
echo "portcullis peers: installed in $PEERS (venv: $PEERS/venv, npm: $PEERS/npm)"
