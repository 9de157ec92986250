"""Upstream MCP server (official Python SDK, mcp 2.3.0) that says who called it, for the upstream-identity tests.

Serves Streamable HTTP at /mcp on 127.0.0.1 (both eras), prints `LISTENING <port>` once ready. One
tool, `whoami`, answers with the identity the server established from the request's headers:

    $PEERS/venv/bin/python py_identity_server.py --port 0 --record FILE
        [--header NAME]                      the header carrying the credential (default Authorization)
        [--verify jwt --issuer ISS (--audience AUD | --audience-self)
                      (--jwks URL | --jwks-url-file FILE)]
        [--jwks-lifespan SECONDS]            how long the fetched key set is kept (default 300)
        [--show NAME ...]                    headers to report as they came (template and secret modes)

With --verify jwt, the credential (a `Bearer` prefix removed) must be a JWT that PyJWT verifies
against the key set at URL (fetched by PyJWKClient, fetched again for an unknown `kid`) with that
issuer and audience (`--audience-self`: this server's own URL); the answer is
{"sub", "act", "azp", "client_id", "aud", "scope", "iss"} from the verified claims and the `kid` that signed, or
{"refused": reason}. --jwks-url-file names a file holding the URL, read when a request comes (the
gateway's address is known only once it runs). Without --verify, the answer is {"headers": {...}}
with the --show headers. Each call is appended to --record as {"tool": "whoami", "identity": ...},
so a test sees what ran and as whom.
"""

import argparse
import json
import socket
import sys
from typing import Any

import jwt
import uvicorn
from mcp.server.mcpserver import Context, MCPServer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--record")
    ap.add_argument("--header", default="authorization")
    ap.add_argument("--verify", choices=["jwt"])
    ap.add_argument("--issuer")
    ap.add_argument("--audience")
    ap.add_argument("--audience-self", action="store_true")
    ap.add_argument("--jwks")
    ap.add_argument("--jwks-url-file")
    ap.add_argument("--jwks-lifespan", type=float, default=300)
    ap.add_argument("--show", action="append", default=[])
    opts = ap.parse_args()

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", opts.port))
    port = sock.getsockname()[1]
    audience = f"http://127.0.0.1:{port}/mcp" if opts.audience_self else opts.audience
    clients: dict[str, jwt.PyJWKClient] = {}

    def jwks_client() -> jwt.PyJWKClient:
        url = opts.jwks
        if opts.jwks_url_file:
            with open(opts.jwks_url_file, encoding="utf-8") as f:
                url = f.read().strip()
        if url not in clients:
            # PyJWKClient's defaults otherwise: a key set older than the
            # lifespan is fetched again, and an unknown kid forces a fetch at
            # most every 30 s.
            clients[url] = jwt.PyJWKClient(url, cache_keys=False, lifespan=opts.jwks_lifespan)
        return clients[url]

    def identify(headers: Any) -> dict[str, Any]:
        if opts.verify != "jwt":
            return {"headers": {name: headers.get(name) for name in opts.show}}
        credential = headers.get(opts.header)
        if credential is None:
            return {"refused": f"no {opts.header} header"}
        token = credential[7:] if credential.lower().startswith("bearer ") else credential
        try:
            key = jwks_client().get_signing_key_from_jwt(token)
            claims = jwt.decode(
                token,
                key.key,
                algorithms=["EdDSA", "ES256", "RS256"],
                issuer=opts.issuer,
                audience=audience,
                options={"require": ["exp", "iat", "sub"]},
            )
        except Exception as exc:  # a refusal is the answer, with its reason
            return {"refused": f"{type(exc).__name__}: {exc}"}
        seen = {k: claims.get(k) for k in ("sub", "act", "azp", "client_id", "aud", "scope", "iss")}
        seen["kid"] = jwt.get_unverified_header(token).get("kid")
        return seen

    mcp = MCPServer("identity-peer")

    @mcp.tool()
    async def whoami(ctx: Context) -> str:
        """Says who the caller is, as this server verified it."""
        request = ctx.request_context.request
        identity = identify(request.headers if request is not None else {})
        if opts.record:
            with open(opts.record, "a", encoding="utf-8") as f:
                f.write(json.dumps({"tool": "whoami", "arguments": {}, "identity": identity}) + "\n")
        return json.dumps(identity)

    app = mcp.streamable_http_app()
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1))
    original_startup = server.startup

    async def startup(sockets: list[socket.socket] | None = None) -> None:
        await original_startup(sockets=sockets)
        print(f"LISTENING {port}", flush=True)

    server.startup = startup  # type: ignore[method-assign]
    server.run(sockets=[sock])


if __name__ == "__main__":
    sys.exit(main())
