#!/usr/bin/env bash
# Installs the third-party MCP peers (real servers and clients) that the gateway is tested
# against, into a cache folder outside the clone:
#   $PORTCULLIS_PEERS/venv  Python venv with the official Python SDK (mcp)
#   $PORTCULLIS_PEERS/npm   npm folder with the official TypeScript SDK v2 and server-everything
#   $PORTCULLIS_PEERS/fastmcp-venv  Python venv with FastMCP (its own venv: it pins its own mcp)
#   $PORTCULLIS_PEERS/browser  npm folder with playwright-core (drives Debian's Chromium)
#   $PORTCULLIS_PEERS/inspector  npm folder with the MCP Inspector CLI and the Node 22 it needs
# Idempotent: stamp files record the pinned versions; when they match, nothing is done.
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

# playwright-core for the dashboard's browser test, with a stamp of its own.
BROWSER_PKGS=(playwright-core@1.65.1)
BROWSER_STAMP="$PEERS/stamp-browser"
BROWSER_STAMP_TEXT="stamp-v1 npm=${BROWSER_PKGS[*]}"
if [[ -f "$BROWSER_STAMP" && "$(cat "$BROWSER_STAMP")" == "$BROWSER_STAMP_TEXT" \
      && -d "$PEERS/browser/node_modules/playwright-core" ]]; then
  echo "portcullis peers: playwright-core up to date in $PEERS/browser"
else
  rm -f "$BROWSER_STAMP"
  mkdir -p "$PEERS/browser"
  [[ -f "$PEERS/browser/package.json" ]] || echo '{"private": true}' > "$PEERS/browser/package.json"
  (cd "$PEERS/browser" && npm install --no-audit --no-fund --silent "${BROWSER_PKGS[@]}")
  printf '%s' "$BROWSER_STAMP_TEXT" > "$BROWSER_STAMP"
  echo "portcullis peers: playwright-core installed in $PEERS/browser"
fi

# The MCP Inspector (its CLI needs Node >= 22.19, installed beside it from npm), with a stamp of its own.
INSPECTOR_PKGS=(@modelcontextprotocol/inspector@2.12.0 node@22)
INSPECTOR_STAMP="$PEERS/stamp-inspector"
INSPECTOR_STAMP_TEXT="stamp-v1 npm=${INSPECTOR_PKGS[*]}"
if [[ -f "$INSPECTOR_STAMP" && "$(cat "$INSPECTOR_STAMP")" == "$INSPECTOR_STAMP_TEXT" \
      && -x "$PEERS/inspector/node_modules/.bin/node" \
      && -d "$PEERS/inspector/node_modules/@modelcontextprotocol/inspector" ]]; then
  echo "portcullis peers: MCP Inspector up to date in $PEERS/inspector"
else
  rm -f "$INSPECTOR_STAMP"
  mkdir -p "$PEERS/inspector"
  [[ -f "$PEERS/inspector/package.json" ]] || echo '{"private": true}' > "$PEERS/inspector/package.json"
  (cd "$PEERS/inspector" && npm install --no-audit --no-fund --loglevel=error --save-exact "${INSPECTOR_PKGS[@]}" >/dev/null)
  "$PEERS/inspector/node_modules/.bin/node" --version | grep -q '^v22\.'
  printf '%s' "$INSPECTOR_STAMP_TEXT" > "$INSPECTOR_STAMP"
  echo "portcullis peers: MCP Inspector installed in $PEERS/inspector"
fi

# FastMCP, in a venv of its own, with a stamp of its own.
FASTMCP_PKGS=(fastmcp==4.2.3)
FASTMCP_STAMP="$PEERS/stamp-fastmcp"
FASTMCP_STAMP_TEXT="stamp-v1 python=${FASTMCP_PKGS[*]}"
if [[ -f "$FASTMCP_STAMP" && "$(cat "$FASTMCP_STAMP")" == "$FASTMCP_STAMP_TEXT" \
      && -x "$PEERS/fastmcp-venv/bin/python" ]]; then
  echo "portcullis peers: FastMCP up to date in $PEERS/fastmcp-venv"
else
  rm -f "$FASTMCP_STAMP"
  if [[ ! -x "$PEERS/fastmcp-venv/bin/python" ]]; then
    "${PYTHON:-python3}" -m venv "$PEERS/fastmcp-venv"
  fi
  "$PEERS/fastmcp-venv/bin/python" -m pip install --quiet --disable-pip-version-check "${FASTMCP_PKGS[@]}"
  "$PEERS/fastmcp-venv/bin/python" -c 'import fastmcp, uvicorn, anyio'
  printf '%s' "$FASTMCP_STAMP_TEXT" > "$FASTMCP_STAMP"
  echo "portcullis peers: FastMCP installed in $PEERS/fastmcp-venv"
fi

# The upstream-identity tests: a real OAuth authorization server (panva's oidc-provider, with the
# token-exchange grant the test registers) in its own npm folder, and PyJWT with its crypto extra in
# the Python SDK's venv (its servers verify the tokens they receive), with a stamp of their own.
AUTHZ_NPM=(oidc-provider@9.13.3)
AUTHZ_PY=("pyjwt[crypto]==2.15.1")
AUTHZ_STAMP="$PEERS/stamp-authz"
AUTHZ_STAMP_TEXT="stamp-v1 npm=${AUTHZ_NPM[*]} python=${AUTHZ_PY[*]}"
if [[ -f "$AUTHZ_STAMP" && "$(cat "$AUTHZ_STAMP")" == "$AUTHZ_STAMP_TEXT" \
      && -d "$PEERS/authz/node_modules/oidc-provider" ]] \
   && "$PEERS/venv/bin/python" -c 'import jwt, cryptography' 2>/dev/null; then
  echo "portcullis peers: oidc-provider and PyJWT up to date in $PEERS/authz"
else
  rm -f "$AUTHZ_STAMP"
  mkdir -p "$PEERS/authz"
  [[ -f "$PEERS/authz/package.json" ]] || echo '{"private": true}' > "$PEERS/authz/package.json"
  (cd "$PEERS/authz" && npm install --no-audit --no-fund --loglevel=error --save-exact "${AUTHZ_NPM[@]}" >/dev/null)
  test -f "$PEERS/authz/node_modules/jose/package.json"
  if [[ ! -x "$PEERS/venv/bin/python" ]]; then
    "${PYTHON:-python3}" -m venv "$PEERS/venv"
  fi
  "$PEERS/venv/bin/python" -m pip install --quiet --disable-pip-version-check "${AUTHZ_PY[@]}"
  "$PEERS/venv/bin/python" -c 'import jwt, cryptography'
  printf '%s' "$AUTHZ_STAMP_TEXT" > "$AUTHZ_STAMP"
  echo "portcullis peers: oidc-provider and PyJWT installed in $PEERS/authz"
fi

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
