"""Plugins: modules that register models, datasets, partitioners, stages, codecs, aggregators or algorithms.

`run.plugins` (and `$HFL_PLUGINS`, comma- or space-separated) name importable modules (`my_pkg.plugin`) or Python
files (`examples/tiny_plugin.py`, relative to the working directory). A process imports the plugins of its own
configuration only: the launcher and the cloud those of the config file they read, an edge or a device host those of
`$HFL_PLUGINS` or `--plugins` (hfl run and the Testbed set it from the run's config). The spec a peer sends may name
only plugins the node loaded already (`check_loaded`): a remote party never makes a node import code.
See docs/plugins.md.
"""
from __future__ import annotations

import importlib
import os
import pathlib
import re
import sys
from typing import Iterable

from .config_error import ConfigError

ENV = "HFL_PLUGINS"
_loaded: dict[str, object] = {}


def env_plugins() -> list[str]:
    return [n for n in re.split(r"[,\s]+", os.environ.get(ENV, "")) if n]


def load_plugins(names: Iterable[str] = ()) -> list[str]:
    """Import $HFL_PLUGINS and `names` (each once per process); a module that cannot be imported is a ConfigError
    naming it and the reason. Returns the modules loaded so far."""
    names = [*env_plugins(), *names]
    if any(n not in _loaded for n in names) and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())  # a plugin beside the experiment, also for the `hfl` script (not on its path)
    for name in names:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"run.plugins must list module names, got {name!r}")
        if name in _loaded:
            continue
        try:
            _loaded[name] = _import_file(name) if _is_path(name) else importlib.import_module(name)
        except ImportError as exc:
            raise ConfigError(f"run.plugins: cannot import {name!r} ({exc.__class__.__name__}: {exc}); it must be "
                              f"importable by every process (on sys.path, or installed)") from None
        except ConfigError:
            raise
        except Exception as exc:  # a plugin that fails while registering: say which
            raise ConfigError(f"run.plugins: importing {name!r} failed: {exc.__class__.__name__}: {exc}") from None
    return list(_loaded)


def check_loaded(names: Iterable[str]) -> None:
    """A peer's spec names these plugins: this node runs only code of its own choosing, so each must be one it loaded
    from its own configuration ($HFL_PLUGINS or --plugins); any other is refused, never imported."""
    load_plugins()
    foreign = [n for n in names if n not in _loaded]
    if foreign:
        raise ConfigError(f"the run's spec names plugins this node did not load: {', '.join(map(repr, foreign))}; a "
                          f"node imports only its own plugins (give them with {ENV} or --plugins: hfl run and the "
                          f"Testbed pass the run's plugins to every process they start)")


def _is_path(name: str) -> bool:
    return name.endswith(".py") or "/" in name or os.sep in name


def _import_file(name: str):
    """A plugin given as a file (`examples/tiny_plugin.py`, relative to the working directory): imported under its
    stem, so its registrations happen once however it is named."""
    import importlib.util

    path = pathlib.Path(name).expanduser()
    if not path.is_file():
        raise ImportError(f"no file {path.resolve()}")
    module_name = path.stem
    if module_name in sys.modules and getattr(sys.modules[module_name], "__file__", None) == str(path.resolve()):
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path.resolve())
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


def search_paths() -> list[str]:
    """The sys.path roots the loaded plugins were found under (children get them on PYTHONPATH, so a plugin
    importable in the launcher is importable in every node it starts)."""
    roots = []
    for name, module in _loaded.items():
        file = getattr(module, "__file__", None)
        if not file or _is_path(name):  # a file plugin is found by its path again (children share the cwd)
            continue
        path = pathlib.Path(file).resolve().parent
        for _ in range(name.count(".") + (pathlib.Path(file).name == "__init__.py")):
            path = path.parent
        if str(path) not in roots:
            roots.append(str(path))
    return roots


def child_pythonpath(env: dict | None = None) -> str:
    """PYTHONPATH for a child process: the plugins' roots, the current directory, then what it already had."""
    current = (env if env is not None else os.environ).get("PYTHONPATH", "")
    parts = [*search_paths(), os.getcwd(), *[p for p in current.split(os.pathsep) if p]]
    seen: list[str] = []
    for part in parts:
        if part not in seen:
            seen.append(part)
    return os.pathsep.join(seen)


def loaded() -> list[str]:
    return list(_loaded)


__all__ = ["ENV", "load_plugins", "check_loaded", "env_plugins", "search_paths", "child_pythonpath", "loaded"]
