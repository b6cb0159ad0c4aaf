"""Empirical privacy audit of ONE release: a distinguishing test with and without a canary, turned into a
Clopper-Pearson lower bound on epsilon.

Method (Jagielski, Ullman, Oprea 2020, "Auditing differentially private machine learning", Sec. 3; Nasr et
al. 2021): an (epsilon, delta)-DP release M gives every test that guesses "canary present" from M's output
  FPR + e^epsilon FNR >= 1 - delta   and   FNR + e^epsilon FPR >= 1 - delta,
so epsilon >= max(ln((1 - delta - FNR) / FPR), ln((1 - delta - FPR) / FNR)). With FPR and FNR replaced by
their Clopper-Pearson upper bounds (each at level 1 - alpha/2, so both hold together with probability
>= 1 - alpha by the union bound) the result is a (1 - alpha) lower bound on the release's true epsilon.

The threshold (and its direction) is chosen on the first `fit_fraction` of the trials and the bound is
computed on the rest only; choosing the threshold on the counted trials would bias the bound upwards.

The score is a linear statistic <v, output>: for Gaussian noise with covariance S and a canary that shifts
the mean by D, the Neyman-Pearson (likelihood-ratio) test thresholds <S^-1 D, output>, so v = S^-1 D is the
best score. `projection_score(canary)` is that test for isotropic noise (the vanilla Gaussian mechanism),
`wavelet_lr_score` for the wavelet-domain noise of paper 002 (S^-1 is diagonal in the coefficients, with
entries W_c^2), and with neither the audit estimates v from pilot trials (mean difference over the per-
coordinate variance), which is the LR test when the noise is independent across coordinates.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from scipy import stats

Release = Callable[..., np.ndarray]
Score = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class AuditResult:
    """Outcome of one audit; the counts, threshold and bound are those of the held-out trials."""

    epsilon_lower: float  # Clopper-Pearson lower bound at `confidence`
    epsilon_claimed: float | None
    delta: float
    confidence: float
    threshold: float
    guess_canary_above: bool  # the test says "canary" when score >= threshold (else when score <= threshold)
    false_positives: int
    false_negatives: int
    negatives: int  # held-out trials without the canary
    positives: int  # held-out trials with the canary
    fpr_upper: float
    fnr_upper: float
    scores_without: np.ndarray = field(repr=False)  # every trial's score, fit and held-out
    scores_with: np.ndarray = field(repr=False)
    label: str = ""

    @property
    def exceeds_claim(self) -> bool:
        return self.epsilon_claimed is not None and self.epsilon_lower > self.epsilon_claimed

    def summary(self) -> dict:
        return {"label": self.label, "epsilon_lower_bound": self.epsilon_lower, "epsilon_claimed": self.epsilon_claimed,
                "exceeds_claim": self.exceeds_claim, "delta": self.delta, "confidence": self.confidence,
                "trials_per_hypothesis": len(self.scores_without), "held_out": [self.negatives, self.positives],
                "false_positives": self.false_positives, "false_negatives": self.false_negatives,
                "threshold": self.threshold, "audit_level": "one release"}


def clopper_pearson_upper(k: np.ndarray | int, n: np.ndarray | int, alpha: float) -> np.ndarray:
    """Upper end of the two-sided (1 - alpha) Clopper-Pearson interval of a binomial rate, k of n."""
    k, n = np.asarray(k, dtype=np.float64), np.asarray(n, dtype=np.float64)
    upper = stats.beta.ppf(1 - alpha / 2, k + 1, np.maximum(n - k, 1.0))
    return np.where(k >= n, 1.0, upper)


def epsilon_lower_bound(fp, negatives, fn, positives, delta: float, confidence: float = 0.95) -> np.ndarray:
    """max(ln((1 - delta - FNR_u) / FPR_u), ln((1 - delta - FPR_u) / FNR_u), 0) with Clopper-Pearson upper
    bounds FPR_u, FNR_u (vectorised over thresholds)."""
    _check_delta_confidence(delta, confidence)
    alpha = 1.0 - confidence
    fpr = clopper_pearson_upper(fp, negatives, alpha)
    fnr = clopper_pearson_upper(fn, positives, alpha)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.log(np.maximum(1.0 - delta - fnr, 0.0) / fpr)
        b = np.log(np.maximum(1.0 - delta - fpr, 0.0) / fnr)
    return np.maximum(np.maximum(np.nan_to_num(a, nan=0.0, neginf=0.0), np.nan_to_num(b, nan=0.0, neginf=0.0)), 0.0)


def _check_delta_confidence(delta: float, confidence: float) -> None:
    if not 0 <= delta < 1:
        raise ValueError(f"delta must be in [0, 1), got {delta!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")


def _sweep(neg: np.ndarray, pos: np.ndarray, delta: float, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """For every candidate threshold t (each observed score), the bound of the test "canary iff score >= t"."""
    thresholds = np.unique(np.concatenate([neg, pos]))
    neg_sorted, pos_sorted = np.sort(neg), np.sort(pos)
    fp = len(neg) - np.searchsorted(neg_sorted, thresholds, side="left")  # negatives with score >= t
    fn = np.searchsorted(pos_sorted, thresholds, side="left")  # positives with score < t
    return thresholds, epsilon_lower_bound(fp, len(neg), fn, len(pos), delta, confidence)


def _counts(neg, pos, threshold: float, above: bool) -> tuple[int, int]:
    if above:
        return int(np.sum(neg >= threshold)), int(np.sum(pos < threshold))
    return int(np.sum(neg <= threshold)), int(np.sum(pos > threshold))


def projection_score(direction: np.ndarray) -> Score:
    """Score <direction, output> / ||direction||: the likelihood-ratio test for isotropic Gaussian noise
    when the canary shifts the output along `direction`."""
    v = np.asarray(direction, dtype=np.float64).reshape(-1)
    norm = np.linalg.norm(v)
    if not norm > 0:
        raise ValueError("direction must be a non-zero vector")
    v = v / norm
    return lambda out: np.asarray(out, dtype=np.float64) @ v


def wavelet_lr_score(layout, canary_shift: np.ndarray) -> Score:
    """LR score for wavelet-domain Gaussian noise (std proportional to 1 / W_c on coefficient c, paper 002
    Alg. 1-2): sum_c W_c^2 HWT(output)_c HWT(shift)_c, where `shift` is what the canary adds to the output
    before noise. `layout` is a wavelet.WaveletLayout."""
    v = layout.forward(np.asarray(canary_shift, dtype=np.float64)) * layout.weights ** 2
    return lambda out: layout.forward(np.asarray(out, dtype=np.float64)) @ v


def wavelet_canary(layout, clip: float) -> np.ndarray:
    """The example gradient most visible through paper-mode wavelet noise (digest P1): a constant c on the
    first half of the largest segment, so that H_0 = d(n) = c/2 (both of weight m, all other coefficients
    0) and ||W (.) H|| = m ||H|| = m C with c chosen so that ||H||_2 = C. Under the sound calibration any
    vector is equally visible once clipped to ||W (.) H|| = C. `layout` is a wavelet.WaveletLayout."""
    if not clip > 0:
        raise ValueError(f"clip must be > 0, got {clip!r}")
    seg = int(np.argmax(layout.padded))
    start = int(sum(layout.segments[:seg]))
    m = layout.padded[seg]
    out = np.zeros(layout.length)
    if m == 1:
        out[start] = clip
    else:
        out[start:start + m // 2] = np.sqrt(2.0) * clip
    return out


def _draw(release: Release, rng: np.random.Generator, with_canary: bool, count: int, batched: bool) -> np.ndarray:
    if batched:
        out = np.asarray(release(rng, with_canary, count))
    else:
        out = np.stack([np.asarray(release(rng, with_canary)).reshape(-1) for _ in range(count)])
    if out.ndim != 2 or out.shape[0] != count:
        raise ValueError(f"release must return one vector per trial ([{count}, d]), got shape {out.shape}")
    return out


def _scores(release, rng, with_canary, trials, batched, score, chunk) -> np.ndarray:
    parts = []
    for start in range(0, trials, chunk):
        out = _draw(release, rng, with_canary, min(chunk, trials - start), batched)
        parts.append(np.asarray(score(out), dtype=np.float64).reshape(-1))
    return np.concatenate(parts)


def _pilot_score(release, rng, pilot, batched) -> Score:
    """Estimated LR direction for independent coordinates: (mean_with - mean_without) / pooled variance."""
    without = _draw(release, rng, False, pilot, batched).astype(np.float64)
    with_ = _draw(release, rng, True, pilot, batched).astype(np.float64)
    var = 0.5 * (without.var(axis=0, ddof=1) + with_.var(axis=0, ddof=1))
    diff = with_.mean(axis=0) - without.mean(axis=0)
    v = diff / np.maximum(var, np.finfo(np.float64).tiny)
    if not np.any(v):
        v = np.ones_like(v)
    return projection_score(v)


def audit_release(release: Release, rng: np.random.Generator, *, trials: int = 4000, delta: float = 1e-5,
                  epsilon_claimed: float | None = None, score: Score | None = None, pilot: int = 500,
                  fit_fraction: float = 0.5, confidence: float = 0.95, batched: bool = False, chunk: int = 500,
                  label: str = "") -> AuditResult:
    """Audit one release. `release(rng, with_canary)` returns the released vector of one trial (or, with
    batched=True, `release(rng, with_canary, count)` returns [count, d]); `trials` trials per hypothesis.

    `score` maps [T, d] outputs to [T] scores (projection_score, wavelet_lr_score, or your own); without
    one, `pilot` extra trials per hypothesis estimate the LR direction and are then discarded. The first
    `fit_fraction` of the trials choose the threshold, the rest give the bound."""
    _check_delta_confidence(delta, confidence)
    if not (isinstance(trials, (int, np.integer)) and trials >= 4):
        raise ValueError(f"trials must be an integer >= 4, got {trials!r}")
    if not 0 < fit_fraction < 1:
        raise ValueError(f"fit_fraction must be in (0, 1), got {fit_fraction!r}")
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk!r}")
    pilot_rng, rng_without, rng_with = rng.spawn(3)
    if score is None:
        if pilot < 2:
            raise ValueError(f"pilot must be >= 2 when no score is given, got {pilot!r}")
        score = _pilot_score(release, pilot_rng, pilot, batched)
    neg = _scores(release, rng_without, False, trials, batched, score, chunk)
    pos = _scores(release, rng_with, True, trials, batched, score, chunk)

    fit = max(1, min(trials - 1, int(round(fit_fraction * trials))))
    best = None
    for above, sign in ((True, 1.0), (False, -1.0)):
        thresholds, eps = _sweep(sign * neg[:fit], sign * pos[:fit], delta, confidence)
        top = np.flatnonzero(eps >= eps.max())
        lo, hi = top[0], top[-1]
        # every t in (thresholds[lo - 1], thresholds[hi]] scores alike on the fit trials: take the middle of
        # that gap rather than its edge, which the held-out trials would cross by chance
        t = 0.5 * (thresholds[lo - 1] + thresholds[hi]) if lo > 0 else thresholds[lo]
        if best is None or eps[lo] > best[0]:
            best = (eps[lo], float(sign * t), above)
    _, threshold, above = best
    held_neg, held_pos = neg[fit:], pos[fit:]
    fp, fn = _counts(held_neg, held_pos, threshold, above)
    alpha = 1.0 - confidence
    bound = float(epsilon_lower_bound(fp, len(held_neg), fn, len(held_pos), delta, confidence))
    return AuditResult(
        epsilon_lower=bound, epsilon_claimed=epsilon_claimed, delta=delta, confidence=confidence,
        threshold=threshold, guess_canary_above=above, false_positives=fp, false_negatives=fn,
        negatives=len(held_neg), positives=len(held_pos),
        fpr_upper=float(clopper_pearson_upper(fp, len(held_neg), alpha)),
        fnr_upper=float(clopper_pearson_upper(fn, len(held_pos), alpha)),
        scores_without=neg, scores_with=pos, label=label)


def max_provable_epsilon(held_out: int, delta: float = 1e-5, confidence: float = 0.95) -> float:
    """The largest bound `held_out` trials per hypothesis can give (a perfect test: no errors at all)."""
    return float(epsilon_lower_bound(0, held_out, 0, held_out, delta, confidence))


def plot_scores(result: AuditResult, path, title: str | None = None, bins: int = 60) -> None:
    """Histograms of the two score distributions with the chosen threshold, written as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    lo = min(result.scores_without.min(), result.scores_with.min())
    hi = max(result.scores_without.max(), result.scores_with.max())
    edges = np.linspace(lo, hi if hi > lo else lo + 1.0, bins + 1)
    ax.hist(result.scores_without, bins=edges, alpha=0.6, label="without canary", color="tab:blue")
    ax.hist(result.scores_with, bins=edges, alpha=0.6, label="with canary", color="tab:orange")
    ax.axvline(result.threshold, color="black", linestyle="--", linewidth=1, label="threshold")
    claim = "n/a" if result.epsilon_claimed is None else f"{result.epsilon_claimed:.3g}"
    ax.set_title(title or f"{result.label}  eps_lower={result.epsilon_lower:.3g} (claimed {claim})", fontsize=9)
    ax.set_xlabel("score")
    ax.set_ylabel("trials")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
