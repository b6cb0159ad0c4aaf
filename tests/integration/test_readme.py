"""The README and docs/ keep their promises: every shell command block either runs here or says why it cannot
(`<!-- not run: REASON -->` on the line before it), and the algorithm table (docs/algorithms.md) is the registry's.

`hfl run ...` lines are checked as `hfl config ...` (the same checks `hfl run` makes before any process starts:
keys, values, stages, codecs, dataset, devices, model); `tests/integration/test_cli.py` runs `hfl run` itself.
Other `hfl` lines run as written, with `--out` sent to a temporary directory."""
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"(?:^(<!--[^\n]*-->)\n)?^```(?:bash|sh)\n(.*?)^```", re.M | re.S)


def blocks():
    for page in PAGES:
        text = page.read_text()
        for m in BLOCK.finditer(text):
            line = text[:m.start(2)].count("\n")
            yield pytest.param(page, m.group(1) or "", m.group(2), id=f"{page.name}:{line}")


def commands(body: str) -> list[list[str]]:
    out = []
    for raw in body.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            out.append(shlex.split(line))
    return out


@pytest.mark.parametrize("page, marker, body", list(blocks()))
def test_every_command_block_runs_or_says_why(page, marker, body, tmp_path):
    if marker:
        reason = re.fullmatch(r"<!-- not run: (.+) -->", marker)
        assert reason and reason.group(1).strip(), f"{page.name}: a marker must read <!-- not run: REASON -->"
        return
    for argv in commands(body):
        assert argv[0] == "hfl", f"{page.name}: {' '.join(argv)}: only hfl commands run here; mark the block " \
                                 "<!-- not run: REASON --> if it cannot"
        args = argv[1:]
        if args[0] == "run":
            args = ["config", *[a for a in args[1:] if a not in ("--quiet",)]]
        if "--out" in args:
            args[args.index("--out") + 1] = str(tmp_path / "out")
        result = subprocess.run([sys.executable, "-m", "hfl.cli", *args], cwd=ROOT, capture_output=True, text=True,
                                timeout=600, stdin=subprocess.DEVNULL)
        assert result.returncode == 0, f"{page.name}: {' '.join(argv)}\n{result.stderr[-2000:]}"


def test_the_algorithm_table_is_the_registry():
    from tests.unit.test_config import _fresh_docgen  # a plugin another test imported must not add its algorithms

    assert _fresh_docgen("algorithms").rstrip("\n") in (ROOT / "docs" / "algorithms.md").read_text(), \
        "docs/algorithms.md's table is stale: paste the output of `python -m hfl.docgen algorithms`"


def test_every_paper_is_named():
    text = (ROOT / "README.md").read_text()
    for title in ("Differentially-Private Hierarchical Federated Learning",
                  "A Hierarchical Federated Learning Approach for the Internet of Things",
                  "Federated Learning with Differential Privacy: An Utility-Enhanced Approach",
                  "Scalable Hierarchical Over-the-Air Federated Learning",
                  "Privacy-Preserving Quantized Federated Learning with Diverse Precision"):
        assert title in text


def test_every_local_link_and_picture_exists():
    """Links and pictures to files of the repository (the front page's run picture, the reports that timings cite)."""
    missing = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" not in target and not (page.parent / target).exists():
                missing.append(f"{page.name}: {target}")
    assert not missing, missing
