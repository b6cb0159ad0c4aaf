"""A device host's credential covers its own device ids only (common/session.py)."""
import grpc
import pytest

from hfl.common import session
from hfl.common.wire import WireError


class Context:
    def __init__(self, **metadata):
        self.metadata = tuple(metadata.items())

    def invocation_metadata(self):
        return self.metadata


@pytest.fixture
def secret(monkeypatch):
    monkeypatch.setenv(session.JOIN_ENV, "run-secret")
    return "run-secret"


def test_a_host_token_admits_its_own_range_only(secret):
    token = session.host_token(secret, 3, 5)
    assert session.token_range(secret, token) == (3, 5)
    for node in ("dev-00003", "dev-00004", "dev-00005"):
        session.check_join(Context(**{session.HOST_KEY: token}), node)
    for node in ("dev-00002", "dev-00006", "edge-000"):
        with pytest.raises(WireError) as err:
            session.check_join(Context(**{session.HOST_KEY: token}), node)
        assert err.value.code == grpc.StatusCode.PERMISSION_DENIED and "dev-00003..dev-00005" in str(err.value)


def test_a_forged_or_widened_token_is_refused(secret):
    token = session.host_token(secret, 3, 5)
    widened = "0-99." + token.split(".")[1]
    for bad in (widened, session.host_token("other-secret", 0, 99), "0-99", "x-y." + "0" * 64, ""):
        assert session.token_range(secret, bad) is None
    with pytest.raises(WireError) as err:
        session.check_join(Context(**{session.HOST_KEY: widened}), "dev-00050")
    assert err.value.reason == "bad_join" and "not the run's" in str(err.value)


def test_the_join_secret_still_admits_any_id_and_nothing_admits_without_it(secret):
    session.check_join(Context(**{session.JOIN_KEY: secret}), "dev-00050")
    with pytest.raises(WireError):
        session.check_join(Context(), "dev-00050")
    with pytest.raises(ValueError):
        session.host_token(secret, 5, 3)


def test_a_host_sends_its_token_instead_of_the_join_secret(secret, monkeypatch):
    assert session.join_metadata() == ((session.JOIN_KEY, secret),)
    monkeypatch.setenv(session.HOST_ENV, "0-4.abc")
    assert session.join_metadata() == ((session.HOST_KEY, "0-4.abc"),)


def test_hfl_host_token_prints_a_hosts_credential(secret, capsys):
    from hfl.cli import main

    assert main(["host-token", "dev-00002..dev-00004"]) == 0
    token = capsys.readouterr().out.strip()
    assert session.token_range(secret, token) == (2, 4)
    assert main(["host-token", "dev-9..x"]) == 2 and "bad device id" in capsys.readouterr().err
