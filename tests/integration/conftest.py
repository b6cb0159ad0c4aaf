import pytest

# Small, fast runs on the embedded MNIST subset: 2 edges x 3 devices.
SMALL = ["topology.edges=2", "topology.devices_per_edge=3", "train.tau=2", "train.gamma=5", "run.rounds=3",
         "net.phase_timeout_s=60", "net.join_timeout_s=120"]


def pytest_collection_modifyitems(items):
    for item in items:
        if "/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
