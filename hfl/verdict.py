"""Did a run learn? A run whose loss explodes or whose accuracy never leaves chance is flagged in summary.json
(`not_learning`, with the reason) and on the console, instead of ending like any other run."""
from __future__ import annotations

import math

LOSS_GROWTH = 10.0   # final test loss over the first one
CHANCE_MARGIN = 1.5  # best accuracy under this multiple of 1 / classes is chance level


def not_learning(rows: list[dict], num_classes: int | None = None) -> str | None:
    """The reason a run did not learn, or None. Rows are metrics.jsonl's; rounds are numbered from 0, as there."""
    evaluated = [r for r in rows if r.get("accuracy") is not None or r.get("loss") is not None or r.get("diverged")]
    if not evaluated:
        return None
    bad = next((r for r in evaluated if r.get("diverged") or (r.get("loss") is not None and not math.isfinite(r["loss"]))),
               None)
    if bad is not None:
        return f"the model diverged at round {bad['round']} (non-finite values)"
    losses = [(r["round"], r["loss"]) for r in evaluated if r.get("loss") is not None]
    if len(losses) >= 2 and losses[-1][1] > max(LOSS_GROWTH * losses[0][1], 10.0):
        return (f"the test loss exploded: {losses[0][1]:.4g} after round {losses[0][0]}, {losses[-1][1]:.4g} after "
                f"round {losses[-1][0]}")
    accs = [r["accuracy"] for r in evaluated if r.get("accuracy") is not None]
    classes = num_classes or 10
    chance = 1.0 / classes
    if len(accs) >= 2 and max(accs) < CHANCE_MARGIN * chance:
        return (f"accuracy stayed at chance: best {100 * max(accs):.2f}% over {len(accs)} evaluations, chance is "
                f"{100 * chance:.1f}% ({classes} classes)")
    return None
