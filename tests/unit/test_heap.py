"""common/heap.py: the C heap's free pages go back to the system (glibc's malloc_trim), at once or from the nodes'
trimming thread, where glibc alone would keep them resident."""
import json
import subprocess
import sys

import pytest

PROBE = """
import json, sys, time
import numpy as np
import psutil
from hfl.common import heap

def rss():
    return psutil.Process().memory_info().rss / 2 ** 20

big = np.ones(4 << 20, np.uint8)  # freed: glibc's dynamic thresholds rise, 116 KB buffers now come from the heap
del big
buffers, kept = [], []
for _ in range(400):  # a host's devices' messages, all in flight at once, between allocations that live on
    buffers.append(np.ones(116 << 10, np.uint8))
    kept.append(bytearray(4096))
del buffers  # holes inside the heap: glibc trims only its top by itself
freed = rss()
if sys.argv[1] == "now":
    heap.trim_now()
elif sys.argv[1] == "thread":
    heap.start_trimming(0.2)
    time.sleep(1.0)
print(json.dumps({"freed": freed, "after": rss()}))
"""


def _probe(how: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, how], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


@pytest.mark.parametrize("how", ["now", "thread"])
def test_freed_buffers_leave_the_resident_set(how):
    kept, trimmed = _probe("none"), _probe(how)
    assert kept["freed"] - kept["after"] < 5  # glibc alone keeps the 45 MiB of freed buffers resident
    assert trimmed["freed"] - trimmed["after"] > 30, trimmed


FAULTS = """
import json, resource, sys
import numpy as np
from hfl.common import heap

if sys.argv[1] == "configured":
    assert heap.configure()

def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

def step():  # what numpy code over a model-sized vector does: a few fresh 3.7 MB temporaries, then frees them
    parts = [np.ones(467_818) for _ in range(4)]
    return sum(float(p[-1]) for p in parts)

for _ in range(3):
    step()
before = faults()
for _ in range(20):
    step()
print(json.dumps({"faults_per_step": (faults() - before) / 20}))
"""


def test_configured_heap_keeps_model_sized_buffers_between_trims():
    """glibc by default gives a freed run of model-sized buffers back as soon as the heap's top passes its dynamic
    trim threshold, so every step faults them in again (~900 pages per 3.7 MB array); configured, the node's own
    once-a-second trim is what returns them, and a step reuses them without a fault."""
    runs = {}
    for how in ("default", "configured"):
        out = subprocess.run([sys.executable, "-c", FAULTS, how], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        runs[how] = json.loads(out.stdout)["faults_per_step"]
    assert runs["default"] > 1000, runs
    assert runs["configured"] < 50, runs
