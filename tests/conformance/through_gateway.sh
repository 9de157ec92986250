#!/usr/bin/env bash
# Client-mode command for the conformance suite: puts the real gateway between a client and the
# server the suite plays.
#
#   PORTCULLIS_BIN=/path/to/portcullis bash through_gateway.sh CLIENT_COMMAND... URL
#
# The suite appends the URL of its server. This starts `portcullis run` with that URL as the one
# upstream `up` (anonymous clients allowed to do everything, pinning off, state in memory), waits
# for its `listening` log line, runs CLIENT_COMMAND with the gateway's URL for `up` appended, then
# stops the gateway by its PID. Exits with the client's status.
set -euo pipefail

upstream="${!#}"
client=("${@:1:$#-1}")
: "${PORTCULLIS_BIN:?PORTCULLIS_BIN must name the portcullis binary}"

dir="$(mktemp -d)"
gateway_pid=""
cleanup() {
  if [[ -n "$gateway_pid" ]]; then
    kill "$gateway_pid" 2>/dev/null || true
    wait "$gateway_pid" 2>/dev/null || true
  fi
  # The gateway's log goes to this script's stderr, which the suite saves as stderr.txt.
  [[ -f "$dir/log" ]] && cat "$dir/log" >&2
  rm -rf "$dir"
}
trap cleanup EXIT

cat >"$dir/portcullis.toml" <<EOF
[gateway]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[servers.up]
url = "$upstream"
pinning = "off"

[clients.anonymous]

[[rules]]
clients = ["anonymous"]
servers = ["*"]
tools = ["*"]
resources = ["*"]
prompts = ["*"]
action = "allow"

[pins]
database = ":memory:"

[audit]
database = ":memory:"
EOF

"$PORTCULLIS_BIN" run --config "$dir/portcullis.toml" 2>"$dir/log" </dev/null &
gateway_pid=$!

# The log is JSON lines; the `listening` line carries `"mcp":"127.0.0.1:PORT"`. Wait at most 30 s.
mcp=""
for _ in $(seq 300); do
  mcp="$(grep '"listening"' "$dir/log" 2>/dev/null | grep -o '"mcp":"[^"]*"' | head -n1 | cut -d'"' -f4 || true)"
  [[ -n "$mcp" ]] && break
  kill -0 "$gateway_pid" 2>/dev/null || { echo "the gateway exited before listening" >&2; exit 1; }
  sleep 0.1
done
[[ -n "$mcp" ]] || { echo "the gateway did not log its listening address" >&2; exit 1; }

status=0
"${client[@]}" "http://$mcp/mcp/up" || status=$?
exit "$status"
