"""The form fields of a model upload (``POST /deployments``) held in memory.

The model goes to disk as it comes; the other fields are kept in memory. The cap was
per field (64 KiB), so 4,000 fields of 64 KiB held 250 MiB: a field the route does not
read is now refused by name before a byte of it is kept, and the fields together are
held to 64 KiB.
"""

from __future__ import annotations

import pytest
from support.service import running_service
from tornado import web

from gpulab.service.endpoints.uploads import MAX_FIELD_BYTES, MultipartUpload

BOUNDARY = "gpulab-test-boundary"


def part(name: str, value: bytes, filename: str | None = None) -> bytes:
    file = f'; filename="{filename}"' if filename else ""
    head = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"{file}\r\n\r\n'
    return head.encode() + value + b"\r\n"


def form(*parts: bytes) -> bytes:
    return b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()


def parsed(tmp_path, body: bytes, fields=("spec",)) -> MultipartUpload:
    upload = MultipartUpload(BOUNDARY.encode(), str(tmp_path), "model", 1 << 20, fields=fields)
    for at in range(0, len(body), 4096):
        upload.feed(body[at : at + 4096])
    return upload


def test_spec_and_model_still_pass(tmp_path):
    upload = parsed(tmp_path, form(part("spec", b'{"name": "m"}'), part("model", b"tar", "m")))
    upload.finish()
    assert upload.fields == {"spec": b'{"name": "m"}'}
    with open(upload.file_path, "rb") as f:
        assert f.read() == b"tar"
    upload.cleanup()


def test_a_field_the_upload_does_not_take_is_refused_by_name(tmp_path):
    body = form(part("spec", b"{}"), part("junk-7", b"x" * 1000), part("model", b"tar", "m"))
    upload = parsed(tmp_path, body)
    with pytest.raises(web.HTTPError) as e:
        upload.finish()
    assert e.value.status_code == 400
    assert "'junk-7' is not one this upload takes" in e.value.log_message
    assert "'spec', 'model'" in e.value.log_message
    assert upload.fields == {"spec": b"{}"}  # nothing of it kept
    assert upload.file_path is None


def test_the_fields_together_are_held_to_the_cap(tmp_path):
    """Each field under 64 KiB, together over it: a 413 (with any field allowed)."""
    quarter = b"x" * (MAX_FIELD_BYTES // 4)
    body = form(*(part(f"f{i}", quarter) for i in range(4)), part("model", b"tar", "m"))
    upload = parsed(tmp_path, body, fields=None)
    with pytest.raises(web.HTTPError) as e:
        upload.finish()
    assert e.value.status_code == 413
    assert "'f3'" in e.value.log_message and "64 KiB in all" in e.value.log_message
    assert sum(map(len, upload.fields.values())) <= MAX_FIELD_BYTES


async def test_the_route_refuses_an_unknown_field_by_name(tmp_path):
    async with running_service(tmp_path / "svc") as svc:
        alice = svc.create_user("alice")
        body = form(
            part("spec", b'{"name": "m"}'),
            *(part(f"pad{i}", b"x" * (60 << 10)) for i in range(8)),
            part("model", b"tar", "model.tar"),
        )
        r = await svc.raw(
            "POST", "/deployments", alice, body, f"multipart/form-data; boundary={BOUNDARY}"
        )
        assert r.status_code == 400, r.text
        assert "'pad0' is not one this upload takes" in r.json()["error"]
