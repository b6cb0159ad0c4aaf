"""Watching a running testbed: the cloud's live page, Prometheus /metrics on the cloud and every edge (live.py),
served by a small read-only HTTP server on the services' own event loop (http.py)."""
