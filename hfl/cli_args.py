"""Arguments that several `hfl` subcommands share (the CLI and the subcommands in their own modules)."""
from __future__ import annotations

import argparse


def add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="TOML config file (default: built-in defaults)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value (repeatable)")
