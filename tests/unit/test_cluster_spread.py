"""The spread run's interrupt path without a cluster (hfl/cluster_spread.py; the real run is in
tests/integration/test_cluster.py)."""
import os
import signal
import threading
import time

import pytest

from hfl.cluster_spread import interrupted, interrupts


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_is_remembered_even_where_its_exception_is_dropped(sig):
    """Ray's calls run Python's signal handlers from inside and can drop the KeyboardInterrupt one raises: the run
    still stops at its next check, and the handlers it replaced are back afterwards."""
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with interrupts() as stop:
        assert not stop.is_set()
        interrupted(stop)  # nothing yet
        try:  # a library call that swallows the exception the handler raised
            os.kill(os.getpid(), sig)
            time.sleep(5)
        except KeyboardInterrupt:
            pass
        assert stop.is_set()
        with pytest.raises(KeyboardInterrupt):
            interrupted(stop)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_off_the_main_thread_nothing_is_installed():
    seen = {}

    def body():
        with interrupts() as stop:
            seen["handler"] = signal.getsignal(signal.SIGINT)
            seen["set"] = stop.is_set()

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert seen == {"handler": signal.getsignal(signal.SIGINT), "set": False}
