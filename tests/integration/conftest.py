import secrets

import pytest


@pytest.fixture(autouse=True)
def join_secret(monkeypatch):
    """The run's join secret (common/session.py) for this test only: its Testbeds hand it to their processes, and the
    raw clients that play insiders (a compromised device or edge holds it) send it; outsiders do not. Scoped to each
    integration test, so that other suites (tests/e2e's compose runs) never inherit it."""
    secret = secrets.token_hex(16)
    monkeypatch.setenv("HFL_JOIN_SECRET", secret)
    return secret


# Small, fast runs on the embedded MNIST subset: 2 edges x 3 devices.
SMALL = ["topology.edges=2", "topology.devices_per_edge=3", "train.tau=2", "train.gamma=5", "run.rounds=3",
         "net.phase_timeout_s=60", "net.join_timeout_s=120"]


def pytest_collection_modifyitems(items):
    for item in items:
        if "/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
