"""Rewrite the configuration reference table in README.md from the config dataclasses."""
import pathlib
import re

from hfl import families  # noqa: F401
from hfl.common import config

readme = pathlib.Path(__file__).resolve().parents[1] / "README.md"
text = readme.read_text()
table = re.compile(r"^\| key \| default \| meaning \|\n(?:^\|.*\n)*", re.M)
if not table.search(text):
    raise SystemExit("README.md has no reference table to replace")
readme.write_text(table.sub(lambda _: config.reference() + "\n", text, count=1))
print("README.md reference table updated")
