"""Which resource the official Python SDK (mcp 2.3.0) resolves each URI to, for the gateway's property tests.

Reads a JSON list of URIs on stdin; prints one JSON list with, per URI, the first template of the
peer server's (tests/peers/py_server.py) that `UriTemplate.match` accepts and the variables it
decodes, as {"template": T, "vars": {...}}, or null when none matches. The templates are checked in
the order the server registers them, with the SDK's own matcher (percent-decoding included).

    $PEERS/venv/bin/python uri_match.py < uris.json
"""

import json
import sys

from mcp.shared.uri_template import UriTemplate

TEMPLATES = ["users://{user_id}/profile", "logs://{service}{?level,since}", "res://{+path}", "file:///{+path}"]


def main() -> None:
    uris = json.load(sys.stdin)
    parsed = [(t, UriTemplate.parse(t)) for t in TEMPLATES]
    out = []
    for uri in uris:
        found = None
        for text, template in parsed:
            got = template.match(uri)
            if got is not None:
                found = {"template": text, "vars": got}
                break
        out.append(found)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
