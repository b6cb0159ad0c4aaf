"""Every package of the source tree is in pyproject.toml's list, so a non-editable install (the Docker image,
a wheel) has all of it."""
import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_every_package_is_listed():
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed, dirs = set(tool["packages"]), tool["package-dir"]
    found = set()
    for name, folder in dirs.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            if "tests" not in rel.parts:
                found.add(".".join((name, *rel.parts)))
    assert found - listed == set(), f"add to [tool.setuptools] packages: {sorted(found - listed)}"
