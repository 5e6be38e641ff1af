"""``Client.usage``: the ``GET /usage`` query it sends and what it returns, against a real
HTTP server (aiohttp) standing in for the service (the route itself is tested with the
service)."""

from datetime import UTC, datetime, timedelta

import pytest
from aiohttp import web

from gpulab import client as gl
from gpulab.client.usage import iso

ANSWER = {
    "since": "2026-11-24T00:00:00+00:00",
    "until": "2026-12-01T00:00:00+00:00",
    "group_by": "user",
    "rows": [{"user": "alice", "gpu_hours": 1.25, "milli_gpu_seconds": 4500000, "allocations": 3}],
}


CSV = "day,user,gpu_hours,milli_gpu_seconds,allocations\n2026-11-30,alice,1.25,4500000,3\n"


@pytest.fixture
def service(serve):
    """Answers ``/api/usage`` with ANSWER and records each query; ``/old/usage`` is a
    service older than usage accounting (no such route: 404)."""
    seen = []

    async def usage(request):
        seen.append(dict(request.query))
        if request.query.get("format") == "csv":
            return web.Response(text=CSV, content_type="text/csv")
        if request.query.get("group_by") == "nope":
            return web.json_response({"error": "group_by must be user, group or kind"}, status=400)
        return web.json_response(ANSWER)

    app = web.Application()
    app.router.add_get("/api/usage", usage)

    with serve(app) as url:
        yield url, seen


def test_usage_asks_by_user_by_default_and_returns_the_answer(service):
    url, seen = service
    c = gl.Client(f"{url}/api", token="t")
    assert c.usage() == ANSWER
    assert seen == [{"group_by": "user"}]  # since and until: the service's defaults


def test_usage_sends_times_as_iso_8601(service):
    url, seen = service
    c = gl.Client(f"{url}/api", token="t")
    until = datetime(2026, 12, 1, tzinfo=UTC)
    c.usage(since="2026-11-24T00:00:00+00:00", until=until, group_by="kind")
    assert seen == [
        {
            "since": "2026-11-24T00:00:00+00:00",
            "until": "2026-12-01T00:00:00+00:00",
            "group_by": "kind",
        }
    ]
    gl.run_sync(c.aio.usage(until - timedelta(days=1), group_by="group"), timeout=30)
    assert seen[-1] == {"since": "2026-11-30T00:00:00+00:00", "group_by": "group"}


def test_usage_as_csv_per_day_returns_the_text_the_service_sent(service):
    url, seen = service
    c = gl.Client(f"{url}/api", token="t")
    assert c.usage(group_by="user", bucket="day", format="csv") == CSV
    assert seen == [{"group_by": "user", "bucket": "day", "format": "csv"}]
    with pytest.raises(ValueError, match="format must be json or csv"):
        c.usage(format="xlsx")
    assert len(seen) == 1  # nothing sent


def test_a_naive_datetime_is_local_time_sent_with_its_offset():
    naive = datetime(2026, 11, 24, 9, 30)
    sent = datetime.fromisoformat(iso(naive))
    assert sent.tzinfo is not None and sent == naive.astimezone()


def test_errors_raise_like_every_other_call(service):
    url, _ = service
    with pytest.raises(gl.BadRequest, match="group_by must be"):
        gl.Client(f"{url}/api", token="t").usage(group_by="nope")
    with pytest.raises(gl.NotFound) as info:  # an older service: no /usage
        gl.Client(f"{url}/old", token="t").usage()
    assert info.value.status == 404
