"""Shared fixtures: the package under test and, when present, the reference."""

import importlib.util
import os
import pathlib
import sys

import pytest

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
