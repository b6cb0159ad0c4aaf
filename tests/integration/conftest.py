import os
import secrets

import pytest

# The run's join secret (common/session.py): every Testbed of this session hands it to its processes, and the raw
# clients that play insiders (a compromised device or edge holds it) send it; outsiders do not.
os.environ.setdefault("HFL_JOIN_SECRET", secrets.token_hex(16))

# Small, fast runs on the embedded MNIST subset: 2 edges x 3 devices.
SMALL = ["topology.edges=2", "topology.devices_per_edge=3", "train.tau=2", "train.gamma=5", "run.rounds=3",
         "net.phase_timeout_s=60", "net.join_timeout_s=120"]


def pytest_collection_modifyitems(items):
    for item in items:
        if "/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
