#!/usr/bin/env bash
# Installs the official MCP conformance suite and the Node 22 it needs (both from
# npm) into a cache folder outside the clone:
#   $PORTCULLIS_CONFORMANCE/node_modules/.bin/node   Node 22
#   $PORTCULLIS_CONFORMANCE/node_modules/@modelcontextprotocol/conformance
# Idempotent: a stamp file records the pinned versions; when it matches, nothing is done.
set -euo pipefail

DIR="${PORTCULLIS_CONFORMANCE:-$HOME/.cache/portcullis-conformance}"
PKGS=(node@22 @modelcontextprotocol/conformance@0.2.0-alpha.12)
STAMP_TEXT="stamp-v1 ${PKGS[*]}"

mkdir -p "$DIR"
if [[ -f "$DIR/stamp" && "$(cat "$DIR/stamp")" == "$STAMP_TEXT" && -x "$DIR/node_modules/.bin/node" ]]; then
  echo "portcullis conformance: up to date in $DIR"
  exit 0
fi
rm -f "$DIR/stamp"
[[ -f "$DIR/package.json" ]] || printf '{ "name": "portcullis-conformance", "private": true }\n' > "$DIR/package.json"
(cd "$DIR" && npm install --no-audit --no-fund --loglevel=error --save-exact "${PKGS[@]}" >/dev/null)
"$DIR/node_modules/.bin/node" --version >/dev/null
test -f "$DIR/node_modules/@modelcontextprotocol/conformance/dist/index.js"
printf '%s' "$STAMP_TEXT" > "$DIR/stamp"
echo "portcullis conformance: installed in $DIR"
