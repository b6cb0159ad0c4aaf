"""Per-device privacy ledger kept in the run directory, one JSON line per round.

Each line holds the round's DP records and the running epsilon per device. Lines are appended with
flush + fsync, so after a crash the file holds every completed round; a torn last line (a crash in the
middle of a write) is dropped on load and the file is truncated back to its last whole line, so the
cloud can restart and keep appending. A re-run of a round is recorded again: its noise was released again.
"""
from __future__ import annotations

import json
import os
import pathlib
from typing import Iterable, Sequence

from .accountant import device_epsilons, epsilon, make_accountant, records_by_device, summarise
from .events import DpRecord

LEDGER_FILE = "privacy_ledger.jsonl"


def _sort_key(r: DpRecord) -> tuple:
    return (r.round, r.stream, r.tier, r.node, r.covers, r.mechanism, r.noise_multiplier, r.sensitivity,
            r.sampling_rate, r.count)


def lines_to_keep(lines: Sequence[dict], last_round: int, noise_source: str) -> list[dict]:
    """The ledger lines a resume keeps when it redoes the rounds after `last_round` (its checkpoint). Secret noise:
    all of them, since each redone round is a new release of fresh noise and is charged again. Seeded noise (a
    replay): the redone rounds draw the very same noise, so their earlier lines go and they are charged once."""
    if noise_source == "seeded":
        return [line for line in lines if int(line["round"]) <= last_round]
    return list(lines)


class PrivacyLedger:
    """Records per device, composed with dp_accounting at `delta` by the `accountant` ("rdp" | "pld")."""

    def __init__(self, delta: float, accountant: str = "rdp", devices: Sequence[str] = (),
                 path: str | os.PathLike | None = None):
        if not 0.0 < delta < 1.0:
            raise ValueError(f"delta must lie in (0, 1), got {delta!r}")
        make_accountant(accountant)
        self.delta, self.accountant = float(delta), accountant
        self.devices = tuple(sorted(set(devices)))
        self.path = pathlib.Path(path) if path is not None else None
        self.records: list[DpRecord] = []
        self.rounds: list[int] = []
        self.caveats: list[str] = []  # what the figures do not cover (e.g. seeded DP noise), on every line

    # -- building ------------------------------------------------------------------------------------

    @classmethod
    def from_records(cls, records: Iterable[DpRecord], delta: float, accountant: str = "rdp",
                     devices: Sequence[str] = ()) -> "PrivacyLedger":
        """A ledger rebuilt from records (for instance recovered from the messages' transforms)."""
        ledger = cls(delta, accountant, devices)
        ledger.records = sorted(records, key=_sort_key)
        ledger.rounds = sorted({r.round for r in ledger.records})
        return ledger

    @classmethod
    def open(cls, run_dir: str | os.PathLike, delta: float, accountant: str = "rdp",
             devices: Sequence[str] = ()) -> "PrivacyLedger":
        """The ledger of `run_dir`, resumed from its file if there is one."""
        ledger = cls(delta, accountant, devices, pathlib.Path(run_dir) / LEDGER_FILE)
        if ledger.path.exists():
            for line in _read_whole_lines(ledger.path):
                ledger.rounds.append(int(line["round"]))
                ledger.records.extend(DpRecord.from_json(e) for e in line["events"])
        return ledger

    def record_round(self, round_: int, records: Sequence[DpRecord]) -> dict[str, float]:
        """Add a round's records, append its line to the file (durably) and return epsilon_max/mean."""
        records = sorted(records, key=_sort_key)
        bad = [r for r in records if r.round != round_]
        if bad:
            raise ValueError(f"records of round {bad[0].round} passed to record_round(round_={round_})")
        self.records.extend(records)
        self.rounds.append(int(round_))
        eps = self.epsilons()
        summary = summarise(eps)
        if self.path is not None:
            line = {"round": int(round_), **summary, "epsilon": eps, "events": [r.to_json() for r in records],
                    "delta": self.delta, "accountant": self.accountant}
            if self.caveats:
                line["caveats"] = list(self.caveats)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(line, sort_keys=True) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
        return summary

    # -- reading -------------------------------------------------------------------------------------

    def epsilons(self) -> dict[str, float]:
        return device_epsilons(self.records, self.delta, self.accountant, self.devices)

    def summary(self) -> dict[str, float]:
        return summarise(self.epsilons())

    def over_budget(self, planned: Iterable[DpRecord], epsilon_budget: float, delta: float | None = None
                    ) -> dict[str, float]:
        """Devices that the planned records would take past the budget, with the epsilon they would reach."""
        if not epsilon_budget > 0:
            raise ValueError(f"epsilon_budget must be > 0, got {epsilon_budget!r}")
        delta = self.delta if delta is None else delta
        planned_by_device = records_by_device(planned)
        past = records_by_device(self.records)
        out = {}
        for device, extra in sorted(planned_by_device.items()):
            eps = epsilon(past.get(device, []) + extra, delta, self.accountant)
            if eps > epsilon_budget:
                out[device] = eps
        return out

    def would_exceed(self, planned: Iterable[DpRecord], epsilon_budget: float, delta: float | None = None) -> bool:
        """True when the planned records of the next round would take any device past epsilon_budget."""
        return bool(self.over_budget(planned, epsilon_budget, delta))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PrivacyLedger):
            return NotImplemented
        return (self.delta, self.accountant) == (other.delta, other.accountant) and \
            sorted(self.records, key=_sort_key) == sorted(other.records, key=_sort_key)

    __hash__ = None  # mutable


def _read_whole_lines(path: pathlib.Path) -> list[dict]:
    """Parse the file's lines; drop a torn last line and truncate the file to the last whole one."""
    data = path.read_bytes()
    lines, good_end, out = data.split(b"\n"), 0, []
    for i, raw in enumerate(lines):
        last = i == len(lines) - 1
        if last and raw == b"":
            break
        try:
            if last:  # no newline after it: the write did not finish
                raise ValueError("unterminated line")
            out.append(json.loads(raw))
        except ValueError:
            if not last and not (i == len(lines) - 2 and lines[-1] == b""):
                raise ValueError(f"{path}: line {i + 1} is corrupt (not the last line, so not a torn write)") from None
            break
        good_end += len(raw) + 1
    if good_end != len(data):
        with open(path, "r+b") as fh:
            fh.truncate(good_end)
            fh.flush()
            os.fsync(fh.fileno())
    return out
