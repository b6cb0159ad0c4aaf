"""Imported by the node forkserver (hfl/node_spawn.py PRELOAD): matplotlib with its file-only backend, so that the
cloud's plots at the end of a run (accuracy.png, data.png, a mode's own) do not pay the ~1 s import on the run's
critical path; every node forked after it finds the module loaded."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot  # noqa: E402,F401
