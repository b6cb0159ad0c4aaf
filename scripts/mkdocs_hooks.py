"""MkDocs hooks (`hooks:` in mkdocs.yml) for the documentation site built from docs/.

- The site's home page is the repository's README.md, so the front page is written once: its links into docs/ become
  the site's own pages, and links to other files of the repository (REPRODUCTIONS.md, examples, reports) become their
  path in code, since the site does not carry them.
- A docs page may link to a file of the repository outside docs/ (`../benchmarks/reports/...`): such links work when
  the pages are read in the repository and become the path in code on the site.

`mkdocs build --strict` (tests/unit/test_docs_site.py) still fails on a broken link between pages, an unknown
anchor, or a page left out of the navigation.
"""
from __future__ import annotations

import pathlib
import re

from mkdocs.structure.files import File

ROOT = pathlib.Path(__file__).resolve().parents[1]
LINK = re.compile(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)")


def _as_path(text: str, target: str) -> str:
    """A link to a repository file the site does not carry: the link text, and the path in code."""
    path = target.split("#", 1)[0]
    text_path = text.strip("`")
    return f"`{path}`" if text_path == path or text_path == pathlib.PurePosixPath(path).name else f"{text} (`{path}`)"


def _home(markdown: str) -> str:
    def link(m: re.Match) -> str:
        text, target = m.groups()
        if "://" in target or target.startswith(("#", "mailto:")):
            return m.group(0)
        if target.startswith("docs/"):
            return f"[{text}]({target[len('docs/'):]})"
        return _as_path(text, target)

    markdown = LINK.sub(link, markdown)
    return re.sub(r"(!\[[^\]]*\]\()docs/", r"\1", markdown)  # pictures in docs/


def _page(markdown: str) -> str:
    def link(m: re.Match) -> str:
        text, target = m.groups()
        if target.startswith("../"):
            return _as_path(text, target[len("../"):])
        return m.group(0)

    return LINK.sub(link, markdown)


def on_files(files, config):
    files.append(File.generated(config, "index.md", content=(ROOT / "README.md").read_text()))
    return files


def on_page_markdown(markdown, page, config, files):
    return _home(markdown) if page.file.src_uri == "index.md" else _page(markdown)
