"""`hfl watch URL|RUN_DIR`: the progress table of `hfl run` for a run started elsewhere (a compose testbed, a remote
cloud): from the cloud's live page (its /api/state) or from a run directory (metrics.jsonl, summary.json)."""
from __future__ import annotations

import json
import pathlib
import sys
import time
import urllib.error
import urllib.request

from rich.console import Console
from rich.live import Live

from hfl.launcher import live_snapshot, live_url, progress_table, round_line, run_info


class WatchError(RuntimeError):
    pass


class PageSource:
    """A live page: /api/state, new rows only."""

    def __init__(self, url: str, tls=None):
        from hfl.common.observe.live import client_ssl

        self.url = url if url.endswith("/") else url + "/"
        self.ssl = client_ssl(tls)
        self.rows: list[dict] = []
        self.info: dict | None = None

    def poll(self) -> tuple[list[dict], str, float, bool]:
        try:
            with urllib.request.urlopen(f"{self.url}api/state?since={len(self.rows)}", timeout=10,
                                        context=self.ssl) as res:
                state = json.loads(res.read())
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise WatchError(f"{self.url}: {getattr(exc, 'reason', exc)}") from None
        del self.rows[state["rows_from"]:]
        self.rows.extend(state["rows"])
        self.info = state["run"]
        p = state["progress"]
        return self.rows, p["phase"], p["elapsed_s"], p["finished"]


class DirSource:
    """A run directory written by a cloud on this machine (or a mounted volume)."""

    def __init__(self, run_dir: pathlib.Path):
        from hfl.common import config as config_mod

        self.run_dir = run_dir
        config = run_dir / "config.toml"
        if not config.is_file():
            raise WatchError(f"{run_dir}: no config.toml (not a run directory)")
        self.info = run_info(config_mod.load(config, []))
        self.url = live_url(run_dir)

    def poll(self) -> tuple[list[dict], str, float, bool]:
        from hfl.common import metrics

        rows = metrics.read_jsonl(self.run_dir / "metrics.jsonl")
        finished = (self.run_dir / "summary.json").is_file()
        elapsed = rows[-1]["wall_seconds"] if rows else 0.0
        if not finished:
            return rows, "running", elapsed, False
        try:
            stop = json.loads((self.run_dir / "summary.json").read_text()).get("stop_reason")
        except (OSError, ValueError):  # being written
            stop = None
        # a finished run's page is gone with its cloud: point at its snapshot instead
        self.url = live_snapshot(self.run_dir) or self.url
        return rows, "done" + (f" (stopped: {stop})" if stop else ""), elapsed, True


def watch(target: str, interval: float = 1.0, once: bool = False, tls=None) -> int:
    console = Console(stderr=False)
    try:
        if target.startswith(("http://", "https://")):
            source = PageSource(target, tls)
        else:
            source = DirSource(pathlib.Path(target))
        rows, phase, elapsed, finished = source.poll()
    except WatchError as exc:
        print(f"hfl watch: {exc}", file=sys.stderr)
        return 1
    table = lambda: progress_table(source.info, rows, elapsed, phase, source.url, prefix="hfl watch")  # noqa: E731
    if once:
        console.print(table())
        return 0
    if not console.is_terminal:  # a log or a pipe: one line per round
        seen = 0
        while True:
            for row in rows[seen:]:
                console.print(round_line(row, source.info["rounds"]))
            seen = len(rows)
            if finished:
                console.print(phase)
                return 0
            time.sleep(interval)
            try:
                rows, phase, elapsed, finished = source.poll()
            except WatchError as exc:
                console.print(f"hfl watch: {exc}; retrying")
    with Live(table(), console=console, refresh_per_second=4) as live:
        while not finished:
            time.sleep(interval)
            try:
                rows, phase, elapsed, finished = source.poll()
            except WatchError as exc:
                phase = f"unreachable ({exc}); retrying"
            live.update(table())
    return 0
