"""The documentation site (mkdocs.yml, docs/, README.md as its home page) builds with `mkdocs build --strict`: a link
to a missing page or anchor, or a page of docs/ left out of the navigation, fails it. The second test shows that the
configuration really catches both, on a copy of the site with one of each."""
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("mkdocs", reason="the documentation site needs the test extra: pip install -e \".[test]\"")
pytest.importorskip("material", reason="the documentation site needs the test extra: pip install -e \".[test]\"")

ROOT = pathlib.Path(__file__).parents[2]


def _build(root: pathlib.Path, site: pathlib.Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's banner about MkDocs 2.0, not a warning of ours
    # not --quiet: it hides the warnings from --strict's count
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(root / "mkdocs.yml"),
                           "-d", str(site)],
                          cwd=root, capture_output=True, text=True, timeout=300, env=env, stdin=subprocess.DEVNULL)


def test_the_site_builds_strict(tmp_path):
    result = _build(ROOT, tmp_path / "site")
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
    assert (tmp_path / "site" / "index.html").exists()
    pages = sorted(p.stem for p in (ROOT / "docs").glob("*.md"))
    missing = [p for p in pages if not (tmp_path / "site" / p / "index.html").exists()]
    assert not missing, f"docs pages not built: {missing}"


def test_a_broken_link_or_a_page_out_of_the_navigation_fails_the_build(tmp_path):
    copy = tmp_path / "repo"
    for name in ("mkdocs.yml", "README.md"):
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, copy / name)
    shutil.copytree(ROOT / "docs", copy / "docs")
    (copy / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "mkdocs_hooks.py", copy / "scripts" / "mkdocs_hooks.py")
    (copy / "docs" / "orphan.md").write_text("# Not in the navigation\n")
    with (copy / "docs" / "architecture.md").open("a") as f:
        f.write("\nSee [a page that is not there](no-such-page.md) and [an anchor](running.md#no-such-anchor).\n")
    result = _build(copy, tmp_path / "site")
    out = result.stdout + result.stderr
    assert result.returncode != 0, out[-3000:]
    assert "orphan.md" in out and "no-such-page.md" in out and "no-such-anchor" in out, out[-3000:]
