#!/usr/bin/env python3
"""End-to-end load benchmark of Portcullis: the same load, in the same run, interleaved
over rounds, against the upstream directly, a bare hyper forwarder (examples/bare_forwarder.rs:
the cost of any proxy hop), Portcullis as a pass-through, Portcullis with everything on, and
mcp-proxy (when installed) as a plain proxy of the same upstream.

    python3 bench/load.py [--rounds 3] [--seconds 5] [--write BENCHMARKS.md]
                          [--only REGEX] [--targets REGEX] [--gateway LABEL=PATH]
                          [--fleet] [--perf TARGET --perf-out FILE --perf-workload REGEX]

`--only` keeps the workloads whose name matches the regex (e.g. "^tools/call, ~100 B arguments$").
`--gateway LABEL=PATH` (repeatable) adds another portcullis binary, everything on, to the same run
(a lever measured side by side with the state before it).
`--identity` adds upstream-identity targets on the plain upstream (clients sign in with a JWT from
oidc-provider, started from tests/peers/authz_server.mjs; needs tests/peers/setup.sh): "identity:
static header" (the server's own `headers`), "identity: exchanged token, cached" (mode exchange,
every call after the first served from the token cache) and "identity: assertion per call" (mode
assertion, one EdDSA signature per call); pass-through policy otherwise, so the difference between
them is the identity step alone.
`--fleet` adds the fleet's stores on the plain upstream, each everything on: "everything on, Redis
state" (`[state] backend = "redis"`, the token buckets in the same Redis), "everything on, PostgreSQL
audit" (`[audit] backend = "postgres"`) and "everything on, Redis + PostgreSQL". It starts its own
redis-server and PostgreSQL cluster (`initdb` in a temp dir, loopback, an OS-picked port, run as the
`postgres` user when started as root; stopped by PID), and reports per cell the Redis commands per
call (`INFO commandstats` deltas ÷ requests: a top-level EVALSHA is one round trip), Redis's and
PostgreSQL's own CPU per call (/proc of their processes), and the audit rows written.
`--perf TARGET` (repeatable) records `perf record` of TARGET's process (e.g. "everything on")
during its first c=32 cell of the first workload (or of each workload `--perf-workload REGEX` matches),
into FILE.<slug of TARGET>[.<slug of the workload>]; `--perf-call-graph` is passed to `perf record
--call-graph` (default `dwarf,32768`, sampled at 499 Hz).

Reported per cell: req/s, ratio to direct and to the forwarder, p50/p99, CPU µs per request of
the measured process (/proc/<pid>/stat utime+stime delta ÷ requests); per process: start to
ready (spawn until its port accepts), the first call and the median of the next 20 (a lazily
built detector shows there), idle RSS (VmRSS once ready) and peak RSS (VmHWM after the run).

Needs: release builds of `portcullis`, `examples/echo_upstream` and `examples/bare_forwarder`
(`cargo build --release --bin portcullis --example echo_upstream --example bare_forwarder`),
`wrk` (Debian), and optionally `oha` and `mcp-proxy` under ~/.cache/portcullis-tools/bin.
Everything binds 127.0.0.1; every process started is stopped by its PID; every run is
bounded in time.
"""

import argparse
import datetime
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from fleet_stores import FLEET_TARGETS, Fleet, fleet_config, slug
from procs import Proc, free_port

ROOT = Path(__file__).resolve().parent.parent
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", Path.home() / ".cache/portcullis-target"))
TOOLS = Path(os.environ.get("PORTCULLIS_TOOLS", Path.home() / ".cache/portcullis-tools")) / "bin"
PORTCULLIS = Path(os.environ.get("PORTCULLIS_BIN", TARGET / "release/portcullis"))
ECHO = TARGET / "release/examples/echo_upstream"
FORWARDER = TARGET / "release/examples/bare_forwarder"
KEY = "bench-key"
CLK_TCK = os.sysconf("SC_CLK_TCK")

META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}


def call_body(name, args):
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                       "params": {"name": name, "arguments": args, "_meta": META}})


def legacy_call_body(name, args):
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": args}})


def prose(size):
    """`size` bytes of plain English text (no secrets, no control characters)."""
    sentence = ("The quarterly report lists every open ticket of the payments team, with its owner, "
                "its priority and the date of the last answer to the customer. ")
    return (sentence * (size // len(sentence) + 1))[:size]


LIST_BODY = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": META}})

# name, upstream variant, body, Mcp-Method, Mcp-Name, concurrencies; a workload whose name says
# "2025-11-25" runs in an initialized session of that version (the only one mcp-proxy 0.6.0 speaks
# in its default build), every other one statelessly in 2026-07-28.
LEGACY = "2025-11-25"
WORKLOADS = [
    (f"tools/call, ~100 B arguments, {LEGACY} session", "plain",
     legacy_call_body("echo", {"text": "hello from the load benchmark, 106 bytes of body"}), "tools/call", "echo", (1, 32)),
    ("tools/call, ~100 B arguments", "plain", call_body("echo", {"text": "hello from the load benchmark, 106 bytes of body"}), "tools/call", "echo", (1, 32)),
    ("tools/call, invalid arguments", "plain", call_body("echo", {"text": 5}), "tools/call", "echo", (32,)),
    ("tools/list, 200 tools", "tools200", LIST_BODY, "tools/list", None, (32,)),
    ("tools/call, SSE response", "sse", call_body("echo", {"text": "hello"}), "tools/call", "echo", (32,)),
    ("tools/call, 64 KiB output", "pad64k", call_body("echo", {"text": "hello"}), "tools/call", "echo", (32,)),
    # The per-byte cost: a text argument of 10 KB and 100 KB that the echo tool returns as its result, so every
    # byte-proportional check runs on both ways (outgoing secret scan, validation, output sanitizer, scans of the
    # result, audit, the canonical re-serialisation of the call).
    ("tools/call, 10 KB argument echoed", "plain", call_body("echo", {"text": prose(10_000)}), "tools/call", "echo", (1, 32)),
    ("tools/call, 100 KB argument echoed", "plain", call_body("echo", {"text": prose(100_000)}), "tools/call", "echo", (1, 32)),
]

UPSTREAMS = {"plain": [], "sse": ["--sse"], "pad64k": ["--pad", "65536"], "tools200": ["--tools", "200"]}


def gateway_config(upstream_port, port, full, audit_db=None):
    head = f'[gateway]\nlisten = "127.0.0.1:{port}"\nadmin_listen = "127.0.0.1:0"\n'
    server = f'[servers.up]\nurl = "http://127.0.0.1:{upstream_port}/mcp"\n'
    if not full:
        return head + server + 'pinning = "off"\n' + (
            '[clients.anonymous]\n[[rules]]\nclients = ["anonymous"]\nservers = ["*"]\ntools = ["*"]\naction = "allow"\n'
            '[sanitize]\nansi = false\ninvisible_unicode = false\nsecrets = "off"\n[audit]\nenabled = false\n')
    import hashlib
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    return head + server + f'pinning = "warn"\n[clients.bench]\napi_key_sha256 = "{digest}"\n' + (
        '[clients.other]\napi_key_sha256 = "' + "0" * 64 + '"\n'
        '[[rules]]\nclients = ["bench", "other"]\nservers = ["up"]\ntools = ["echo", "lookup_*", "tool_*", "slow_query"]\naction = "allow"\n'
        'rate = { burst = 1000000000, per_second = 1000000000.0, key = "client+tool" }\n'
        'arguments = { properties = { text = { maxLength = 100000 } } }\n'
        'when = "!has(arguments.override) && client != \'blocked\'"\n'
        '[[rules]]\nclients = ["*"]\nservers = ["*"]\ntools = ["delete_*"]\naction = "deny"\n'
        '[pins]\ndatabase = ":memory:"\n'
        + (f'[audit]\ndatabase = "{audit_db}"\n' if audit_db else '[audit]\nenabled = false\n'))


# The JWT identity targets' clients send (set by --identity).
IDENTITY_JWT = None


def identity_config(upstream_port, port, mode, auth_issuer, key_file):
    """A pass-through gateway whose clients sign in with JWTs, reaching the server per `mode`."""
    text = (f'[gateway]\nlisten = "127.0.0.1:{port}"\nadmin_listen = "127.0.0.1:0"\n'
            f'[servers.up]\nurl = "http://127.0.0.1:{upstream_port}/mcp"\npinning = "off"\n')
    if mode == "static":
        text += 'headers = { Authorization = "Bearer static-service-token" }\n'
    elif mode == "exchange":
        text += (f'[servers.up.identity]\nmode = "exchange"\ntoken_endpoint = "{auth_issuer}/token"\n'
                 'client_id = "portcullis"\nclient_secret = { env = "BENCH_AS_SECRET" }\n')
    else:
        text += '[servers.up.identity]\nmode = "assertion"\n'
    return text + (
        f'[auth.jwt]\nissuer = "{auth_issuer}"\naudience = "https://gateway.test/mcp"\njwks_url = "{auth_issuer}/jwks"\n'
        '[[rules]]\nclients = ["*"]\nservers = ["*"]\ntools = ["*"]\naction = "allow"\n'
        '[sanitize]\nansi = false\ninvisible_unicode = false\nsecrets = "off"\n[audit]\nenabled = false\n'
        f'[identity]\nissuer = "https://gateway.test"\nsigning_keys = [{{ file = "{key_file}" }}]\n')


def start_identity(procs, work):
    """oidc-provider on loopback, a JWT of alice's, and the gateway's signing key."""
    global IDENTITY_JWT
    auth = Proc(["node", str(ROOT / "tests/peers/authz_server.mjs"), "--port", "0"], announce=True)
    procs.append(auth)
    issuer = f"http://127.0.0.1:{auth.port}"
    req = urllib.request.Request(f"{issuer}/token", method="POST", data=(
        "grant_type=client_credentials&scope=mcp%3Atools&resource=https%3A%2F%2Fgateway.test%2Fmcp").encode(), headers={
        "Content-Type": "application/x-www-form-urlencoded", "Authorization": "Basic YWxpY2U6YWxpY2Utc2VjcmV0"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        IDENTITY_JWT = json.load(resp)["access_token"]
    key = f"{work}/identity.pem"
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", key], check=True, capture_output=True)
    return issuer, key


def headers_for(target, method, name, session=None):
    if session:
        h = [f"MCP-Protocol-Version: {LEGACY}", f"Mcp-Session-Id: {session}"]
    else:
        h = ["MCP-Protocol-Version: 2026-07-28", f"Mcp-Method: {method}"]
        if name:
            h.append(f"Mcp-Name: {name}")
    if target.startswith("everything on"):
        h.append(f"Authorization: Bearer {KEY}")
    if target.startswith("identity:"):
        h.append(f"Authorization: Bearer {IDENTITY_JWT}")
    return "\n".join(h)


def post_json(url, body, headers):
    req = urllib.request.Request(url, method="POST", data=json.dumps(body).encode(), headers={
        "Content-Type": "application/json", "Accept": "application/json, text/event-stream", **headers})
    with urllib.request.urlopen(req, timeout=10) as resp:
        resp.read()
        return resp.headers.get("mcp-session-id")


def first_calls(url, body, headers, n=21):
    """The first call after start and the median of the next n-1, in ms (urllib, one connection each)."""
    hdrs = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    for h in headers.splitlines():
        k, v = h.split(":", 1)
        hdrs[k.strip()] = v.strip()
    times = []
    for _ in range(n):
        req = urllib.request.Request(url, method="POST", data=body.encode(), headers=hdrs)
        t = time.monotonic()
        with urllib.request.urlopen(req, timeout=10) as resp:
            resp.read()
        times.append((time.monotonic() - t) * 1e3)
    return times[0], statistics.median(times[1:])


def open_session(url, target):
    """initialize + notifications/initialized, as a 2025-11-25 client does; returns the session id."""
    auth = {"Authorization": f"Bearer {KEY}"} if target.startswith("everything on") else {}
    session = post_json(url, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}}, auth)
    if not session:
        raise RuntimeError(f"{target} minted no session")
    post_json(url, {"jsonrpc": "2.0", "method": "notifications/initialized"},
              {**auth, "Mcp-Session-Id": session, "MCP-Protocol-Version": LEGACY})
    return session


def wrk(url, body, headers, conc, seconds):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        f.write(body)
        body_file = f.name
    env = dict(os.environ, BODY_FILE=body_file, HEADERS=headers)
    threads = 1 if conc == 1 else 2
    out = subprocess.run(["wrk", f"-t{threads}", f"-c{conc}", f"-d{seconds}s", "--latency", "-s", str(ROOT / "bench/load.lua"), url],
                         capture_output=True, text=True, env=env, timeout=seconds + 60)
    os.unlink(body_file)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[7:])
            r["rps"] = r["requests"] / (r["duration_us"] / 1e6)
            return r
    raise RuntimeError(f"wrk printed no result: {out.stdout} {out.stderr}")


def oha(url, body, headers, rate, seconds):
    exe = TOOLS / "oha"
    if not exe.exists():
        return None
    args = [str(exe), "-z", f"{seconds}s", "-q", str(rate), "-m", "POST", "--no-tui", "--output-format", "json", "-d", body,
            "-H", "Content-Type: application/json", "-H", "Accept: application/json, text/event-stream"]
    for h in headers.splitlines():
        args += ["-H", h]
    out = subprocess.run(args + [url], capture_output=True, text=True, timeout=seconds + 60)
    try:
        data = json.loads(out.stdout)
    except json.JSONDecodeError:
        return None
    pct = data.get("latencyPercentiles", {})
    return {"p50_us": pct.get("p50", 0) * 1e6, "p99_us": pct.get("p99", 0) * 1e6, "rps": data.get("summary", {}).get("requestsPerSec", 0)}


def mcp_proxy(upstream_port):
    """mcp-proxy 0.6.0 as a plain HTTP proxy of the same upstream (its MCP endpoint is `/`), when installed."""
    exe = TOOLS / "mcp-proxy"
    if not exe.exists():
        return None
    port = free_port()
    cfg = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
    cfg.write(f'[proxy]\nname = "bench"\nseparator = "/"\n[proxy.listen]\nhost = "127.0.0.1"\nport = {port}\n'
              f'[[backends]]\nname = "up"\ntransport = "http"\nurl = "http://127.0.0.1:{upstream_port}/mcp"\n')
    cfg.close()
    return Proc([str(exe), "--config", cfg.name], wait_port=port, env=dict(os.environ, RUST_LOG="warn"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--write", default=None)
    ap.add_argument("--only", default=None)
    ap.add_argument("--targets", default=None, help="regex: the gateway targets to run (direct and the forwarder always run)")
    ap.add_argument("--gateway", action="append", default=[],
                    help="LABEL=PATH: another portcullis binary measured side by side (everything on only)")
    ap.add_argument("--identity", action="store_true", help="add the upstream-identity targets (see above)")
    ap.add_argument("--fleet", action="store_true", help="add the Redis and PostgreSQL targets (see above)")
    ap.add_argument("--perf", action="append", default=[])
    ap.add_argument("--perf-out", default="perf.data")
    ap.add_argument("--perf-call-graph", default="dwarf,32768")
    ap.add_argument("--perf-workload", default=None, help="regex: profile these workloads (default: the first)")
    args = ap.parse_args()
    workloads = [w for w in WORKLOADS if not args.only or re.search(args.only, w[0])]
    variants = {w[1] for w in workloads}
    for exe in (PORTCULLIS, ECHO, FORWARDER):
        if not exe.exists():
            sys.exit(f"missing {exe}: run bench/load.sh (it builds the release binaries)")
    if not shutil.which("wrk"):
        sys.exit("wrk is missing: apt-get install -y wrk")

    procs = []
    audit_dir = tempfile.mkdtemp(prefix="portcullis-bench-")
    try:
        upstreams = {}
        for variant, extra in UPSTREAMS.items():
            if variant not in variants:
                continue
            up = Proc([str(ECHO), "--port", "0", *extra], announce=True)
            procs.append(up)
            upstreams[variant] = up
        targets = {}  # (target, variant) -> (url, proc measured for CPU or None)
        for variant, up in upstreams.items():
            targets[("direct", variant)] = (f"http://127.0.0.1:{up.port}/mcp", None)
            fw = Proc([str(FORWARDER), "--port", "0", "--upstream", f"http://127.0.0.1:{up.port}/mcp"], announce=True)
            procs.append(fw)
            targets[("bare forwarder", variant)] = (f"http://127.0.0.1:{fw.port}/mcp", fw)
            gateways = [("pass-through", False, None), ("everything on", True, f"{audit_dir}/{variant}.db")]
            if variant == "plain":
                # The same policy with the audit trail disabled: what the trail costs.
                gateways.append(("everything on, audit off", True, None))
            for extra in args.gateway:
                name, _, path = extra.partition("=")
                gateways.append((f"everything on [{name}]", True, f"{audit_dir}/{variant}-{name}.db", path))
            for label, full, audit_db, *exe in gateways:
                if args.targets and not re.search(args.targets, label):
                    continue
                port = free_port()
                cfg = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
                cfg.write(gateway_config(up.port, port, full, audit_db))
                cfg.close()
                gw = Proc([exe[0] if exe else str(PORTCULLIS), "run", "--config", cfg.name], wait_port=port,
                          env=dict(os.environ, RUST_LOG="warn"))
                procs.append(gw)
                targets[(label, variant)] = (f"http://127.0.0.1:{port}/mcp/up", gw)
        if args.identity and "plain" in upstreams:
            issuer, key = start_identity(procs, audit_dir)
            for label, mode in [("identity: static header", "static"), ("identity: exchanged token, cached", "exchange"),
                                ("identity: assertion per call", "assertion")]:
                port = free_port()
                cfg = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
                cfg.write(identity_config(upstreams["plain"].port, port, mode, issuer, key))
                cfg.close()
                gw = Proc([str(PORTCULLIS), "run", "--config", cfg.name], wait_port=port,
                          env=dict(os.environ, RUST_LOG="warn", BENCH_AS_SECRET="portcullis-secret"))
                procs.append(gw)
                targets[(label, "plain")] = (f"http://127.0.0.1:{port}/mcp/up", gw)
        fleet = None
        if args.fleet and "plain" in upstreams:
            fleet = Fleet()
            procs.append(fleet)
            for label, (redis, postgres) in FLEET_TARGETS.items():
                if args.targets and not re.search(args.targets, label):
                    continue
                port = free_port()
                base = gateway_config(upstreams["plain"].port, port, True, f"{audit_dir}/{slug(label)}.db")
                cfg = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
                cfg.write(fleet_config(base, fleet, audit_dir, label, redis, postgres))
                cfg.close()
                gw = Proc([str(PORTCULLIS), "run", "--config", cfg.name], wait_port=port, env=dict(os.environ, RUST_LOG="warn"))
                procs.append(gw)
                targets[(label, "plain")] = (f"http://127.0.0.1:{port}/mcp/up", gw)
        proxy = mcp_proxy(upstreams["plain"].port)
        if proxy:
            procs.append(proxy)
            targets[("mcp-proxy 0.6.0", "plain")] = (f"http://127.0.0.1:{proxy.port}/", proxy)
        sessions = {}  # target label -> session id, for the 2025-11-25 workload
        first = {}  # target label -> (first call ms, median of the next 20 ms)
        procinfo = {t: (p.ready_ms, p.idle_rss) for (t, v), (u, p) in targets.items() if p and v == workloads[0][1]}

        results = {}  # (workload, conc, target) -> list of runs
        for rnd in range(args.rounds):
            for wl, variant, body, method, name, concs in workloads:
                for conc in concs:
                    for (target, v), (url, proc) in targets.items():
                        if v != variant or (target in FLEET_TARGETS and "KB" in wl):
                            continue  # the stores' cost is per call, not per byte
                        b = body
                        legacy = LEGACY in wl
                        if target.startswith("mcp-proxy"):
                            if not legacy:
                                continue
                            b = b.replace('"name": "echo"', '"name": "up/echo"')
                        session = None
                        if legacy:
                            if target not in sessions:
                                sessions[target] = open_session(url, target)
                            session = sessions[target]
                        hdrs = headers_for(target, method, name, session)
                        if rnd == 0 and (wl, variant) == (workloads[0][0], workloads[0][1]) and conc == 1 \
                                and proc and target not in first:
                            first[target] = first_calls(url, b, hdrs)
                        recorder = None
                        profiled = re.search(args.perf_workload, wl) if args.perf_workload else wl == workloads[0][0]
                        if target in args.perf and rnd == 0 and conc == 32 and profiled and proc:
                            out = f"{args.perf_out}.{slug(target)}" + (f".{slug(wl)}" if args.perf_workload else "")
                            recorder = subprocess.Popen(["perf", "record", "-F", "499", "--call-graph", args.perf_call_graph,
                                                         "-o", out, "-p", str(proc.p.pid),
                                                         "--", "sleep", str(max(args.seconds - 1, 1))],
                                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                        stores = None
                        if fleet and target in FLEET_TARGETS:
                            stores = (fleet.commandstats(), fleet.redis_ticks(), fleet.pg_ticks(), fleet.settled_rows())
                        before = proc.cpu_ticks() if proc else 0
                        r = wrk(url, b, hdrs, conc, args.seconds)
                        if recorder:
                            recorder.wait(timeout=args.seconds + 60)
                        if proc:
                            r["cpu_us"] = (proc.cpu_ticks() - before) * 1e6 / CLK_TCK / max(r["requests"], 1)
                        if stores:
                            # The rows of this cell are shipped after it: wait (bounded) until they are in.
                            rows = fleet.settled_rows()
                            calls = max(r["requests"], 1)
                            after = fleet.commandstats()
                            r["redis"] = {k: (v - stores[0].get(k, 0)) / calls for k, v in after.items()
                                          if v - stores[0].get(k, 0) > 0 and k not in ("info",)}
                            r["redis_cpu_us"] = (fleet.redis_ticks() - stores[1]) * 1e6 / CLK_TCK / calls
                            r["pg_cpu_us"] = (fleet.pg_ticks() - stores[2]) * 1e6 / CLK_TCK / calls
                            r["rows_per_call"] = (rows - stores[3]) / calls
                        results.setdefault((wl, conc, target), []).append(r)
                        print(f"round {rnd + 1} {wl} c={conc} {target}: {r['rps']:.0f} req/s p50 {r['p50_us']} us p99 {r['p99_us']} us"
                              f" errors {r['errors']} non2xx {r['non2xx']}", flush=True)
            # Open loop at a fixed rate: latency without coordinated omission.
            wl, variant, body, method, name, _ = WORKLOADS[1]
            for (target, v), (url, proc) in targets.items():
                if WORKLOADS[1] not in workloads or v != variant or target.startswith("mcp-proxy"):
                    continue
                r = oha(url, body, headers_for(target, method, name), 1000, args.seconds)
                if r:
                    results.setdefault(("open loop 1000 req/s", 0, target), []).append(r)
        rss = {t: p.rss_mib() for (t, v), (u, p) in targets.items() if p and v == workloads[0][1]}
    finally:
        for p in procs:
            p.stop()
        shutil.rmtree(audit_dir, ignore_errors=True)

    table = render(results, rss, procinfo, first, args)
    if args.fleet:
        table += "\n\n" + render_fleet(results)
    print(table)
    if args.write:
        write(Path(args.write), table)


def med(runs, key):
    return statistics.median(r.get(key, 0) for r in runs)


def render(results, rss, procinfo, first, args):
    lines = [
        f"Run {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, commit {git_rev()}, {os.cpu_count()} CPUs "
        f"({cpu_model()}), load average before the run {os.getloadavg()[0]:.2f}; {args.rounds} interleaved rounds of "
        f"{args.seconds} s per cell; medians over rounds. Ratios = req/s ÷ direct (or bare forwarder) req/s in the same run; "
        f"+p50 = p50 − the forwarder's p50 in the same cell.",
        "",
        "| workload | c | target | req/s | ÷ direct | ÷ forwarder | p50 | +p50 over forwarder | p99 | CPU per request | errors |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (wl, conc, target), runs in results.items():
        direct = results.get((wl, conc, "direct"))
        fwd = results.get((wl, conc, "bare forwarder"))
        ratio = f"{med(runs, 'rps') / med(direct, 'rps'):.2f}" if direct and target != "direct" else ""
        to_fwd = f"{med(runs, 'rps') / med(fwd, 'rps'):.2f}" if fwd and target not in ("direct", "bare forwarder") else ""
        added = fmt_us(med(runs, 'p50_us') - med(fwd, 'p50_us')) if fwd and to_fwd else ""
        cpu = f"{med(runs, 'cpu_us'):.0f} µs" if "cpu_us" in runs[0] else ""
        errs = sum(r.get("errors", 0) + r.get("non2xx", 0) for r in runs)
        c = "open" if conc == 0 else str(conc)
        lines.append(f"| {wl} | {c} | {target} | {med(runs, 'rps'):,.0f} | {ratio} | {to_fwd} | {fmt_us(med(runs, 'p50_us'))} | "
                     f"{added} | {fmt_us(med(runs, 'p99_us'))} | {cpu} | {errs} |")
    lines += ["", "| process | start to ready | first call | next 20 calls (median) | idle RSS | peak RSS |",
              "|---|---:|---:|---:|---:|---:|"]
    for t, (ready, idle) in procinfo.items():
        f1, fn = first.get(t, (0, 0))
        lines.append(f"| {t} | {ready:.0f} ms | {f1:.2f} ms | {fn:.2f} ms | {idle:.1f} MiB | {rss.get(t, 0):.1f} MiB |")
    lines += ["", "(Start to ready: spawn until the port accepts, polled every 10 ms. First call and the next "
              "20: one fresh urllib connection each, so they include Python's own cost; compare them with each other.)"]
    return "\n".join(lines)


def render_fleet(results):
    """The stores' side of every cell: Redis commands and CPU, PostgreSQL CPU and rows, per call."""
    lines = ["| workload | c | target | Redis commands per call | Redis CPU per call | PostgreSQL CPU per call | audit rows per call |",
             "|---|---|---|---|---:|---:|---:|"]
    for (wl, conc, target), runs in results.items():
        if "redis" not in runs[0] or target in ("direct", "bare forwarder"):
            continue
        names = sorted({k for r in runs for k in r["redis"]})
        cmds = ", ".join(f"{k} {statistics.median(r['redis'].get(k, 0) for r in runs):.2f}" for k in names) or "none"
        lines.append(f"| {wl} | {conc} | {target} | {cmds} | {med(runs, 'redis_cpu_us'):.1f} µs | "
                     f"{med(runs, 'pg_cpu_us'):.1f} µs | {med(runs, 'rows_per_call'):.2f} |")
    return "\n".join(lines)


def fmt_us(us):
    return f"{us / 1000:.2f} ms" if abs(us) >= 1000 else f"{us:.0f} µs"


def git_rev():
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "unknown"


def cpu_model():
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def write(path, table):
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    begin, end = "<!-- load:begin -->", "<!-- load:end -->"
    block = f"{begin}\n{table}\n{end}"
    if begin in text and end in text:
        text = text[: text.index(begin)] + block + text[text.index(end) + len(end):]
    else:
        text += f"\n{block}\n"
    path.write_text(text)


if __name__ == "__main__":
    main()
