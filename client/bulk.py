"""Rows for :meth:`Collection.insert` from a table: a list of dicts, a pandas
DataFrame, or a file (Parquet, or JSON Lines: ``.jsonl``/``.ndjson``), read a batch
at a time (a file is never loaded whole).

A row's columns: ``id`` (optional), ``vector`` (or ``embedding``), ``text``, and
``metadata`` (a dict); without a ``metadata`` column every other column is metadata.
A row needs a vector or a text (a text alone is embedded by the collection's
endpoint; beside a vector it is kept as the hit's ``text``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

from .errors import BadRequest

VECTOR_KEYS = ("vector", "embedding")
KNOWN = ("id", "text", "metadata") + VECTOR_KEYS


def is_table(value) -> bool:
    """Whether ``insert``'s first argument is rows rather than vectors."""
    if isinstance(value, str | os.PathLike):
        return True
    if hasattr(value, "columns") and hasattr(value, "itertuples"):  # a DataFrame
        return True
    return isinstance(value, list) and bool(value) and isinstance(value[0], dict)


def batches(source, size: int) -> tuple[int | None, Iterator[list[dict]]]:
    """(rows in all, when known; the rows ``size`` at a time)."""
    if isinstance(source, str | os.PathLike):
        path = os.fspath(source)
        if path.endswith(".parquet"):
            return _parquet(path, size)
        if path.endswith((".jsonl", ".ndjson")):
            return _jsonl(path, size)
        raise BadRequest(400, f"{path}: insert reads .parquet or .jsonl files")
    if hasattr(source, "columns"):
        frame = source
        return len(frame), (
            frame.iloc[i : i + size].to_dict("records") for i in range(0, len(frame), size)
        )
    return len(source), (source[i : i + size] for i in range(0, len(source), size))


def _parquet(path: str, size: int):
    import pyarrow.parquet as pq

    f = pq.ParquetFile(path)
    return f.metadata.num_rows, (b.to_pylist() for b in f.iter_batches(batch_size=size))


def _jsonl(path: str, size: int):
    with open(path, "rb") as f:
        total = sum(1 for line in f if line.strip())

    def read():
        rows = []
        with open(path) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except ValueError as e:
                    raise BadRequest(400, f"{path}:{n} is not JSON: {e}") from None
                if len(rows) == size:
                    yield rows
                    rows = []
        if rows:
            yield rows

    return total, read()


def body_of(rows: list[dict], first: int) -> dict:
    """One request's body from rows (``first``: the first row's number, for errors)."""
    body: dict[str, list] = {}
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise BadRequest(400, f"row {first + i} is a {type(row).__name__}, not a dict")
        vector = next((row[k] for k in VECTOR_KEYS if row.get(k) is not None), None)
        text = row.get("text")
        if vector is None and text is None:
            raise BadRequest(400, f"row {first + i} has no vector (or embedding) and no text")
        metadata = row.get("metadata")
        if metadata is None:
            metadata = {k: _plain(v) for k, v in row.items() if k not in KNOWN}
        for key, value, present in (
            ("vectors", vector, vector is not None),
            ("texts", text, text is not None),
            ("ids", row.get("id"), row.get("id") is not None),
        ):
            if present:
                body.setdefault(key, []).append(
                    value.tolist() if hasattr(value, "tolist") else value
                )
        body.setdefault("metadata", []).append(metadata)
    for key in ("vectors", "texts", "ids"):
        if key in body and len(body[key]) != len(rows):
            raise BadRequest(
                400,
                f"rows {first}-{first + len(rows) - 1}: some have {key[:-1]} and some not; "
                "give every row one, or none",
            )
    return body


def _plain(value):
    """A DataFrame's or Parquet's cell as JSON (numpy numbers, timestamps)."""
    if hasattr(value, "item") and not hasattr(value, "__len__"):
        return value.item()
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if hasattr(value, "tolist"):
        return value.tolist()
    return value


def progress_bar(total: int | None, verb: str):
    """tqdm (a widget in a notebook) where it is installed, else a line on stderr."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _Line(total, verb)
    return tqdm(total=total, desc=verb, unit="rows")


class _Line:
    def __init__(self, total, verb):
        import sys

        self.total, self.verb, self.n, self.out = total, verb, 0, sys.stderr

    def update(self, n: int) -> None:
        self.n += n
        print(f"\r{self.verb}: {self.n}/{self.total or '?'} rows", end="", file=self.out)

    def close(self) -> None:
        print(file=self.out)
