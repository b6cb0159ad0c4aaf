"""A test plugin: H2FDP's schedule and privacy in the sign-vote round mode of examples/sign_vote_mode.py (which must
be loaded first): a private run whose edges settle by `SignVoteEdge.combine`."""
import dataclasses

from hfl.common import plans
from hfl.common.privacy import algorithms  # noqa: F401 - registers h2fdp

plans.ALGORITHMS.register("h2fdp-signvote", dataclasses.replace(plans.ALGORITHMS.get("h2fdp"), name="h2fdp-signvote",
                                                                mode="signvote"))
