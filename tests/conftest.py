import os
import sys

import pytest

# Make the test helpers in this folder importable as plain modules.
sys.path.insert(0, os.path.dirname(__file__))

from pg import postgres_server  # noqa: E402


@pytest.fixture(scope="session")
def postgres_url():
    """A real PostgreSQL server for the whole session."""
    with postgres_server() as url:
        yield url


@pytest.fixture(scope="session")
def artifacts_dir():
    """Where tests keep what a person would look at (screenshots)."""
    path = os.environ.get("GPULAB_TEST_ARTIFACTS") or os.path.join(
        os.path.dirname(__file__), "artifacts")
    os.makedirs(path, exist_ok=True)
    return path
