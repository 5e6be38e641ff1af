"""Tar headers that are no member of their own, as an attacker would send them.

Python's tarfile reads a GNU long name (``L``/``K``) or a pax header (``x``/``g``)
whole into memory before the member it describes, and follows a chain of them by
recursion: a small compressed archive declaring a 400 MiB long name, or thousands of
chained long names, cost gigabytes or a RecursionError (a 500) before the declared-size
cap saw a member. Each archive here declares just over the cap, so the tests stay small.
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile

import pytest

from gpulab.service.endpoints.model_archive import (
    MAX_EXTENSION_BYTES,
    MAX_HEADERS,
    ArchiveRefused,
    unpack_model,
)

CARD = json.dumps(
    {"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}], "max_batch_size": 8}
).encode()


def _padded(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % tarfile.BLOCKSIZE)


def _header(name: str, type_: bytes, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.type = type_
    info.size = size
    return info.tobuf(tarfile.USTAR_FORMAT)


def _member(name: str, data: bytes) -> bytes:
    return _header(name, tarfile.REGTYPE, len(data)) + _padded(data)


def _pax_record(keyword: str, value: str) -> bytes:
    """One well-formed pax record: "<len> <keyword>=<value>\\n"."""
    body = f" {keyword}={value}\n"
    length = len(body)
    while len(str(length)) + len(body) != length:
        length = len(str(length)) + len(body)
    return f"{length}{body}".encode()


def _archive(tmp_path, *parts: bytes) -> str:
    """A gzip tar of the raw parts, then a model the service would otherwise accept."""
    raw = b"".join(parts) + _member("model.json", CARD) + _member("model.pt2", b"pt2")
    raw += b"\0" * (2 * tarfile.BLOCKSIZE)
    path = tmp_path / "model.tar.gz"
    path.write_bytes(gzip.compress(raw, compresslevel=1))
    return str(path)


def _unpack(tmp_path, path: str):
    dest = tmp_path / "dest"
    dest.mkdir(exist_ok=True)
    return unpack_model(path, str(dest), 2**30)


def test_the_model_itself_still_unpacks(tmp_path):
    card = _unpack(tmp_path, _archive(tmp_path))
    assert card["max_batch_size"] == 8


def test_what_tarfile_writes_for_a_model_of_many_files_still_unpacks(tmp_path):
    """tarfile writes a pax header for every file it adds (its fractional mtime): 63
    files and their headers are under the limit on headers."""
    folder = tmp_path / "model"
    (folder / "hf").mkdir(parents=True)
    (folder / "model.json").write_bytes(CARD)
    (folder / "model.pt2").write_bytes(b"pt2")
    for i in range(61):
        (folder / "hf" / f"shard-{i}.safetensors").write_bytes(b"w")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for f in sorted(folder.rglob("*")):
            if f.is_file():
                tar.add(f, arcname=str(f.relative_to(folder)))
    path = tmp_path / "many.tar.gz"
    path.write_bytes(buf.getvalue())
    assert _unpack(tmp_path, str(path))["max_batch_size"] == 8


@pytest.mark.parametrize(
    ("type_", "words"),
    [(tarfile.GNUTYPE_LONGNAME, "GNU long-name"), (tarfile.GNUTYPE_LONGLINK, "GNU long-link")],
)
def test_a_gnu_long_name_over_the_cap_is_refused_before_it_is_read(tmp_path, type_, words):
    size = MAX_EXTENSION_BYTES + 1
    long_name = _header("././@LongLink", type_, size) + _padded(b"a" * (size - 1) + b"\0")
    with pytest.raises(ArchiveRefused) as e:
        _unpack(tmp_path, _archive(tmp_path, long_name, _member("junk", b"x")))
    assert e.value.status == 400
    assert words in str(e.value) and str(size) in str(e.value)


@pytest.mark.parametrize(
    ("type_", "words"),
    [(tarfile.XHDTYPE, "pax extended"), (tarfile.XGLTYPE, "pax global")],
)
def test_a_pax_header_over_the_cap_is_refused_before_it_is_read(tmp_path, type_, words):
    record = _pax_record("comment", "a" * MAX_EXTENSION_BYTES)
    pax = _header("././@PaxHeader", type_, len(record)) + _padded(record)
    with pytest.raises(ArchiveRefused) as e:
        _unpack(tmp_path, _archive(tmp_path, pax, _member("junk", b"x")))
    assert e.value.status == 400
    assert words in str(e.value)


def test_small_extension_headers_still_work(tmp_path):
    """A long name and a pax header under the cap: the member after them is read."""
    name = b"hf/" + b"c" * 120 + b"\0"
    long_name = _header("././@LongLink", tarfile.GNUTYPE_LONGNAME, len(name)) + _padded(name)
    record = _pax_record("comment", "a" * 100)
    pax = _header("././@PaxHeader", tarfile.XHDTYPE, len(record)) + _padded(record)
    _unpack(tmp_path, _archive(tmp_path, long_name, pax, _member("ignored", b"weights")))
    assert (tmp_path / "dest" / "hf" / ("c" * 120)).read_bytes() == b"weights"


def test_thousands_of_chained_long_names_are_a_400_not_a_recursion_error(tmp_path):
    """5,000 small ``L`` headers in a row: tarfile recursed once per header."""
    one = _header("././@LongLink", tarfile.GNUTYPE_LONGNAME, 2) + _padded(b"a\0")
    with pytest.raises(ArchiveRefused) as e:
        _unpack(tmp_path, _archive(tmp_path, one * 5000, _member("junk", b"x")))
    assert e.value.status == 400
    assert f"more than {MAX_HEADERS} tar headers" in str(e.value)


def test_extension_headers_count_toward_the_limit(tmp_path):
    """Small pax headers, each before a member to skip: members and headers together."""
    record = _pax_record("comment", "a" * 10)
    pax = _header("././@PaxHeader", tarfile.XHDTYPE, len(record)) + _padded(record)
    parts = [pax + _member(f"skip-{i}", b"") for i in range(40)]  # well under 64 members
    parts.append(pax * (MAX_HEADERS - 80))  # headers with no member of their own
    with pytest.raises(ArchiveRefused) as e:
        _unpack(tmp_path, _archive(tmp_path, *parts))
    assert f"more than {MAX_HEADERS} tar headers" in str(e.value)


def test_a_sparse_member_is_refused(tmp_path):
    sparse = _header("model.json", tarfile.GNUTYPE_SPARSE, len(CARD)) + _padded(CARD)
    with pytest.raises(ArchiveRefused) as e:
        _unpack(tmp_path, _archive(tmp_path, sparse))
    assert e.value.status == 400 and "sparse" in str(e.value)


def test_a_pax_sparse_map_is_refused(tmp_path):
    """GNU sparse 1.0 in a pax header: tarfile reads a map of any length from the data."""
    records = _pax_record("GNU.sparse.major", "1") + _pax_record("GNU.sparse.minor", "0")
    pax = _header("././@PaxHeader", tarfile.XHDTYPE, len(records)) + _padded(records)
    sparse_map = _padded(b"100000000\n" + b"0\n" * 200)
    with pytest.raises(ArchiveRefused) as e:
        _unpack(tmp_path, _archive(tmp_path, pax, _member("junk", b"") + sparse_map))
    assert e.value.status == 400 and "sparse" in str(e.value)
