"""hfl: a multi-process emulator of hierarchical federated learning."""
import pathlib as _pathlib

# Run from a source checkout (tests, `python -m hfl` in the repository): pyproject maps hfl.common to common/ and so
# on; the repository root on this package's path gives the same names without an install pointing elsewhere.
_root = _pathlib.Path(__file__).resolve().parent.parent
if (_root / "pyproject.toml").is_file() and (_root / "common").is_dir():
    __path__.append(str(_root))
