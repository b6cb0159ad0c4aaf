"""Give the C heap's free pages back to the system now and then (glibc's malloc_trim).

A device host's devices receive a model-sized message each at nearly the same moment, and an edge its members'
uploads; gRPC, protobuf and numpy free those buffers within milliseconds, but glibc keeps the freed chunks in its
arenas (past its first large free, its dynamic mmap threshold serves them from the heap), so without this a node's
resident memory is the peak of its past transient buffers. malloc_trim(0) returns every arena's free pages; what
training frees and takes again within a second is faulted in once a second, not once a step (a fixed
MALLOC_MMAP_THRESHOLD_ of 64 KiB returns them too, but costs 70% more CPU per local epoch on mnist-cnn).

That holds only if glibc itself does not return them sooner: by default a freed array of a few MB is mapped afresh
at its next allocation (below the dynamic mmap threshold's first raise) or given back when the heap's top grows past
twice it (the dynamic trim threshold), and every new array of that size then pays ~1 page fault per 4 KiB: numpy
code over model-sized vectors (QSGD's encode, its expected error, the measured distortion at d = 467,818) ran ~3x
slower than with its buffers kept. `configure` fixes the mmap threshold at glibc's largest (32 MiB) and the trim
threshold at 64 MiB, the highest glibc's dynamic one reaches by itself: those buffers stay in the heap between the
trims this module runs, and the top of a thread's arena (which malloc_trim does not shrink) holds at most what it
could under glibc's own thresholds."""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading

log = logging.getLogger(__name__)

INTERVAL_S = 1.0


def _libc():
    """glibc, or None (another C library: nothing to tune or trim)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def _libc_trim():
    """glibc's malloc_trim, or None (another C library: nothing to do)."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)
MMAP_THRESHOLD = 32 << 20  # glibc's maximum (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD = 64 << 20


def configure() -> bool:
    """Keep freed buffers in the heap until the next trim (see above); True where glibc took it."""
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def trim_now() -> bool:
    """Return the heap's free pages now; True where glibc released any."""
    trim = _libc_trim()
    return bool(trim and trim(0))


def start_trimming(interval_s: float = INTERVAL_S) -> threading.Event | None:
    """A daemon thread that trims every `interval_s` (and `configure`d thresholds, so that the trims are what returns
    the heap's free pages); set the returned event to stop it (None: no glibc)."""
    trim = _libc_trim()
    if trim is None:
        log.debug("no malloc_trim in this C library: the heap keeps its free pages")
        return None
    configure()
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval_s):
            trim(0)

    threading.Thread(target=loop, name="heap-trim", daemon=True).start()
    return stop
