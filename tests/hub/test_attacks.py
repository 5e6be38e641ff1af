"""What an attacker tries against a real hub, and what they get: bad input never hurts
others, and the ledger holds.

Route logic alone (bodies that do not parse, 400/413, caps, crafted archives) runs
against the real gpulab service in this process with a fake hub API beside it
(``service``, see ``support/service.py``); what needs servers, job ranks or replicas
runs against a real hub (``hub``).

Another user's token, no token, bytes that are not UTF-8, numbers JSON cannot
carry, oversized bodies, .tar.xz bombs and crafted archives (``../`` names,
links), thousands of ranks, loader variables, a fake all-reduce result, and
releasing one's own running server's slice to get it double-booked.
"""

import io
import json
import lzma
import os
import tarfile
from concurrent.futures import ThreadPoolExecutor

import pytest
import pytest_asyncio
import requests
from hubproc import RunningHub
from support.service import running_service
from support.wait import wait_until

pytestmark = pytest.mark.slow

CONFIG = """
c.GpuLabService.max_upload_mib = 1
c.Endpoints.max_model_mib = 1536
c.JobQueue.max_job_ranks = 8
c.JobQueue.max_job_vars_mib = 1
c.Endpoints.max_deployment_replicas = 2
c.Endpoints.max_user_deployments = 1
c.GpuLabService.reconcile_interval = 1
"""
WAIT_S = 240  # a bound on a loaded 2-core machine, not a sleep
CARD = {"inputs": [], "outputs": [], "max_batch_size": 4}
#: A language model's card with one LoRA adapter, ``sql``.
LLM_CARD = json.dumps({**CARD, "kind": "causal-lm", "adapters": ["sql"]}).encode()


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    h = RunningHub(tmp_path_factory.mktemp("attackhub"), simulate="2xA100-80GB", config=CONFIG)
    yield h
    for job in h.gpulab("GET", "/jobs", params={"state": "running"}).json():
        h.gpulab("DELETE", f"/jobs/{job['id']}")
    for dep in h.gpulab("GET", "/deployments").json():
        h.gpulab("DELETE", f"/deployments/{dep['name']}", params={"user": dep["user"]})
    h.stop()


@pytest.fixture(scope="module")
def tokens(hub):
    return {u: hub.create_user(u) for u in ("alice", "bob", "mallory")}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def service(tmp_path_factory):
    """The real gpulab service with the same caps, in this process; the hub's REST API
    is a stand-in (support.service.FakeHubAPI)."""
    async with running_service(tmp_path_factory.mktemp("attack-routes"), CONFIG) as svc:
        yield svc


@pytest.fixture(scope="module")
def stokens(service):
    """alice, bob and mallory on the in-process service."""
    return {u: service.create_user(u) for u in ("alice", "bob", "mallory")}


def raw(hub, method, path, token, body: bytes, content_type="application/json"):
    return requests.request(
        method,
        f"{hub.api}{path}",
        data=body,
        timeout=120,
        headers={**hub.auth(token), "Content-Type": content_type},
    )


def error_of(r) -> str:
    assert r.headers["Content-Type"].startswith("application/json"), r.text[:300]
    return r.json()["error"]


def submit(hub, token, code, **fields):
    return hub.gpulab("POST", "/jobs", token=token, json={"code": code, **fields})


def wait_job(hub, token, job_id, states=("succeeded", "failed", "cancelled")):
    return until(
        lambda: (lambda j: j if j["state"] in states else None)(
            hub.gpulab("GET", f"/jobs/{job_id}", token=token).json()
        ),
        f"job {job_id} {states}",
    )


def until(predicate, what):
    return wait_until(predicate, what, timeout=WAIT_S)


# -- archives ------------------------------------------------------------------------
def _xz_member(name: str, size: int, data: bytes | None = None) -> bytes:
    """One tar member as its own xz stream: a big run of zeros costs a few hundred bytes
    per MiB (xz readers take concatenated streams)."""
    head = tarfile.TarInfo(name)
    head.size = size
    out = lzma.compress(head.tobuf(format=tarfile.GNU_FORMAT))
    if data is not None:
        return out + lzma.compress(data + b"\0" * (-len(data) % 512))
    zeros = lzma.compress(b"\0" * (1 << 20))
    return out + zeros * (size >> 20)


def xz_archive(*members: bytes) -> bytes:
    return b"".join(members) + lzma.compress(b"\0" * 1024)


def tar_of(entries) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for info, data in entries:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def file_entry(name, data: bytes):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def link_entry(name, target, kind):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info, None


def upload(hub, token, archive: bytes, settings=None):
    return requests.post(
        f"{hub.api}/deployments",
        headers=hub.auth(token),
        timeout=600,
        files={
            "spec": (None, json.dumps(settings or {"name": "m"})),
            "model": ("model.tar.xz", archive),
        },
    )


def leftovers(hub, live=None) -> list[str]:
    """Files of deployments that do not exist, and spooled uploads."""
    if live is None:
        live = {d["id"] for d in hub.gpulab("GET", "/deployments").json()}
    deps = hub.data_dir / "deployments"
    spool = hub.data_dir / "uploads"
    left = [d for d in (os.listdir(deps) if deps.exists() else []) if d not in live]
    return left + [f"uploads/{f}" for f in (os.listdir(spool) if spool.exists() else [])]


async def leftovers_of(service) -> list[str]:
    live = {d["id"] for d in (await service.request("GET", "/deployments")).json()}
    return leftovers(service, live)


async def upload_to(service, token, archive: bytes, settings=None):
    return await service.request(
        "POST",
        "/deployments",
        token,
        timeout=600,
        files={
            "spec": (None, json.dumps(settings or {"name": "m"})),
            "model": ("model.tar.xz", archive),
        },
    )


# -- bad bytes, on every route ----------------------------------------------------------
BAD_BODIES = {
    "not UTF-8": (b'{"name": "\xff\xfe"}', "not UTF-8"),
    "not JSON": (b"{nope", "not valid JSON"),
    "a list": (b"[1, 2]", "must be a JSON object"),
    "NaN": (b'{"timeout": NaN}', "NaN is not a JSON number"),
    "1e400": (b'{"size_bytes": 1e400}', "out of range"),
    "too deep": (b"[" * 100_000, "nested too deeply"),
}


@pytest.mark.parametrize("kind", BAD_BODIES)
async def test_undecodable_bodies_are_400_with_the_reason_on_every_route(service, stokens, kind):
    body, message = BAD_BODIES[kind]
    # The admin's token reaches every route's parsing (users are refused some earlier).
    for method, path in [
        ("POST", "/jobs"),
        ("POST", "/allocations"),
        ("POST", "/telemetry"),
        ("POST", "/telemetry/allreduce"),
    ]:
        token = stokens["alice"] if path == "/jobs" else None
        r = await service.raw(method, path, token, body)
        assert r.status_code == 400, (method, path, r.status_code, r.text)
        assert message in error_of(r), (path, r.text)


async def test_nul_bytes_and_overlong_names_are_400(service, stokens):
    # PostgreSQL refuses NUL outright; on any database it names no row.
    r = await service.request("GET", "/jobs/a%00b", token=stokens["alice"])
    assert r.status_code == 400 and "NUL" in error_of(r)
    for owner in ("alice/\u0000", "x" * 300):
        r = await service.request(
            "POST",
            "/allocations",
            json={"user": "alice", "owner_kind": "server", "owner": owner, "gpu_milli": 0},
        )
        assert r.status_code == 400 and "at most 255 characters" in error_of(r)


async def test_oversized_bodies_are_413_and_none_of_them_is_kept(service, stokens):
    big = b'{"x": "' + b"a" * (2 << 20) + b'"}'
    for method, path, token in [
        ("POST", "/allocations", None),
        ("POST", "/jobs", "alice"),
        ("POST", "/telemetry/allreduce", None),
    ]:
        r = await service.raw(method, path, stokens.get(token), big if path != "/jobs" else big * 3)
        assert r.status_code == 413, (path, r.status_code, r.text)
        assert "send less" in error_of(r)
    r = await service.raw(
        "POST",
        "/deployments",
        stokens["alice"],
        os.urandom(2 << 20),
        "multipart/form-data; boundary=xyz",
    )
    assert r.status_code == 413 and "max_upload_mib" in error_of(r)
    # Without a token it is still a 413 or 401, never a 5xx; and the service still answers.
    r = await service.request("POST", "/allocations", anonymous=True, data=big, timeout=60)
    assert r.status_code in (401, 413)
    assert (await service.request("GET", "/inventory", token=stokens["alice"])).status_code == 200


# -- jobs ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "fields, status, message",
    [
        ({"nodes": 8, "nproc_per_node": 8}, 400, "64 ranks"),  # CPU-only jobs too
        ({"nodes": 64, "nproc_per_node": 64}, 400, "max_job_ranks"),
        ({"timeout": -1}, 400, "'timeout' must be seconds"),
        ({"timeout": 1e12}, 400, "'timeout' must be seconds"),
        ({"env": {"LD_PRELOAD": "/tmp/x.so"}}, 400, "env 'LD_PRELOAD' is refused"),
        ({"env": {"PYTHONPATH": "/tmp"}}, 400, "env 'PYTHONPATH' is refused"),
        ({"env": {"PATH": "/tmp"}}, 400, "env 'PATH' is refused"),
        ({"env": {"GPULAB_GPU_MILLI": "1000"}}, 400, "env 'GPULAB_GPU_MILLI' is set by gpulab"),
        ({"env": {"CUDA_VISIBLE_DEVICES": "0,1"}}, 400, "env 'CUDA_VISIBLE_DEVICES' is set by"),
        ({"env": {"MASTER_ADDR": "10.0.0.1"}}, 400, "env 'MASTER_ADDR' is set by gpulab"),
        ({"env": {"WORLD_SIZE": "1"}}, 400, "env 'WORLD_SIZE' is set by gpulab"),
        ({"code": "x = 1\n" * 200_000}, 413, "'code' is over 1 MiB"),
        ({"vars_b64": "A" * (1_600_000)}, 413, "max_job_vars_mib"),
    ],
)
async def test_jobs_beyond_the_caps_are_refused_naming_the_limit(
    service, stokens, fields, status, message
):
    alice = stokens["alice"]
    before = (await service.request("GET", "/jobs", token=alice)).json()
    r = await service.request("POST", "/jobs", token=alice, json={"code": "print(1)", **fields})
    assert r.status_code == status, r.text
    assert message in error_of(r)
    assert (await service.request("GET", "/jobs", token=alice)).json() == before


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity", b"1e400"])
async def test_a_timeout_that_is_not_a_finite_number_is_refused(service, stokens, literal):
    r = await service.raw(
        "POST", "/jobs", stokens["alice"], b'{"code": "print(1)", "timeout": ' + literal + b"}"
    )
    assert r.status_code == 400 and "finite number" in error_of(r)


def test_strangers_and_anonymous_callers_see_nothing_of_a_job(hub, tokens):
    job = submit(hub, tokens["alice"], "print('mine')").json()
    for path in (f"/jobs/{job['id']}", f"/jobs/{job['id']}/logs", f"/jobs/{job['id']}/out"):
        assert hub.gpulab("GET", path, token=tokens["mallory"]).status_code == 404
        assert requests.get(f"{hub.api}{path}", timeout=30).status_code == 401
    assert hub.gpulab("DELETE", f"/jobs/{job['id']}", token=tokens["mallory"]).status_code == 404
    assert wait_job(hub, tokens["alice"], job["id"])["state"] == "succeeded"


# -- uploads -----------------------------------------------------------------------------
async def test_a_tar_xz_bomb_is_refused_and_leaves_nothing(service, stokens):
    card = json.dumps(CARD).encode()
    bomb = xz_archive(_xz_member("model.pt2", 3 << 30), _xz_member("model.json", len(card), card))
    assert len(bomb) < 1 << 20  # 3 GiB of zeros in well under the compressed cap
    r = await upload_to(service, stokens["mallory"], bomb)
    assert r.status_code == 413, r.text
    assert "expands to more than 1536 MiB" in error_of(r) and "max_model_mib" in error_of(r)
    assert await leftovers_of(service) == []
    assert (await service.request("GET", "/deployments", token=stokens["mallory"])).json() == []


@pytest.mark.parametrize(
    "entries, message",
    [
        (
            [file_entry("../model.pt2", b"x"), file_entry("model.json", b"{}")],
            "'../model.pt2' points outside the archive",
        ),
        (
            [file_entry("/etc/model.json", b"{}"), file_entry("model.pt2", b"x")],
            "'/etc/model.json' points outside",
        ),
        (
            [
                link_entry("model.pt2", "/etc/shadow", tarfile.SYMTYPE),
                file_entry("model.json", b"{}"),
            ],
            "'model.pt2' is a symbolic link",
        ),
        (
            [
                file_entry("w", b"x"),
                link_entry("model.pt2", "w", tarfile.LNKTYPE),
                file_entry("model.json", b"{}"),
            ],
            "'model.pt2' is a hard link",
        ),
        (
            [
                file_entry("model.pt2", b"x"),
                file_entry("model.pt2", b"y"),
                file_entry("model.json", b"{}"),
            ],
            "holds model.pt2 twice",
        ),
        # A language model's Hugging Face folder: the same rules one level down.
        (
            [
                link_entry("hf/config.json", "/etc/shadow", tarfile.SYMTYPE),
                file_entry("model.json", json.dumps({**CARD, "kind": "causal-lm"}).encode()),
            ],
            "'hf/config.json' is a symbolic link",
        ),
        (
            [file_entry("hf/../../model.pt2", b"x"), file_entry("model.json", b"{}")],
            "'hf/../../model.pt2' points outside the archive",
        ),
        (
            [
                file_entry("hf/tokenizer.json", b"{}"),
                file_entry("model.json", json.dumps({**CARD, "kind": "causal-lm"}).encode()),
            ],
            "the model archive lacks hf/config.json",
        ),
        # Its LoRA adapters (adapters/<name>/<file>): the same rules, and only those the
        # card names, each whole.
        *(
            ([file_entry("hf/config.json", b"{}"), *entries, file_entry("model.json", card)], msg)
            for card, entries, msg in [
                (
                    LLM_CARD,
                    [
                        file_entry("adapters/sql/adapter_config.json", b"{}"),
                        link_entry(
                            "adapters/sql/adapter_model.safetensors", "/etc/shadow", tarfile.SYMTYPE
                        ),
                    ],
                    "'adapters/sql/adapter_model.safetensors' is a symbolic link",
                ),
                (
                    LLM_CARD,
                    [file_entry("adapters/sql/adapter_config.json", b"{}")] * 2,
                    "holds adapters/sql/adapter_config.json twice",
                ),
                (
                    LLM_CARD,
                    [file_entry("adapters/sql/adapter_config.json", b"{}")],
                    "lacks adapters/sql/adapter_model.safetensors",
                ),
                (
                    json.dumps({**CARD, "kind": "causal-lm"}).encode(),
                    [file_entry("adapters/sql/adapter_config.json", b"{}")],
                    "does not list 'sql' in its adapters",
                ),
                (
                    LLM_CARD,
                    [file_entry("adapters/-x/adapter_config.json", b"{}")],
                    "adapter name '-x'",
                ),
            ]
        ),
        (
            [
                file_entry("model.pt2", b"x"),
                file_entry("adapters/sql/adapter_config.json", b"{}"),
                file_entry("adapters/sql/adapter_model.safetensors", b"x"),
                file_entry("model.json", json.dumps({**CARD, "adapters": ["sql"]}).encode()),
            ],
            "LoRA adapters go with a language model",
        ),
    ],
)
async def test_crafted_archives_are_refused_by_name_and_leave_nothing(
    service, stokens, entries, message
):
    r = await upload_to(service, stokens["mallory"], tar_of(entries))
    assert r.status_code == 400 and message in error_of(r), r.text
    assert await leftovers_of(service) == []


def test_other_routes_answer_while_a_large_upload_is_unpacked(hub, tokens):
    card = json.dumps(CARD).encode()
    # 1 GiB of model.pt2 (under max_model_mib), refused only after unpacking: the
    # settings ask for more rows than the card allows.
    archive = xz_archive(
        _xz_member("model.pt2", 1 << 30), _xz_member("model.json", len(card), card)
    )
    deps = hub.data_dir / "deployments"
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(
            upload, hub, tokens["bob"], archive, {"name": "slow", "max_batch_size": 64}
        )
        until(lambda: pending.done() or any(deps.glob("*/model/model.pt2")), "unpacking model.pt2")
        answer = hub.gpulab("GET", "/inventory", token=tokens["alice"])
        answered_while_unpacking = not pending.done()
        r = pending.result()
    assert answer.status_code == 200
    assert answered_while_unpacking, "the GET waited for the upload to be unpacked"
    assert r.status_code == 400 and "above the 4 rows" in error_of(r), r.text
    assert leftovers(hub) == []


# -- deployments, the ledger --------------------------------------------------------------
@pytest.fixture(scope="module")
def model_archive(tmp_path_factory):
    import torch

    from gpulab.client.deployments import pack_model_dir
    from gpulab.serving.export import export_model

    path = tmp_path_factory.mktemp("model")
    model = torch.nn.Sequential(torch.nn.Linear(4, 2))
    export_model(model.eval(), torch.randn(2, 4), str(path), name="m", max_batch_size=8)
    return pack_model_dir(str(path))


def test_deployment_caps_and_a_live_deployments_slice(hub, tokens, model_archive):
    r = upload(hub, tokens["alice"], model_archive, {"name": "many", "replicas": 3})
    assert r.status_code == 400 and "max_deployment_replicas" in error_of(r)
    r = upload(hub, tokens["alice"], model_archive, {"name": "one", "gpu_milli": 100})
    assert r.status_code == 201, r.text
    r = upload(hub, tokens["alice"], model_archive, {"name": "two"})
    assert r.status_code == 403 and "the most one user may have (1)" in error_of(r)
    # Bad bytes on PATCH of a deployment that exists: 400, and nothing changes.
    r = raw(hub, "PATCH", "/deployments/one", tokens["alice"], b'{"share_users": ["\xff"]}')
    assert r.status_code == 400 and "not UTF-8" in error_of(r)
    r = raw(hub, "PATCH", "/deployments/one", tokens["alice"], b'"share"')
    assert r.status_code == 400 and "must be a JSON object" in error_of(r)
    r = raw(hub, "PATCH", "/deployments/one", tokens["alice"], b"[" + b"1," * (1 << 20) + b"1]")
    assert r.status_code == 413 and "send less" in error_of(r)
    assert (
        hub.gpulab(
            "PATCH", "/deployments/one", token=tokens["mallory"], json={"share_users": ["mallory"]}
        ).status_code
        == 404
    )
    [row] = hub.gpulab(
        "GET", "/allocations", token=tokens["alice"], params={"owner_kind": "deployment"}
    ).json()
    r = hub.gpulab("DELETE", f"/allocations/{row['id']}", token=tokens["alice"])
    assert r.status_code == 409 and "stop it" in error_of(r)
    assert hub.gpulab("GET", f"/allocations/{row['id']}", token=tokens["alice"]).status_code == 200
    assert hub.gpulab("DELETE", "/deployments/one", token=tokens["alice"]).status_code == 200
    assert hub.gpulab("GET", "/allocations", token=tokens["alice"]).json() == []


def test_a_running_jobs_slice_cannot_be_released_by_its_user(hub, tokens):
    code = "import time\nfrom gpulab.training import setup\nsetup()\ntime.sleep(600)\n"
    job = submit(hub, tokens["alice"], code, gpu_milli=250).json()
    wait_job(hub, tokens["alice"], job["id"], states=("running",))
    [row] = hub.gpulab(
        "GET", "/allocations", token=tokens["alice"], params={"owner_kind": "job"}
    ).json()
    r = hub.gpulab("DELETE", f"/allocations/{row['id']}", token=tokens["alice"])
    assert r.status_code == 409 and f"DELETE /api/v1/jobs/{job['id']}" in error_of(r)
    r = hub.gpulab(
        "DELETE",
        "/allocations",
        token=tokens["alice"],
        params={"owner_kind": "job", "owner": row["owner"]},
    )
    assert r.status_code == 409
    hub.gpulab("DELETE", f"/jobs/{job['id']}", token=tokens["alice"])
    assert hub.gpulab("GET", "/allocations", token=tokens["alice"]).json() == []


def test_a_running_servers_slice_is_not_double_booked(hub, tokens):
    assert hub.spawn("alice", {"gpu_milli": 250}).status_code in (201, 202)
    hub.wait_server("alice")
    [row] = hub.gpulab("GET", "/allocations", token=tokens["alice"]).json()
    r = hub.gpulab("DELETE", f"/allocations/{row['id']}", token=tokens["alice"])
    assert r.status_code == 409 and "stop the server to release its slice" in error_of(r)
    r = hub.gpulab(
        "DELETE",
        "/allocations",
        token=tokens["alice"],
        params={"owner_kind": "server", "owner": "alice/"},
    )
    assert r.status_code == 409
    assert hub.gpulab("GET", "/allocations", token=tokens["alice"]).json() == [row]
    # Another user cannot even see it.
    assert hub.gpulab("DELETE", f"/allocations/{row['id']}", token=tokens["bob"]).status_code == 404

    # An admin is told what holds it (force=1 would stop the server first).
    r = hub.gpulab("DELETE", f"/allocations/{row['id']}")
    assert r.status_code == 409 and "?force=1" in error_of(r)
    # A row lost behind the server's back (here: the service's own token, which the
    # spawner releases with): the check finds the server running without a slice,
    # and says so to its owner and the admin only.
    service_token = (hub.data_dir / "service-token").read_text().strip()
    r = hub.gpulab("DELETE", f"/allocations/{row['id']}", token=service_token)
    assert r.status_code == 200, r.text

    def lost():
        found = hub.gpulab("GET", "/ledger", token=tokens["alice"]).json()["lost"]
        return [x for x in found if x["owner"] == "alice/"]

    [item] = until(lost, "reported lost")
    assert item["owner_kind"] == "server" and item["milli"] == 250
    assert "holds no slice" in item["message"]
    assert hub.gpulab("GET", "/ledger", token=tokens["bob"]).json()["lost"] == []
    assert any(x["owner"] == "alice/" for x in hub.gpulab("GET", "/ledger").json()["lost"])
    metrics = requests.get(
        f"{hub.url}/services/gpulab/metrics", headers=hub.auth(), timeout=30
    ).text
    assert 'gpulab_ledger_lost_owners{owner_kind="server"} 1.0' in metrics
    assert "alice/" in hub.log_tail(20000) and "holds no slice" in hub.log_tail(20000)
    hub.hub_api("DELETE", "/users/alice/server")
    hub.wait_server("alice", ready=False)
    until(lambda: not lost(), "cleared once the server stopped")


# -- all-reduce results ------------------------------------------------------------------
async def test_allreduce_results_cannot_be_posted_by_users(service, stokens):
    fake = {
        "busbw_bytes_per_second": 9e18,
        "algbw_bytes_per_second": 9e18,
        "size_bytes": 2**24,
        "world_size": 2,
        "backend": "gloo",
        "nodes": ["n1"],
    }
    r = await service.request("POST", "/telemetry/allreduce", token=stokens["mallory"], json=fake)
    assert r.status_code == 403 and "%gpulab nettest --nodes" in error_of(r)
    # Even an admin's post must be a plausible measurement.
    r = await service.request("POST", "/telemetry/allreduce", json=fake)
    assert r.status_code == 400 and "from 0 to 1e+13" in error_of(r)
    plausible = {**fake, "busbw_bytes_per_second": 1e9, "algbw_bytes_per_second": 1e9}
    r = await service.request("POST", "/telemetry/allreduce", json={**plausible, "nodes": 5})
    assert r.status_code == 400 and "'nodes' must be a list" in error_of(r)
    r = await service.raw(
        "POST",
        "/telemetry/allreduce",
        None,
        json.dumps(plausible).replace("16777216", "1e400").encode(),
    )
    assert r.status_code == 400 and "out of range" in error_of(r)
    shown = (await service.request("GET", "/telemetry")).json()["allreduce"]
    assert not [x for x in shown if x["busbw_bytes_per_second"] > 1e13]


FAKE_RESULT = """
import json, os
out = os.path.join(os.environ["GPULAB_JOB_DIR"], "out", "allreduce.json")
{write}
"""


@pytest.mark.parametrize(
    "write, why",
    [
        (
            'json.dump({"busbw_bytes_per_second": 9e18, "algbw_bytes_per_second": 9e18, '
            '"size_bytes": 1024, "world_size": 1, "backend": "gloo"}, open(out, "w"))',
            "'algbw_bytes_per_second' must be a finite number from 0 to 1e+13",
        ),
        ('os.symlink(os.path.join(os.environ["GPULAB_JOB_DIR"], "spec.json"), out)', "Errno"),
        ('open(out, "w").write("NaN")', "not a number"),
    ],
)
def test_a_jobs_fake_allreduce_result_is_not_recorded(hub, tokens, write, why):
    job = submit(hub, tokens["mallory"], FAKE_RESULT.format(write=write)).json()
    assert wait_job(hub, tokens["mallory"], job["id"])["state"] == "succeeded"
    shown = hub.gpulab("GET", "/telemetry").json()["allreduce"]
    assert not [x for x in shown if x.get("job_id") == job["id"]]
    logs = hub.gpulab("GET", f"/jobs/{job['id']}/logs", token=tokens["mallory"]).text
    assert "all-reduce result not recorded" in logs and why in logs, logs


def test_a_probe_jobs_result_is_recorded_for_its_owner(hub, tokens):
    code = (
        "from gpulab.training import setup\n"
        "from gpulab.training.allreduce_probe import run_probe\n"
        "setup()\nresult = run_probe('64K', iters=3, warmup=1, record=True)\n"
    )
    job = submit(hub, tokens["bob"], code, nproc_per_node=2, name="nettest").json()
    ended = wait_job(hub, tokens["bob"], job["id"])
    assert ended["state"] == "succeeded", (
        ended,
        hub.gpulab("GET", f"/jobs/{job['id']}/logs", token=tokens["bob"]).text[-3000:],
    )
    [run] = [
        x
        for x in hub.gpulab("GET", "/telemetry", token=tokens["bob"]).json()["allreduce"]
        if x.get("job_id") == job["id"]
    ]
    assert run["user"] == "bob" and run["world_size"] == 2 and run["size_bytes"] == 65536
    assert 0 < run["busbw_bytes_per_second"] < 1e13
    assert not [
        x
        for x in hub.gpulab("GET", "/telemetry", token=tokens["alice"]).json()["allreduce"]
        if x.get("job_id") == job["id"]
    ]


async def test_the_openapi_document_names_the_new_statuses_and_routes(service):
    paths = (await service.request("GET", "/openapi.json")).json()["paths"]
    assert "/api/v1/ledger" in paths and "/api/v1/telemetry/allreduce" in paths
    assert "413" in paths["/api/v1/jobs"]["post"]["responses"]
    assert "413" in paths["/api/v1/deployments"]["post"]["responses"]
    assert "409" in paths["/api/v1/allocations/{id}"]["delete"]["responses"]
