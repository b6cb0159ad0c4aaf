"""The edge's privacy around a round mode's `combine(vectors, weights)`, from the round plan's noise instructions: the
clip the plan has the edge enforce on every upload before it, the edge-tier noise on the aggregate after it (paper
000: the local and global streams of a trusted edge). DP-FedAvg's fixed-denominator sum is the registered
aggregator `fixed_denominator_sum`, named by the plan's denominator (paper 002, Eq. 4). An empty plan leaves
`combine` alone.

A mode supplies `combine` only; the release is not one of its methods, so overriding one cannot leave a step out,
and a mode that settles its phases another way is refused a plan asking for an edge release."""
from __future__ import annotations

import numpy as np

from hfl.common import plans
from hfl.common.pipeline import AGGREGATORS
from hfl.common.privacy import on_wire
from hfl.common.privacy.instructions import NoisePlan, NoisePlanError
from hfl.common.secret_random import dp_numpy_rng

FIXED_DENOMINATOR = "fixed_denominator"
FIXED_DENOMINATOR_AGGREGATOR = "fixed_denominator_sum"


class EdgeRelease:
    def __init__(self, noise: NoisePlan, cplan: dict, edge: str, index: int, dim: int, seed: int, noise_source: str):
        self.noise = noise
        self.denominator = cplan.get(FIXED_DENOMINATOR)
        self.edge, self.index, self.dim, self.seed, self.noise_source = edge, index, dim, seed, noise_source

    @property
    def always(self) -> bool:
        """Under Poisson client sampling an empty draw still releases noise: the accountant's subsampled mechanism
        is "sum of the drawn / fixed denominator + N", whatever was drawn."""
        return self.denominator is not None

    def edge_streams(self) -> set[str]:
        return {ins.stream for ins in self.noise.by_key.values() if ins.tier == "edge" or "edge" in ins.clip_at}

    def require(self, settles_itself: bool, mode_name: str) -> None:
        """Refuse a plan with an edge release for a mode that settles its phases without one (NoisePlanError)."""
        if settles_itself and (self.edge_streams() or self.always):
            raise NoisePlanError(f"round plan: an edge release (clip or noise of {sorted(self.edge_streams())}) for "
                                 f"round mode {mode_name}, which settles its phases without the edge's release")

    def __call__(self, combine, ctx, vectors: list[np.ndarray], weights: list, samples: list[int], nodes: list[str],
                 phase, step: int) -> np.ndarray:
        """The phase's aggregate as the plan states it: clip, combine (or the fixed-denominator sum), noise."""
        stream = on_wire.stream_of(ctx.plan, step)
        sync = phase.kind == plans.EDGE_MODEL_SYNC
        release = self.noise.get("edge", stream) if sync else None
        bound = self.noise.clip_for("edge", stream) if sync else None
        vectors = list(vectors)
        if bound is not None:
            for i, vec in enumerate(vectors):
                vectors[i], over = on_wire.enforce_clip(vec, bound)
                ctx.clipped += over
        if self.denominator is not None:  # sum_k p_k Delta_k, p_k = d_k / (q_c d)
            agg = AGGREGATORS.get(FIXED_DENOMINATOR_AGGREGATOR)(vectors, [s / self.denominator for s in samples]) \
                if vectors else np.zeros(self.dim, np.float32)
        else:
            agg = combine(vectors, weights)
        if release is not None:
            # a fresh draw per attempt: two releases sharing one noise draw would cancel it in their difference
            rng = dp_numpy_rng(self.noise_source, self.seed, "edge", self.index, ctx.round, step, "dp_noise",
                               ctx.attempt)
            agg, records = on_wire.edge_release(agg, release, rng, weights, len(ctx.participants), self.edge, nodes,
                                                ctx.round, mean=self.denominator is None)
            ctx.dp_records.extend(records)
        return agg
