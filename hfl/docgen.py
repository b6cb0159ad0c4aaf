"""Documentation generated from the code (tests fail when a page drifts from it).

    python -m hfl.docgen algorithms                                    # the table in docs/algorithms.md
    python -m hfl.docgen configuration > docs/configuration.md         # every config key
    python -m hfl.docgen default-config > deploy/configs/default.toml  # the built-in defaults as a file
"""
from __future__ import annotations

import re
import sys

from hfl import families  # noqa: F401  (their sections, algorithms and stages are documented too)

PRIVACY = {"": "none", "by_trust": "DP by trust: noise at a trusted edge, else on every device",
           "aggregator": "user-level DP, noise at the (trusted) edge", "sample": "sample-level DP-SGD on every device"}


def _first_sentence(text: str | None, limit: int = 220) -> str:
    text = " ".join((text or "").split())
    first = re.split(r"(?<=[a-z0-9)])\. (?=[A-Z])", text)[0].rstrip(".")
    if len(first) > limit:
        first = first[:limit].rsplit(" ", 1)[0] + " ..."
    return first.replace("|", "/")


def _wire(a) -> str:
    from hfl.common.modes import MODES

    mode = MODES.get(a.mode)
    return f"{mode.name}: " + (mode.wire.replace("quantized", " or ".join(a.codecs)) if a.codecs else mode.wire)


def algorithm_table() -> str:
    from hfl.common.plans import ALGORITHMS

    rows = ["| `run.algorithm` | source | schedule | on the wire | privacy |", "|---|---|---|---|---|"]
    for name in ALGORITHMS.names():
        a = ALGORITHMS.get(name)
        privacy = PRIVACY.get(a.privacy, a.privacy) + (f" (every edge {a.trust})" if a.trust else "")
        rows.append(f"| `{name}` | {a.reference} | {_first_sentence(a.plan.__doc__)} | {_wire(a)} | {privacy} |")
    return "\n".join(rows)


DEFAULT_HEADER = ("# The built-in defaults (what `hfl run` uses with no CONFIG). Generated, checked by a test: "
                  "python -m hfl.docgen default-config > deploy/configs/default.toml")


def default_config() -> str:
    from hfl.common import config

    return DEFAULT_HEADER + "\n" + config.to_toml(config.Config()).rstrip("\n")


def configuration_page() -> str:
    from hfl.common import config

    return "\n".join([
        "# Configuration reference",
        "",
        "Every key of a run's TOML config, its default and meaning. Generated from the config dataclasses: "
        "`python -m hfl.docgen configuration > docs/configuration.md` (a test fails when this page drifts); "
        "`hfl config --reference` prints the same table.",
        "",
        "TOML files (examples in `deploy/configs/`) load into frozen dataclasses; every command takes "
        "`--set section.key=value` (values parse as TOML, bare words as strings). Unknown keys, bad values and "
        "unknown or missing stage and codec parameters fail before any process starts, naming the key and the "
        "allowed values. Names marked \"one of\" come from registries that plugins extend (docs/plugins.md).",
        "",
        config.reference(),
    ])


PAGES = {"algorithms": algorithm_table, "configuration": configuration_page, "default-config": default_config}

if __name__ == "__main__":
    print(PAGES[sys.argv[1] if len(sys.argv) > 1 else "algorithms"]())
