"""Imported last by the node forkserver (hfl/node_spawn.py PRELOAD), for its side effect: every object the preload
created moves to the collector's permanent generation (gc.freeze), so a forked node's collections never traverse
them, never write their headers, and leave the pages it shares with the forkserver shared."""
import gc

gc.collect()
gc.freeze()
