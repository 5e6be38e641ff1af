"""A model card's inputs and outputs are refused unless each is a plain name, an OIP
v2 datatype and a shape of integers: the lab's Copy curl builds a shell line from
them, and a card anyone uploads is shown to every admin. On the real service in this
process (a stand-in hub API)."""

from __future__ import annotations

import io
import json
import tarfile

import pytest
from support.service import running_service

TENSOR = {"name": "input", "datatype": "FP32", "shape": [-1, 4]}


def archive(card: dict) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in (("model.json", json.dumps(card).encode()), ("model.pt2", b"x")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


async def deploy(svc, token, model_card: dict):
    spec = {"name": "m", "min_replicas": 0, "max_replicas": 1}
    return await svc.request(
        "POST",
        "/deployments",
        token=token,
        files={"spec": (None, json.dumps(spec)), "model": ("model.tar.gz", archive(model_card))},
    )


def card(inputs=(TENSOR,), outputs=(TENSOR,)) -> dict:
    return {"inputs": list(inputs), "outputs": list(outputs), "max_batch_size": 4}


@pytest.mark.parametrize(
    "model_card, message",
    [
        (
            card([{**TENSOR, "name": "x'$(curl evil)'"}]),
            "model.json's inputs[0]'s name \"x'$(curl evil)'\" must be 1 to 64 letters",
        ),
        (card([{**TENSOR, "name": ""}]), "inputs[0]'s name '' must be"),
        (card([{**TENSOR, "name": "a" * 65}]), "inputs[0]'s name 'aaaa"),
        (card(outputs=[TENSOR, {**TENSOR, "name": "out put"}]), "outputs[1]'s name 'out put'"),
        (
            card([{**TENSOR, "datatype": "FP32' ; rm -rf ~ ; '"}]),
            "inputs[0]'s datatype \"FP32' ; rm -rf ~ ; '\" is not an OIP v2 datatype",
        ),
        (card([{**TENSOR, "datatype": ["FP32"]}]), "inputs[0]'s datatype ['FP32'] is not"),
        (card([{**TENSOR, "shape": ["1'; id; '"]}]), "inputs[0]'s shape [\"1'; id; '\"] must"),
        (card([{**TENSOR, "shape": [True, 4]}]), "inputs[0]'s shape [True, 4] must"),
        (card([{**TENSOR, "shape": [-2]}]), "inputs[0]'s shape [-2] must"),
        (card([{**TENSOR, "shape": "4"}]), "inputs[0]'s shape '4' must"),
        (card(["input"]), "inputs[0] must be an object"),
        ({**card(), "outputs": "output"}, "model.json's outputs must be a list"),
    ],
)
async def test_a_card_field_a_shell_line_could_run_is_refused_by_name(
    tmp_path, model_card, message
):
    async with running_service(tmp_path / "svc") as svc:
        mallory = svc.create_user("mallory")
        r = await deploy(svc, mallory, model_card)
        assert r.status_code == 400, r.text
        assert message in r.json()["error"], r.json()["error"]
        assert (await svc.request("GET", "/deployments", token=mallory)).json() == []


async def test_every_oip_datatype_and_a_plain_name_is_taken(tmp_path):
    datatypes = ["BOOL", "BYTES", "BF16", "FP16", "FP32", "FP64"]
    datatypes += [f"{sign}INT{bits}" for sign in ("", "U") for bits in (8, 16, 32, 64)]
    inputs = [
        {"name": f"ns:input_{i}.v-1", "datatype": d, "shape": [-1, 0, 3]}
        for i, d in enumerate(datatypes)
    ]
    async with running_service(tmp_path / "svc") as svc:
        alice = svc.create_user("alice")
        r = await deploy(svc, alice, card(inputs, [{**TENSOR, "name": "o" * 64}]))
        assert r.status_code == 201, r.text
