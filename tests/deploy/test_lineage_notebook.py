"""The must-show of lineage: a model trained by ``%%train_distributed`` (reading a
dataset through the cache), quantized and deployed shows its job, code hash and
dataset version in ``%deploy --list --lineage``, at ``GET /models/{owner}/{name}/lineage``
and in the audit trail. A real kernel (nbclient) against the session's real hub;
the shards are files the job's ranks read through the cache (where users have
accounts, the ranks run as the user's: the files are readable by all, as a shared
file system's would be).
"""

import hashlib
import os
import re
import shutil
import tempfile

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.slow

SIZES = {"toy-0.bin": 300, "toy-1.bin": 500}


def text_of(cell) -> str:
    return "".join(
        o.get("text", "") if o.output_type == "stream" else o.get("data", {}).get("text/plain", "")
        for o in cell.outputs
        if o.output_type in ("stream", "display_data", "execute_result")
    )


def test_trained_quantized_deployed_model_shows_its_job_code_and_data(hub, tmp_path, monkeypatch):
    user = "lineage-ada"
    token = hub.create_user(user)
    stranger = hub.create_user("lineage-bob")
    monkeypatch.setenv("GPULAB_API_URL", hub.api)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", token)
    store = tempfile.mkdtemp(prefix="gpulab-lineage-")
    os.chmod(store, 0o755)
    urls = []
    for name, size in SIZES.items():
        urls.append(os.path.join(store, name))
        with open(urls[-1], "wb") as f:
            f.write(bytes(range(256)) * (size // 256) + b"x" * (size % 256))
        os.chmod(urls[-1], 0o644)
    try:
        # The cell's body: its hash is the job's code hash.
        body = (
            "import tempfile, torch\n"
            "from gpulab.cache import CachedDataset\n"
            f"ds = CachedDataset({urls!r}, name='toy', cache_dir=tempfile.mkdtemp())\n"
            "seen = sum(len(shard) for shard in ds)\n"
            "torch.manual_seed(seen)\n"
            "model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), "
            "torch.nn.Linear(8, 2)).eval()"
        )
        sources = [
            "%load_ext gpulab.magics",
            "import torch\nx = torch.randn(4, 4)",
            "%%train_distributed --out model --name lineage\n" + body,
            "%quantize model --scheme int8-dynamic --example x --to qmodel --runs 3",
            "%deploy qmodel --name lineage-ep --example x --max-batch-size 4",
            "%deploy --list --lineage --once",
        ]
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
        NotebookClient(
            nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
        ).execute()
    finally:
        shutil.rmtree(store)
    out = {c.source.split("\n")[0]: text_of(c) for c in nb.cells}
    trained = out["%%train_distributed --out model --name lineage"]
    job_id = re.search(r"job (\w+) succeeded", trained).group(1)

    # IPython hands a cell magic its body with a final newline; that is what is sent.
    code_hash = hashlib.sha256((body + "\n").encode()).hexdigest()
    lines = "".join(f"{url}\t{SIZES[url.rsplit('/', 1)[1]]}\n" for url in sorted(urls))
    data_version = hashlib.sha256(lines.encode()).hexdigest()

    # The job's record: what its ranks ran and read.
    job = hub.gpulab("GET", f"/jobs/{job_id}", token=token).json()
    assert job["code_hash"] == code_hash, job
    assert job["datasets"] == [{"name": "toy", "version": data_version, "shards": 2, "bytes": 800}]

    listing = out["%deploy --list --lineage --once"]
    line = next(v for v in listing.splitlines() if v.strip().startswith("v1 · job"))
    assert f"job {job_id}" in line and f"code {code_hash[:12]}" in line, listing
    assert f"data toy@{data_version[:12]}" in line and "int8-dynamic" in line, listing

    # The REST view: to the owner and admins; refused to a stranger as a call is.
    path = f"/models/{user}/lineage-ep/lineage"
    r = hub.gpulab("GET", path, token=token)
    assert r.status_code == 200, r.text
    (v1,) = r.json()["versions"]
    assert v1["created_by"] == user and v1["created"]
    assert v1["job"]["id"] == job_id and v1["job"]["code_hash"] == code_hash
    assert v1["job"]["datasets"][0]["version"] == data_version
    quant = v1["quantization"]
    assert quant["scheme"] == "int8-dynamic" and quant["engine"] == "torch-ao"
    # The report %quantize printed (a model this small grows: int8 packing has overhead).
    assert quant["size_before"] > 0 and quant["size_after"] > 0 and quant["speedup"] > 0
    assert hub.gpulab("GET", path).json() == r.json()  # the admin's token
    assert hub.gpulab("GET", path, token=stranger).status_code == 403

    # The audit trail's entry of the deployment carries the summary.
    entries = hub.gpulab(
        "GET", "/audit", params={"action": "deployment.create", "user": user}
    ).json()["entries"]
    (entry,) = [e for e in entries if e["subject"] == f"{user}/lineage-ep"]
    assert entry["detail"]["job"] == job_id and entry["detail"]["code_hash"] == code_hash
    assert entry["detail"]["datasets"] == [f"toy@{data_version[:12]}"]

    assert hub.gpulab("DELETE", "/deployments/lineage-ep", token=token).status_code == 200
