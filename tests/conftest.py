"""Two tiers. `python -m pytest` with no paths and no -m is the developer's loop: unit tests plus the real-process
tests marked `fast` (one per round mode); `python -m pytest --full` (the README's test command, .ci/run) runs every
test, real-process integration and Docker e2e included. Naming test files or a marker expression runs what is named."""
import pytest

from hfl import families  # noqa: F401  (the suite is an entry point: the built-in families, as `hfl` has them)


def pytest_addoption(parser):
    parser.addoption("--full", action="store_true",
                     help="run every test: all real-process integration tests and the Docker e2e tests")


def _fast_tier(config) -> bool:
    if config.getoption("--full") or config.option.markexpr or config.option.keyword:
        return False
    return config.args_source == pytest.Config.ArgsSource.TESTPATHS  # no paths named on the command line


def _worker_group(nodeid: str) -> str:
    """Under pytest-xdist (`--dist loadgroup`, the README's test command) a file's tests stay on one worker, so its
    module-scoped testbeds start once, and the Docker tests share one worker, so one engine and one image serve them."""
    return "docker" if nodeid.startswith("tests/e2e/") else nodeid.split("::")[0]


class _WorkerGroups:
    @pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups
    def pytest_collection_modifyitems(self, items):
        for item in items:
            item.add_marker(pytest.mark.xdist_group(_worker_group(item.nodeid)))


def pytest_configure(config):
    config.pluginmanager.register(_WorkerGroups(), "hfl-worker-groups")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    if not _fast_tier(config):
        return
    skip = pytest.mark.skip(reason="full tier: `python -m pytest --full` (the README's test command) runs it")
    for item in items:
        path = str(item.fspath)
        if ("/integration/" in path or "/e2e/" in path) and not item.get_closest_marker("fast"):
            item.add_marker(skip)
