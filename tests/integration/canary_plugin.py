"""A plugin that leaves a trace: each process that imports it writes a file named after its pid into
$HFL_CANARY_DIR, so a test sees which nodes ran it."""
import os
import pathlib

if os.environ.get("HFL_CANARY_DIR"):
    (pathlib.Path(os.environ["HFL_CANARY_DIR"]) / str(os.getpid())).write_text("imported")
