"""A ledger over two simulated A100s in a SQLite file of the test's own."""

import pytest

from gpulab.db.engine import make_engine
from gpulab.scheduler.inventory import parse_simulated
from gpulab.scheduler.ledger import Ledger
from gpulab.scheduler.policy import get_policy


@pytest.fixture
def ledger(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path}/ledger.sqlite")
    ledger = Ledger(engine, parse_simulated("2xA100-80GB", node="n1"), get_policy("best-fit"))
    yield ledger
    ledger.aio.close()
    engine.dispose()
