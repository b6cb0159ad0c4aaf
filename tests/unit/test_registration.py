"""The registration decision (common/session.Sessions) and a session's presence (common/service_base.Liveness): a
Register that repeats the live session's nonce gets its token again (its reply was lost on the way), any other is
refused while the session lives, and a session whose node opened no Presence stream ends after the deadline."""
import asyncio

import grpc
import pytest

from hfl.common import session, wire
from hfl.common.service_base import Liveness


def refused(sessions: session.Sessions, node: str, nonce: bytes) -> str:
    with pytest.raises(wire.WireError) as err:
        sessions.issue(node, nonce)
    assert err.value.code == grpc.StatusCode.ALREADY_EXISTS
    return err.value.reason


def test_the_same_nonce_gets_the_live_sessions_token_again():
    sessions, nonce = session.Sessions(), session.new_nonce()
    token = sessions.issue("edge-000", nonce)
    assert sessions.issue("edge-000", nonce) == token
    assert sessions.issue("edge-000", bytes(nonce)) == token  # equal bytes, not the same object


def test_another_nonce_or_none_is_refused_while_the_session_lives():
    sessions, nonce = session.Sessions(), session.new_nonce()
    token = sessions.issue("edge-000", nonce)
    other = bytes([nonce[0] ^ 1]) + nonce[1:]  # one bit off
    assert refused(sessions, "edge-000", other) == "already_registered"
    assert refused(sessions, "edge-000", b"") == "already_registered"
    assert sessions.issue("edge-000", nonce) == token  # the refusals changed nothing


def test_a_session_registered_without_a_nonce_is_never_replayed():
    sessions = session.Sessions()
    sessions.issue("dev-00001")
    assert refused(sessions, "dev-00001", b"") == "already_registered"
    assert refused(sessions, "dev-00001", session.new_nonce()) == "already_registered"


def test_after_the_session_ends_a_register_opens_a_new_one_whatever_its_nonce():
    sessions, nonce = session.Sessions(), session.new_nonce()
    first = sessions.issue("edge-000", nonce)
    assert sessions.end("edge-000", first)
    second = sessions.issue("edge-000", nonce)
    assert second != first
    assert sessions.end("edge-000", second)
    third = sessions.issue("edge-000", session.new_nonce())  # a restarted node: a new nonce, a new session
    assert third not in (first, second)
    assert refused(sessions, "edge-000", nonce) == "already_registered"  # the old nonce is not the live session's


def test_nonces_are_random_and_sized():
    nonces = {session.new_nonce() for _ in range(1000)}
    assert len(nonces) == 1000 and {len(n) for n in nonces} == {session.NONCE_BYTES}
    session.check_nonce(b"")
    session.check_nonce(b"\0" * session.NONCE_BYTES)
    for size in (1, session.NONCE_BYTES - 1, session.NONCE_BYTES + 1, 1 << 20):
        with pytest.raises(wire.WireError) as err:
            session.check_nonce(b"x" * size)
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and err.value.reason == "bad_register"
        assert len(str(err.value)) < 100


def test_a_replayed_register_changes_nothing_but_a_new_session_counts_a_rejoin():
    async def go():
        live, nonce = Liveness(30.0), session.new_nonce()
        token = live.registered("dev-00000", nonce)
        live.attach(token)
        assert live.registered("dev-00000", nonce) == token
        assert live.rejoins["dev-00000"] == 0 and not live.returned
        live.detach("dev-00000", token, "killed")
        assert "dev-00000" in live.lost and not live.sessions.has("dev-00000")
        again = live.registered("dev-00000", nonce)
        assert again != token and live.rejoins["dev-00000"] == 1 and live.returned == {"dev-00000"}
        assert live.registered("dev-00000", nonce) == again and live.rejoins["dev-00000"] == 1
    asyncio.run(go())


def test_a_session_without_a_presence_stream_ends_at_the_deadline():
    async def go():
        live, nonce = Liveness(30.0, presence_s=2.0), session.new_nonce()  # margins of 0.6 s or more for a loaded host
        token = live.registered("edge-000", nonce)
        await asyncio.sleep(1.0)
        assert live.registered("edge-000", nonce) == token  # a retry re-arms the deadline
        await asyncio.sleep(1.4)
        assert live.sessions.has("edge-000")  # 2.4 s after the first Register, 1.4 s after the retry
        await asyncio.sleep(1.0)
        assert not live.sessions.has("edge-000") and "edge-000" in live.lost
        assert live.registered("edge-000", session.new_nonce()) != token  # and anyone holding the node's id may register
    asyncio.run(go())


def test_a_session_with_a_presence_stream_outlives_the_deadline():
    async def go():
        live = Liveness(30.0, presence_s=0.05)
        token = live.registered("edge-000", session.new_nonce())
        live.attach(token)
        await asyncio.sleep(0.2)
        assert live.sessions.has("edge-000") and not live.lost
    asyncio.run(go())


def test_the_last_presence_stream_of_a_session_ends_it_unless_the_run_is_over():
    async def go():
        live, nonce = Liveness(30.0), session.new_nonce()
        token = live.registered("dev-00003", nonce)
        live.attach(token)
        live.attach(token)  # a retried Register's stream beside the first one, still closing
        assert not live.detach("dev-00003", token, "presence stream closed")
        assert live.sessions.has("dev-00003")
        assert live.detach("dev-00003", token, "presence stream closed")
        assert not live.sessions.has("dev-00003") and not live.streams
        other = live.registered("dev-00004")
        live.attach(other)
        assert not live.detach("dev-00004", other, None) and live.sessions.has("dev-00004")
        stale = live.registered("dev-00003", nonce)
        live.attach(token)  # a stream of the ended session (authenticated before it ended) ends after a new one began
        assert not live.detach("dev-00003", token, "presence stream closed") and live.sessions.has("dev-00003")
        assert stale != token
    asyncio.run(go())
