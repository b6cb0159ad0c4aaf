"""A device's uploads go to its edge framed on one Session stream per session, whether an upload fits one chunk or
takes many (net.chunk_kib): both give the same run, byte for byte in every round's results and traffic."""
from .mitm import Tamper
from .test_hardening import BASE, started

COLUMNS = ("round", "accuracy", "loss", "train_loss", "bytes_up", "bytes_down", "refused")


def run(hfl_testbed, overrides):
    with Tamper() as proxy:  # passes every call through: counts edge-000's device host's calls by method
        tb = started(hfl_testbed, overrides, {"devices-000-0": proxy})
        tb.wait(timeout=600)
    return [tuple(r[c] for c in COLUMNS) for r in tb.metrics()], proxy.calls


def test_one_chunk_and_many_chunk_uploads_give_the_same_run_on_the_session_stream(hfl_testbed):
    one, one_calls = run(hfl_testbed, BASE)  # mnist-cnn: 116 KB uploads in 1 MiB chunks
    streamed, streamed_calls = run(hfl_testbed, BASE + ["net.chunk_kib=4"])  # 29 chunks each
    assert one_calls["Session upload"] == streamed_calls["Session upload"] > 0, (one_calls, streamed_calls)
    # one stream per device and session (the proxy's host has the cluster's devices), never a call per upload
    assert 0 < one_calls["Session"] < one_calls["Session upload"], one_calls
    assert one_calls["ExchangeOne"] == one_calls["Exchange"] == streamed_calls["Exchange"] == 0, one_calls
    assert len(one) == 2 and one == streamed
