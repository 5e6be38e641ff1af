"""The service's own call to an embedding endpoint (``EndpointCalls.embed``), without a
hub: the call path over an endpoint table (the standby's ``TableCalls``, the same
rules as the live one) to a real model server process on the exported
all-MiniLM-L6-v2, which demands the replicas' secret as a replica does.

The same call through a real hub's deployment is tests/deploy/test_embedding_endpoint.py.
"""

import json
import os

import numpy as np
import pytest
from support.model_server import ServerProcess

from gpulab.service.auth import Identity
from gpulab.service.endpoints.calls import CallRefused
from gpulab.service.endpoints.standby import TableCalls
from gpulab.serving.export import CARD_FILE

SECRET = "replica-secret"
ALICE, BOB = Identity("alice", "user"), Identity("bob", "user")


@pytest.fixture(scope="module")
def replica(minilm_dir):
    """The model server as a replica runs it: it answers only the replicas' secret."""
    os.environ["GPULAB_SERVING_TOKEN"] = SECRET  # read (and dropped) by the server at start
    try:
        proc = ServerProcess(minilm_dir, "--max-batch-size", "4")
    finally:
        del os.environ["GPULAB_SERVING_TOKEN"]
    try:
        proc.wait_listening()
        yield f"http://{proc.url}"
    finally:
        proc.stop()


class CardCalls(TableCalls):
    """The table's call path with the versions' cards at hand, as the live one has them."""

    def __init__(self, cards: dict):
        super().__init__()
        self.cards = cards

    def card(self, unit):
        return self.cards.get(unit.row["id"])


def table(address, name="minilm", dep_id="d1", shares=()):
    return {
        "id": dep_id,
        "user": "alice",
        "name": name,
        "share_users": list(shares),
        "share_groups": [],
        "state": "running",
        "message": "1/1 ready",
        "versions": [
            {
                "id": dep_id,
                "version": 1,
                "weight": 100,
                "state": "running",
                "message": "1/1 ready",
                "max_queue": 8,
                "replicas": 1,
                "max_batch_size": 4,
                "ready": [[0, address]],
                "token": SECRET,
            }
        ],
    }


async def test_embed_follows_the_call_rules_and_returns_unit_rows(replica, minilm_dir):
    with open(os.path.join(minilm_dir, CARD_FILE)) as f:
        card = json.load(f)
    calls = CardCalls({"d1": card, "d2": {**card, "kind": "torch-export"}})
    calls.load([table(replica, shares=["bob"]), table(replica, name="classifier", dep_id="d2")])
    try:
        texts = [f"sentence number {i}" for i in range(10)]  # 3 requests of at most 4
        rows = await calls.embed(BOB, "alice", "minilm", texts)  # shared with bob
        got = np.array(rows, dtype=np.float32)
        assert got.shape == (10, 384)
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
        (alone,) = await calls.embed(ALICE, "alice", "minilm", [texts[7]])
        np.testing.assert_allclose(got[7], alone, atol=1e-4)  # rows stay in order

        refusals = [
            (Identity("eve", "user"), "minilm", ["x"], 403, "not shared with you"),
            (ALICE, "nothing", ["x"], 404, "no deployment 'nothing'"),
            (ALICE, "classifier", ["x"], 400, "not an embedding endpoint"),
            (ALICE, "minilm", [], 400, "non-empty list of strings"),
            (ALICE, "minilm", ["ok", 3], 400, "non-empty list of strings"),
            # Refused by the replica itself: its status and its one line come back.
            (ALICE, "minilm", ["\ud800"], 400, "element 0 is not UTF-8 text"),
        ]
        for who, name, batch, status, message in refusals:
            with pytest.raises(CallRefused) as refused:
                await calls.embed(who, "alice", name, batch)
            assert refused.value.status == status and message in str(refused.value)
            assert "\n" not in str(refused.value)
    finally:
        await calls.proxy.close()
