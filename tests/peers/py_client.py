"""MCP client driver built on the official Python SDK (mcp 2.3.0, mcp.Client), for gateway tests.

    $PEERS/venv/bin/python py_client.py URL [--mode legacy|2026-07-28] [--key KEY] --ops JSON

--key KEY sends `Authorization: Bearer KEY` on every HTTP request. --ops is a JSON array of
  {"op":"list"}                                   -> {"tools":[names]}
  {"op":"call","name":N,"args":{..}[,"progress":true]}
      -> {"isError":b,"text":s,"structured":v|null,"meta":v|null[,"progress":[values]]}
  {"op":"prompts"}                                -> {"prompts":[names]}
  {"op":"prompt","name":N,"args":{..}}            -> {"texts":[text of each message]}
  {"op":"resources"}                              -> {"resources":[uris],"templates":[uri templates]}
  {"op":"read","uri":U}                           -> {"texts":[text of each content]}
  {"op":"ping"}                                   -> {"pong":true}
  {"op":"updated","until":U}                      -> {"updated":[URI of each notifications/resources/updated
                                                     seen so far]}, once U is among them (at most 10 s)
  {"op":"asked"}                                  -> {"asked":[params of each sampling / elicitation
                                                     request the server made so far, as JSON]}
Sampling requests are answered with the text "ok" and elicitations accepted with {"name":"bob"}.
--elicit approve|decline|off changes that: accept with {"approve": true} (a gateway approval
question's yes), decline every elicitation, or declare no elicitation capability at all.
--elicit wait:PATH answers yes as `approve` does, but only once the file PATH exists, after
creating PATH.asked: a test holds the question open and acts meanwhile (a reload, say).
An error on one op gives {"error":message,"code":code|null} and the next op runs.
Prints one JSON line (the array of results); exits 1 only when connecting fails.
"""

import argparse
import json
import os
import sys
from typing import Any

import anyio
import httpx2
from mcp import Client, types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError


def describe(exc: BaseException) -> dict[str, Any]:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, MCPError):
        return {"error": exc.message, "code": exc.code}
    if isinstance(exc, httpx2.HTTPStatusError):
        return {"error": str(exc), "code": exc.response.status_code}
    return {"error": f"{type(exc).__name__}: {exc}", "code": None}


# What the sampling and elicitation callbacks received, in order.
ASKED: list[dict[str, Any]] = []
UPDATED: list[str] = []


async def on_message(message: Any) -> None:
    if isinstance(message, types.ResourceUpdatedNotification):
        UPDATED.append(str(message.params.uri))


async def on_sampling(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
    ASKED.append({"kind": "sampling", "params": params.model_dump(mode="json", by_alias=True, exclude_none=True)})
    return types.CreateMessageResult(role="assistant", content=types.TextContent(type="text", text="ok"), model="test")


# How elicitations are answered (--elicit).
ELICIT = "default"


async def on_elicitation(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    ASKED.append({"kind": "elicitation", "params": params.model_dump(mode="json", by_alias=True, exclude_none=True)})
    if ELICIT == "approve":
        return types.ElicitResult(action="accept", content={"approve": True})
    if ELICIT.startswith("wait:"):
        path = ELICIT[len("wait:") :]
        with open(path + ".asked", "w") as marker:
            marker.write("asked\n")
        while not os.path.exists(path):
            await anyio.sleep(0.05)
        return types.ElicitResult(action="accept", content={"approve": True})
    if ELICIT == "decline":
        return types.ElicitResult(action="decline")
    return types.ElicitResult(action="accept", content={"name": "bob"})


async def run_op(client: Client, op: dict[str, Any]) -> dict[str, Any]:
    if op["op"] == "asked":
        return {"asked": list(ASKED)}
    if op["op"] == "list":
        listed = await client.list_tools()
        return {"tools": [t.name for t in listed.tools]}
    if op["op"] == "call":
        seen: list[float] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            seen.append(progress)

        result = await client.call_tool(
            op["name"], op.get("args", {}), progress_callback=on_progress if op.get("progress") else None
        )
        out: dict[str, Any] = {
            "isError": bool(result.is_error),
            "text": "\n".join(c.text for c in result.content if getattr(c, "type", None) == "text"),
            "structured": result.structured_content,
            "meta": result.meta,
        }
        if op.get("progress"):
            out["progress"] = seen
        return out
    if op["op"] == "prompts":
        listed = await client.list_prompts(cache_mode="refresh")
        return {"prompts": [p.name for p in listed.prompts]}
    if op["op"] == "prompt":
        got = await client.get_prompt(op["name"], op.get("args", {}))
        return {"texts": [getattr(m.content, "text", None) for m in got.messages]}
    if op["op"] == "resources":
        resources = await client.list_resources(cache_mode="refresh")
        templates = await client.list_resource_templates(cache_mode="refresh")
        return {
            "resources": [str(r.uri) for r in resources.resources],
            "templates": [t.uri_template for t in templates.resource_templates],
        }
    if op["op"] == "read":
        read = await client.read_resource(op["uri"], cache_mode="refresh")
        return {"texts": [getattr(c, "text", None) for c in read.contents]}
    if op["op"] == "updated":
        with anyio.move_on_after(10):
            while op["until"] not in UPDATED:
                await anyio.sleep(0.05)
        return {"updated": list(UPDATED)}
    if op["op"] == "ping":
        await client.send_ping()
        return {"pong": True}
    return {"error": f"unknown op {op['op']!r}", "code": None}


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url")
    ap.add_argument("--mode", default="legacy", choices=["legacy", "2026-07-28"])
    ap.add_argument("--key")
    ap.add_argument("--ops", default='[{"op":"list"}]')
    ap.add_argument("--elicit", default="default")
    opts = ap.parse_args()
    if opts.elicit not in ("default", "approve", "decline", "off") and not opts.elicit.startswith("wait:"):
        ap.error(f"--elicit: {opts.elicit!r} is not default, approve, decline, off or wait:PATH")
    global ELICIT
    ELICIT = opts.elicit
    ops = json.loads(opts.ops)

    headers = {"Authorization": f"Bearer {opts.key}"} if opts.key else None
    results: list[dict[str, Any]] = []
    connected = False
    try:
        async with create_mcp_http_client(headers=headers) as http:
            transport = streamable_http_client(opts.url, http_client=http)
            elicit = None if opts.elicit == "off" else on_elicitation
            async with Client(
                transport,
                mode=opts.mode,
                sampling_callback=on_sampling,
                elicitation_callback=elicit,
                message_handler=on_message,
            ) as client:
                connected = True
                for op in ops:
                    try:
                        results.append(await run_op(client, op))
                    except Exception as exc:  # one failing op must not stop the others
                        results.append(describe(exc))
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        if not connected:
            print(f"connect failed: {json.dumps(describe(exc))}", file=sys.stderr)
            return 1
        results += [describe(exc)] * (len(ops) - len(results))
    print(json.dumps(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(anyio.run(main))
