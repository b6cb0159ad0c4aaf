"""A hostile pipeline stage for tests: every upload scaled by `factor` (finite, absurd): the cloud's last line of
defence (aggregation.max_update_ratio) must refuse the aggregate and keep the previous model."""
import numpy as np

from hfl.common.pipeline import VECTOR_STAGES


@VECTOR_STAGES.register("explode")
def explode(vec: np.ndarray, rng: np.random.Generator, factor: float = 1e20) -> np.ndarray:
    return (vec.astype(np.float64) * factor).astype(np.float32)
