"""Which query values FastMCP (fastmcp 4.2.3) binds for each URI, for the gateway's property tests.

Reads a JSON list of URIs on stdin; prints one JSON list with, per URI, the variables FastMCP's own
`match_uri_template` binds for the template `logs://{service}{?level,é,my name,a,b}` (names decoded,
as FastMCP decodes them), or null when it does not match.

    $PEERS/fastmcp-venv/bin/python fastmcp_uri_match.py < uris.json
"""

import json
import sys

from fastmcp.resources.template import match_uri_template

TEMPLATE = "logs://{service}{?level,é,my name,a,b}"


def main() -> None:
    uris = json.load(sys.stdin)
    print(json.dumps([match_uri_template(uri, TEMPLATE) for uri in uris]))


if __name__ == "__main__":
    main()
