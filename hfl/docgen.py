"""Tables of the README generated from the registries (tests fail when the README drifts from them).

    python -m hfl.docgen algorithms     # the README's algorithm table
"""
from __future__ import annotations

import re
import sys

PRIVACY = {"": "none", "by_trust": "DP by trust: noise at a trusted edge, else on every device",
           "aggregator": "user-level DP, noise at the (trusted) edge", "sample": "sample-level DP-SGD on every device"}


def _first_sentence(text: str | None, limit: int = 220) -> str:
    text = " ".join((text or "").split())
    first = re.split(r"(?<=[a-z0-9)])\. (?=[A-Z])", text)[0].rstrip(".")
    if len(first) > limit:
        first = first[:limit].rsplit(" ", 1)[0] + " ..."
    return first.replace("|", "/")


def _wire(a) -> str:
    if a.medium:
        return "analog model / gradient over the air (the cloud's medium), devices -> edge -> cloud"
    if a.relay:
        return f"{' or '.join(a.codecs)} device uploads, relayed unchanged by the edges to the cloud's fusion"
    return "device -> edge -> cloud model deltas (or gradients), `pipeline.*_encoding`"


def algorithm_table() -> str:
    from hfl.common.plans import ALGORITHMS

    rows = ["| `run.algorithm` | source | schedule | on the wire | privacy |", "|---|---|---|---|---|"]
    for name in ALGORITHMS.names():
        a = ALGORITHMS.get(name)
        privacy = PRIVACY.get(a.privacy, a.privacy) + (f" (every edge {a.trust})" if a.trust else "")
        rows.append(f"| `{name}` | {a.reference} | {_first_sentence(a.plan.__doc__)} | {_wire(a)} | {privacy} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print({"algorithms": algorithm_table}[sys.argv[1] if len(sys.argv) > 1 else "algorithms"]())
