"""Models count against their owner's storage quota as they unpack, not as they are sent.

A gzip of zeros of a few KB unpacks to MiB (a 1 MB one to a GiB): what counts is what the
archive unpacks to, added to what the owner's deployments already hold on disk
(``c.Endpoints.model_storage_quota_mib``). Over it, nothing is unpacked, nothing stays,
and the 413 gives the numbers. On the real service in this process (a stand-in hub API);
deployments are scaled to zero, so no replica starts.
"""

from __future__ import annotations

import io
import json
import os
import tarfile

import pytest
import torch
from support.service import running_service

from gpulab.client.deployments import pack_model_dir
from gpulab.serving.export import export_model

CONFIG = "c.Endpoints.model_storage_quota_mib = 1\n"
SPEC = {"min_replicas": 0, "max_replicas": 1}


@pytest.fixture(scope="module")
def small_model_tar(tmp_path_factory) -> bytes:
    model = torch.nn.Sequential(torch.nn.Linear(4, 3))
    path = tmp_path_factory.mktemp("quota-model")
    export_model(model.eval(), torch.randn(2, 4), str(path), name="m", max_batch_size=4)
    return pack_model_dir(str(path))


def zeros_archive(size: int) -> bytes:
    """A .tar.gz whose model.pt2 is ``size`` zero bytes: a few KB on the wire."""
    card = json.dumps({"inputs": [], "outputs": [], "max_batch_size": 4}).encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in (("model.json", card), ("model.pt2", b"\0" * size)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


async def deploy(svc, token, name: str, archive: bytes):
    return await svc.request(
        "POST",
        "/deployments",
        token=token,
        files={
            "spec": (None, json.dumps({"name": name, **SPEC})),
            "model": ("model.tar.gz", archive),
        },
    )


def model_files(svc) -> list[str]:
    root = svc.data_dir / "deployments"
    return sorted(
        os.path.relpath(os.path.join(d, f), root)
        for d, _, files in os.walk(root)
        for f in files
        if f.startswith("model")
    )


async def test_unpacked_bytes_count_against_the_owners_model_quota(tmp_path, small_model_tar):
    async with running_service(tmp_path / "svc", config=CONFIG) as svc:
        alice = svc.create_user("alice")
        bob = svc.create_user("bob")

        # 2 MiB of zeros in a few KB: refused before a byte is written, nothing kept.
        bomb = zeros_archive(2 << 20)
        assert len(bomb) < 16 << 10
        r = await deploy(svc, alice, "bomb", bomb)
        assert r.status_code == 413, r.text
        error = r.json()["error"]
        assert "unpacks to more than the 1 MiB left of your model storage" in error, error
        assert "at least 2 MiB; you use 0 MiB of your 1 MiB" in error, error
        assert "c.Endpoints.model_storage_quota_mib" in error and "\n" not in error
        assert model_files(svc) == []
        assert not any((svc.data_dir / "uploads").iterdir())

        # A small model fits; what it holds on disk counts from now on.
        r = await deploy(svc, alice, "small", small_model_tar)
        assert r.status_code == 201, r.text
        held = model_files(svc)
        assert held
        # Alone under the quota, beside the small model over it.
        almost = zeros_archive((1 << 20) - (4 << 10))
        r = await deploy(svc, alice, "second", almost)
        assert r.status_code == 413, r.text
        assert "of your 1 MiB, c.Endpoints.model_storage_quota_mib" in r.json()["error"]
        assert "%deploy --stop" in r.json()["error"]
        assert model_files(svc) == held
        # The quota is each user's own: bob's first model is not counted against alice's.
        r = await deploy(svc, bob, "second", almost)
        assert r.status_code == 201, r.text
        # Stopping alice's model gives its room back.
        assert (await svc.request("DELETE", "/deployments/small", token=alice)).status_code == 200
        r = await deploy(svc, alice, "second", almost)
        assert r.status_code == 201, r.text
