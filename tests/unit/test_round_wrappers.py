"""A wrapper around the cloud's round mode (privacy, control) hands on every call the mode answers: a call it lacks
fails only in the runs that wrap (a private run's checkpoint once did)."""
import inspect

from hfl.cloud_server.modes import DigitalCloud
from hfl.cloud_server.round_wrappers import ModeWrapper


def test_every_public_call_of_a_mode_is_handed_on():
    public = {n for n, _ in inspect.getmembers(DigitalCloud) if not n.startswith("_")}
    missing = sorted(n for n in public if not hasattr(ModeWrapper, n))
    assert not missing, f"ModeWrapper does not hand on {missing}"
