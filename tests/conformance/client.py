"""MCP client for the conformance suite's client mode, built on the official Python SDK (mcp 2.3.0).

    $PEERS/venv/bin/python client.py URL

The suite runs this with the URL of the server it plays appended, and says what it expects in the
environment: MCP_CONFORMANCE_SCENARIO (the scenario name), MCP_CONFORMANCE_PROTOCOL_VERSION (the
era: 2026-07-28 speaks the stateless protocol, anything earlier the initialize handshake) and,
for some scenarios, MCP_CONFORMANCE_CONTEXT (JSON; `toolCalls` lists calls to make).

What it does is what an ordinary application does: connect, list the tools, and call the tools the
scenario asks for (`tools_call`: add_numbers with two numbers; `json-schema-2020-12-preservation`:
json_schema_echo with the input schema of json_schema_2020_12_tool as this client received it). Every tool call is attempted even
when one fails; the exit status is 1 only when connecting fails.
"""

import json
import os
import sys
from typing import Any

import anyio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

# Calls a scenario expects when its context names none.
DEFAULT_CALLS: dict[str, list[dict[str, Any]]] = {
    "tools_call": [{"name": "add_numbers", "arguments": {"a": 5, "b": 3}}],
}


async def main() -> int:
    url = sys.argv[-1]
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
    era = os.environ.get("MCP_CONFORMANCE_PROTOCOL_VERSION", "2025-11-25")
    context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    calls = context.get("toolCalls") or DEFAULT_CALLS.get(scenario, [])
    mode = "2026-07-28" if era >= "2026-07-28" else "legacy"
    try:
        async with create_mcp_http_client() as http:
            async with Client(streamable_http_client(url, http_client=http), mode=mode) as client:
                listed = await client.list_tools()
                print(json.dumps({"tools": [t.name for t in listed.tools]}), flush=True)
                if scenario == "json-schema-2020-12-preservation":
                    # The scenario asks the client to echo back the schema it was shown.
                    shown = next((t for t in listed.tools if t.name == "json_schema_2020_12_tool"), None)
                    if shown is not None:
                        calls = [*calls, {"name": "json_schema_echo", "arguments": {"schema": shown.input_schema}}]
                for call in calls:
                    try:
                        result = await client.call_tool(call["name"], call.get("arguments", {}))
                        print(json.dumps({"called": call["name"], "isError": bool(result.is_error)}), flush=True)
                    except Exception as exc:  # one failing call must not stop the others
                        print(json.dumps({"called": call["name"], "error": str(exc)}), flush=True)
    except Exception as exc:
        print(f"client failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(anyio.run(main))
