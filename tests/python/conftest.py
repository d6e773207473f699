"""Shared fixtures: the package under test and, when present, the reference."""

import importlib.util
import os
import pathlib
import sys

import pytest

import hang_report
import server_harness

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
REFERENCE_DIR = pathlib.Path(os.environ.get("EPD_REFERENCE_DIR", REPO_ROOT.parent / "shared" / "reference"))


def _load(name):
    path = REFERENCE_DIR / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"epd_reference_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses needs the module registered
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def reference():
    """The reference modules, as a namespace; skips when ../shared is absent."""
    if not (REFERENCE_DIR / "embedding_cache.py").is_file():
        pytest.skip(
            f"reference not found at {REFERENCE_DIR} (a fresh clone has no ../shared/reference); "
            "set EPD_REFERENCE_DIR to run the parity tests"
        )

    class Ref:
        cache = _load("embedding_cache")
        scheduler = _load("encode_scheduler")

    return Ref


def pytest_configure(config):
    # Under ctest ($EPD_TEST_TIMEOUT_S): the Python stacks of every thread and
    # the thread stacks of every process the tests started go to stderr
    # before ctest's timeout, so a hang says who waits on what.
    hang_report.arm_from_env()


# A failing test gets the stderr of every `epd-encode serve` it started
# (server_harness.start_server) as a section of its report, with each
# server's exit status: a server that died under the test (a crash, a
# sanitizer report) says why there, instead of only "Socket closed" in the
# client.
@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.epd_first_server = len(server_harness.STARTED)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    for proc in server_harness.STARTED[getattr(item, "epd_first_server", 0):]:
        status = proc.poll()
        state = "running" if status is None else f"exit status {status}"
        report.sections.append((f"epd-encode serve pid {proc.pid} ({state}) stderr",
                                server_harness.server_stderr(proc)))
