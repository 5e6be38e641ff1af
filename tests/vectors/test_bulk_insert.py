"""Many rows at once from a notebook: ``Collection.insert`` of a DataFrame, a list of
dicts, a Parquet file and a JSON Lines file, in batches with a progress bar, against
the real service and engine; every row is found with its metadata."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pandas as pd
import pytest
from hubproc import let_accounts_reach
from support.service import running_service

pytestmark = pytest.mark.slow

DIM = 8


def unit_vectors(n: int, seed: int = 0) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=(n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


async def test_rows_from_a_frame_a_list_and_files_go_in_in_batches(tmp_path, monkeypatch, capsys):
    from gpulab.client import Client, Collection
    from gpulab.client.errors import BadRequest

    let_accounts_reach(tmp_path)
    vectors = unit_vectors(100)
    frame = pd.DataFrame(
        {
            "id": [f"f{i}" for i in range(100)],
            "vector": list(vectors),
            "lang": ["en" if i % 2 else "de" for i in range(100)],
            "n": np.arange(100),
        }
    )
    listed = [
        {"id": f"l{i}", "embedding": vectors[i].tolist(), "metadata": {"n": i}} for i in range(30)
    ]
    parquet = tmp_path / "rows.parquet"
    frame.assign(id=[f"p{i}" for i in range(100)]).to_parquet(parquet)
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text(
        "\n".join(
            json.dumps({"id": f"j{i}", "vector": vectors[i].tolist(), "text": f"doc {i}"})
            for i in range(45)
        )
        + "\n"
    )
    async with running_service(tmp_path / "svc") as svc:
        alice = Client(api_url=svc.api, token=svc.create_user("alice"))
        monkeypatch.setenv("JUPYTERHUB_USER", "alice")

        def work():
            docs = Collection("docs", dim=DIM, client=alice)
            assert len(docs.insert(frame, batch=40)) == 100
            assert len(docs.insert(listed, batch=40)) == 30
            assert len(docs.insert(parquet, batch=40)) == 100
            assert docs.insert(str(jsonl), batch=40)[:2] == ["j0", "j1"]
            assert docs.count() == 275
            hits = docs.search(vector=vectors[7], k=4)
            assert {h.id for h in hits} == {"f7", "l7", "p7", "j7"}
            by_id = {h.id: h for h in hits}
            assert by_id["f7"].metadata == {"lang": "en", "n": 7}
            assert by_id["l7"].metadata == {"n": 7}
            assert by_id["j7"].text == "doc 7"
            # Upserts take rows too: the frame's rows replaced, none added.
            docs.upsert(frame.assign(lang="fr"), batch=100)
            assert docs.count() == 275
            hits = docs.search(vector=vectors[7], k=1, filter={"lang": "fr"})
            assert hits[0].id == "f7"
            with pytest.raises(BadRequest, match="row 1 has no vector"):
                docs.insert([{"vector": vectors[0].tolist()}, {"lang": "en"}])
            with pytest.raises(BadRequest, match="reads .parquet or .jsonl"):
                docs.insert(str(tmp_path / "rows.csv"))

        await asyncio.to_thread(work)
    # The progress bar counted every row of the file.
    assert "45/45" in capsys.readouterr().err
