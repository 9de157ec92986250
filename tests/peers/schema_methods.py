"""Prints the methods of each message union of the published MCP schemas, as JSON.

The schemas are read from `mcp-types` (PyPI, installed with `mcp` 2.3.0 by
tests/peers/setup.sh): its `_v2025_11_25` and `_v2026_07_28` packages are
generated from the specification's `schema/2025-11-25.json` and
`schema/2026-07-28.json` (the JSON forms of each era's `schema.ts`, whose
digests their headers give). No registry publishes `schema.ts` itself for
either era. `tests/suite/methods.rs` compares this output with the snapshot the
gateway's method table is tested against.
"""

import json
import typing

import mcp_types._v2025_11_25 as v2025
import mcp_types._v2026_07_28 as v2026
from importlib.metadata import version

UNIONS = ("ClientRequest", "ClientNotification", "ServerRequest", "ServerNotification", "InputRequest")


def methods(alias: object) -> list[str]:
    union = getattr(alias, "__value__", alias)
    out: list[str] = []
    for model in typing.get_args(union) or (union,):
        model = getattr(model, "__value__", model)
        out.extend(typing.get_args(model.model_fields["method"].annotation))
    return sorted(set(out))


def era(module: object) -> dict[str, list[str]]:
    return {name: methods(getattr(module, name)) for name in UNIONS if hasattr(module, name)}


def source(module: object) -> str:
    doc = (module.__doc__ or "").split("from `", 1)[1]
    return doc.split("`", 1)[0] + " sha256 " + doc.split("sha256 `", 1)[1].split("`", 1)[0]


print(
    json.dumps(
        {
            "published_by": "mcp-types " + version("mcp-types"),
            "2025-11-25": {"source": source(v2025), "unions": era(v2025)},
            "2026-07-28": {"source": source(v2026), "unions": era(v2026)},
        },
        indent=2,
    )
)
