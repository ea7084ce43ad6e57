from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Iterator

import openai
import pytest

from switchyard.backends.embedded.threads import choose_wait_policy
from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.fakes.openai_upstream import FakeBehaviour, FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread

# The tests' processes run engines in-process: the OpenMP wait policy `switchyard serve` chooses
# (backends/embedded/threads.py), chosen before a test module imports torch, so that they run as
# users' processes do and do not spin against each other on a busy machine (nothing above imports it).
choose_wait_policy()

# Real servers from wheels, started on first use: Valkey (`valkey`, `valkey_session`) and PostgreSQL
# (`postgres_server`, `postgres_url`, and `database_url`: a fresh database of each dialect).
pytest_plugins = ["tests.servers.valkey", "tests.servers.postgres"]


@pytest.fixture
def fake_state() -> FakeState:
    return FakeState(behaviour=FakeBehaviour())


@pytest.fixture
def fake_upstream(fake_state: FakeState) -> Iterator[str]:
    """Base URL (ending in /v1) of a fake OpenAI-compatible server."""
    with serve_in_thread(FakeOpenAIUpstream(fake_state)) as url:
        yield url + "/v1"


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def proxy_settings(models: list[dict], **overrides) -> Settings:
    return Settings(models=models, **overrides)


@pytest.fixture
def proxy_url(fake_upstream: str) -> Iterator[str]:
    """Base URL (ending in /v1) of a Switchyard proxy in front of the fake upstream."""
    settings = proxy_settings(
        [
            {
                "name": "fake-small",
                "backend": "openai",
                "base_url": fake_upstream,
                "api_key": "dummy",
                "tier": "small",
                "context_window": 2048,
            },
            {"name": "fake-impatient", "base_url": fake_upstream, "read_timeout_s": 0.3},
            {"name": "fake-down", "base_url": f"http://127.0.0.1:{closed_port()}/v1"},
        ],
        server={"max_body_bytes": 64 * 1024},
        # generous for what must succeed on a busy machine; `fake-impatient` is the one that times out
        upstream={"read_timeout_s": 30.0, "health_interval_s": 0.5, "health_timeout_s": 30.0},
    )
    with serve_in_thread(create_app(settings)) as url:
        yield url + "/v1"


@pytest.fixture
def client(proxy_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=proxy_url, api_key="sk-test", max_retries=0) as sdk:
        yield sdk


@pytest.fixture
async def aclient(proxy_url: str) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=proxy_url, api_key="sk-test", max_retries=0) as sdk:
        yield sdk


def pytest_configure(config) -> None:
    """Keep every proxy a test starts from writing its usage ledger into the home directory, and the
    built-in default config from the provider keys of the shell that runs the tests (it would add
    commercial tiers that reach the real provider)."""
    import os
    import tempfile

    from switchyard.backends.provider_tiers import PROVIDERS

    os.environ.setdefault(
        "SWITCHYARD__BILLING__LEDGER_PATH", os.path.join(tempfile.mkdtemp(prefix="switchyard-tests-"), "usage.db")
    )
    for provider in PROVIDERS:
        os.environ.pop(provider.key_variable, None)
        os.environ.pop(provider.base_url_variable, None)


def pytest_collection_modifyitems(items) -> None:
    """The files with tests marked slow first (the models, the classifier, the long fault scenarios),
    each keeping the random order pytest-randomly gave it: the workers take files in this order, so
    the longest ones start early instead of one of them running alone at the end. A stable sort on
    top of the shuffle, so the order is still reproducible from the seed."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)


_WORKER_LEAKS: list[str] = []  # on the controller, when the suite runs on pytest-xdist workers


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """An xdist worker is done: keep the leaks it found, so that the run fails on them here."""
    _WORKER_LEAKS.extend(f"{node.gateway.id}: {leak}" for leak in getattr(node, "workeroutput", {}).get("leaks", ()))


def pytest_sessionfinish(session, exitstatus) -> None:
    """Leaks fail the run: an object that warns when collected (ResourceWarning: an unclosed socket,
    file or session), or an aiohttp session still open at the end (one kept alive by a module, like
    LiteLLM's clients, would only warn at interpreter exit, after the verdict). On an xdist worker
    they are handed to the controller, which fails the run."""
    leaks = _leaks_left_open()
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["leaks"] = leaks
        return
    leaks += _WORKER_LEAKS
    if leaks:
        session.config.get_terminal_writer().line("\nresources left open by the test run:\n  " + "\n  ".join(leaks))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _leaks_left_open() -> list[str]:
    import gc
    import sys
    import warnings

    import aiohttp

    leaks: list[str] = []
    previous_hook = sys.unraisablehook
    sys.unraisablehook = lambda unraisable: leaks.append(f"{unraisable.exc_value!r} in {unraisable.object!r}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", ResourceWarning)
            gc.collect()
    finally:
        sys.unraisablehook = previous_hook
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # type(), not isinstance(): the latter reads `__class__`, which some lazy module proxies warn on
        leaks += [f"open {obj!r}" for obj in gc.get_objects() if type(obj) is aiohttp.ClientSession and not obj.closed]
    return leaks


def pytest_runtest_logreport(report) -> None:
    _note_skip(report)


def pytest_collectreport(report) -> None:
    _note_skip(report)


def _note_skip(report) -> None:
    """Keep a skipped test's reason where `make test`'s summary reads it (tests/run_summary.py): every
    run of the command, and each xdist worker, appends to the one file SWITCHYARD_TEST_SKIPS names."""
    import json
    import os

    path = os.environ.get("SWITCHYARD_TEST_SKIPS")
    if not path or not report.skipped or getattr(report, "wasxfail", None) is not None:
        return
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    line = json.dumps({"nodeid": report.nodeid, "reason": reason.removeprefix("Skipped: ")}) + "\n"
    with open(path, "a", encoding="utf-8") as file:
        file.write(line)
