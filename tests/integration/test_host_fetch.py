"""A device host fetches each round's task once per edge for all its devices of that edge (net.host_fetch, the
default): the same run, byte for byte in every round's results and traffic, as each device fetching its own, with
one fetch a round where each device made its own."""
from .test_hardening import BASE
from .test_session_stream import COLUMNS, run

DEVICES = 3  # the proxied host's devices: every device of edge-000 (SMALL's devices_per_edge)
ROUNDS = 2


def test_a_host_fetches_each_round_once_for_its_devices_and_the_run_is_the_same(hfl_testbed):
    shared, shared_calls = run(hfl_testbed, BASE)
    alone, alone_calls = run(hfl_testbed, BASE + ["net.host_fetch=false"])
    assert len(shared) == ROUNDS and shared == alone, COLUMNS
    assert alone_calls["FetchRound"] == DEVICES * (ROUNDS + 1), alone_calls  # each device: each round and the end
    # one a round and the end, and at most one more for each device that registered after the first call was sent
    assert ROUNDS + 1 <= shared_calls["FetchRound"] <= ROUNDS + DEVICES, shared_calls
