"""An example round mode from a plugin: no service file changes, only registrations.

"signvote": each edge settles its members' model deltas by a majority vote of their signs, scaled by the mean
absolute coordinate (signSGD with majority vote, Bernstein et al. 2019, on model deltas); devices and the cloud do
what they do in the digital mode. The algorithm "hierfavg-signvote" runs HierFAVG's schedule in this mode:

    hfl run --set run.plugins='["examples/sign_vote_mode.py"]' --set run.algorithm=hierfavg-signvote

A mode is one entry of common.modes.MODES; each tier registers its own class for it, and a tier that registers none
builds the class of the mode it is `like` (here the cloud's and the devices' digital classes). A tier's class gets
that tier's narrow ports and overrides what differs. Here the edge overrides `combine` alone: the edge's privacy (the
plan's clip before it, its noise after it) runs around it as in every mode.
"""
from __future__ import annotations

import numpy as np

from hfl.common import plans
from hfl.common.modes import MODES, Mode, register_tier
from hfl.edge_server.modes import DigitalEdge


def sign_vote(vectors: list[np.ndarray]) -> np.ndarray:
    """sign(sum_i sign(v_i)) * mean_i mean_j |v_ij|: the members' majority direction at their mean step size."""
    stacked = np.stack([np.asarray(v, np.float64) for v in vectors])
    return (np.sign(np.sign(stacked).sum(axis=0)) * np.abs(stacked).mean()).astype(np.float32)


class SignVoteEdge(DigitalEdge):
    def combine(self, vectors, weights):
        return sign_vote(vectors)


MODES.register("signvote", Mode("signvote", ("ideal",), "device -> edge model deltas, settled by a majority vote of "
                                "their signs", like="digital"))
register_tier("edge", "signvote", SignVoteEdge)
plans.ALGORITHMS.register("hierfavg-signvote", plans.Algorithm(
    "hierfavg-signvote", plans.hierfavg, "samples", "devices", "example plugin: HierFAVG with sign-vote edges",
    mode="signvote"))
