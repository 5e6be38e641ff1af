"""The service shows a queued Kubernetes job's Kueue state in the job's message: what
the job waits for while Kueue holds it, then "running" once admitted (the Job
unsuspended). The chart's service config with ``kueue.enabled``; a stand-in API
server, which lists nothing, so no Workload is found and the message says Kueue has
none yet (what Kueue writes on a Workload is read on the live cluster,
test_live_cluster_kueue.py)."""

from __future__ import annotations

import pytest
from fake_apiserver import FakeApiServer
from support.service import running_service
from support.wait import wait_until_async
from test_chart_config_files import rendered_data

pytestmark = pytest.mark.asyncio


async def test_a_held_job_says_it_waits_in_the_queue_then_running(
    tmp_path, monkeypatch, offline_kubeconfig
):
    data = rendered_data({"kueue": {"enabled": True}})  # the site's values: Kueue on
    values = tmp_path / "service-values.json"
    values.write_text(data["service-values.json"])
    monkeypatch.setenv("GPULAB_SERVICE_VALUES", str(values))
    api = await FakeApiServer().start()
    try:
        config = data["gpulab_config.py"] + (
            f"c.KubernetesJobsSettings.kubeconfig = {api.kubeconfig(tmp_path / 'kc')!r}\n"
            "c.GpuLabService.stop_work_on_exit = True\n"
        )
        async with running_service(tmp_path / "svc", config) as svc:
            bob = svc.create_user("bob")
            body = {"code": "print(1)", "image": "registry.example/gpulab:1"}
            r = await svc.request("POST", "/jobs", token=bob, json=body)
            assert r.status_code == 201, r.text
            job_id = r.json()["id"]

            seen = []

            async def message_is(text: str):
                jobs = (await svc.request("GET", "/jobs", token=bob)).json()
                [job] = [j for j in jobs if j["id"] == job_id]
                seen[:] = [job["state"], job["message"]]
                return job if job["message"] == text else None

            waiting = "waiting in Kueue queue gpulab: Kueue has no Workload for it yet"
            try:
                await wait_until_async(lambda: message_is(waiting), "the queue's word", 60)
            except AssertionError as e:
                raise AssertionError(f"{e}; the job: {seen}") from None
            [key] = [k for k in api.objects if k.endswith(f"/jobs/gpulab-{job_id}")]
            assert api.objects[key]["spec"]["suspend"] is True
            api.objects[key]["spec"]["suspend"] = False  # what Kueue does on admission
            job = await wait_until_async(lambda: message_is("running"), "running", 60)
            assert job["state"] == "running"
    finally:
        await api.stop()
