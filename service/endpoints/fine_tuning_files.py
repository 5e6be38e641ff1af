"""Training files of the fine-tuning API (``<hub>/services/gpulab/v1/files``).

A file is uploaded as OpenAI's clients send it (multipart: ``file`` and
``purpose=fine-tune``), checked line by line before it is kept (a bad line is a
400 naming its number, so nothing is queued on a file that cannot train), and
stored under ``<data_dir>/fine_tuning/files/<id>.jsonl`` (the service's only,
``0600``); its row (:mod:`gpulab.db.fine_tuning`) says whose it is. A file is its
owner's: to anyone else it does not exist (404).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import threading
import uuid

from tornado.httputil import HTTPFile, parse_body_arguments

from gpulab.db.fine_tuning import FineTuningStore
from gpulab.service.endpoints.openai_errors import OpenAIError

PURPOSE = "fine-tune"
#: The roles a training example's messages may have (OpenAI's chat format).
ROLES = ("system", "developer", "user", "assistant")
#: Most examples one file may hold.
MAX_EXAMPLES = 100_000
#: What a multipart upload holds besides its file, at most (boundaries, part headers,
#: the purpose field): the quota's check before parsing counts the file alone.
UPLOAD_ENVELOPE_BYTES = 64 << 10


def epoch(when) -> int:
    """Seconds since 1970 of a stored time (SQLite gives it back without its zone: UTC)."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp())


def not_found(kind: str, ident: str) -> OpenAIError:
    """404 for one that does not exist and one of another user's alike."""
    return OpenAIError(404, f"No such {kind}: '{ident}'.", code="not_found")


def listed_user(who, user: str | None, what: str) -> str:
    """Whose ``what`` a listing with ``?user=`` is of: users their own (another's: 403),
    admins and the service (removing a hub user) anyone's."""
    if user is None or user == who.name:
        return who.name
    if not (who.admin or who.internal):
        raise OpenAIError(403, f"you can only list your own {what}", param="user")
    return user


def _line_error(n: int, why: str) -> OpenAIError:
    return OpenAIError(
        400,
        f"training file line {n}: {why}; each line must be a JSON object "
        '{"messages": [{"role": "user", "content": "..."}, {"role": "assistant", '
        '"content": "..."}]}',
        param="file",
        code="invalid_training_file",
    )


def check_example(n: int, line: str) -> None:
    """One line of a training file: a chat whose messages have known roles, string
    contents, and an assistant reply to learn from."""
    try:
        doc = json.loads(line)
    except json.JSONDecodeError as e:
        raise _line_error(n, f"not JSON ({e.msg} at column {e.colno})") from None
    except ValueError as e:  # an integer of thousands of digits
        raise _line_error(n, f"not JSON ({e})") from None
    except RecursionError:
        raise _line_error(n, "not JSON (arrays or objects nested too deeply)") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("messages"), list):
        raise _line_error(n, 'no "messages" list')
    messages = doc["messages"]
    if not messages:
        raise _line_error(n, '"messages" is empty')
    for i, m in enumerate(messages, 1):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            role = m.get("role") if isinstance(m, dict) else None
            raise _line_error(n, f"message {i} has role {role!r}, not one of {', '.join(ROLES)}")
        if not isinstance(m.get("content"), str):
            raise _line_error(n, f"message {i} ({m['role']}) has no string content")
    if not any(m["role"] == "assistant" and m["content"] for m in messages):
        raise _line_error(n, "no assistant message to learn from")


def check_training_file(data: bytes) -> int:
    """The number of examples in ``data``; OpenAIError 400 naming the first bad line."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise _line_error(line, "not UTF-8") from None
    count = 0
    # JSONL's lines end at "\n" only: splitlines() would also cut at U+2028, U+2029
    # and U+0085, which JSON allows inside a string.
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        check_example(n, line)
        count += 1
        if count > MAX_EXAMPLES:
            raise OpenAIError(
                400, f"the training file has over {MAX_EXAMPLES} examples; split it", param="file"
            )
    if not count:
        raise OpenAIError(400, "the training file has no examples (JSONL lines)", param="file")
    return count


#: Characters JSON allows raw inside a string that Python's ``str.splitlines`` (the
#: training loop's) takes for line ends.
_LINE_ENDS_IN_STRINGS = {"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"}


def for_training(data: bytes) -> bytes:
    """A checked training file as the job gets it: the same examples, with the few
    characters a string may hold raw that ``splitlines()`` would cut at written as
    JSON escapes (in a checked file they are only ever inside strings)."""
    text = data.decode("utf-8")
    if not any(ch in text for ch in _LINE_ENDS_IN_STRINGS):
        return data
    for ch, escaped in _LINE_ENDS_IN_STRINGS.items():
        text = text.replace(ch, escaped)
    return text.encode("utf-8")


def parse_upload(body: bytes | None, content_type: str) -> tuple[HTTPFile, str]:
    """The ``file`` part and the ``purpose`` of a multipart upload; 400 if missing."""
    if not content_type.lower().startswith("multipart/form-data"):
        raise OpenAIError(
            400,
            "upload the file as multipart/form-data with fields file and purpose "
            "(client.files.create(file=open('train.jsonl', 'rb'), purpose='fine-tune'))",
        )
    arguments: dict[str, list[bytes]] = {}
    files: dict[str, list[HTTPFile]] = {}
    parse_body_arguments(content_type, body or b"", arguments, files)
    if not files.get("file"):
        raise OpenAIError(400, "the upload has no file part named 'file'", param="file")
    purpose = b"".join(arguments.get("purpose", [])[:1]).decode("utf-8", "replace")
    return files["file"][0], purpose


class TrainingFiles:
    """Users' training files: the rows in ``store``, the bytes in ``folder``; each
    user's together at most ``quota_mib``."""

    def __init__(self, store: FineTuningStore, folder: str, quota_mib: int):
        self.store = store
        self.folder = folder
        self.quota_mib = quota_mib
        #: Each user's uploads are counted against their quota one at a time (one
        #: user's upload being written never holds another's).
        self._adding: dict[str, threading.Lock] = {}
        self._locks = threading.Lock()
        os.makedirs(folder, mode=0o700, exist_ok=True)

    def path(self, fid: str) -> str:
        return os.path.join(self.folder, f"{fid}.jsonl")

    def create(self, who, upload: HTTPFile, purpose: str) -> dict:
        if purpose != PURPOSE:
            raise OpenAIError(
                400,
                f"purpose {purpose!r}: this service keeps files for fine-tuning only; "
                f"send purpose={PURPOSE}",
                param="purpose",
            )
        lines = check_training_file(upload.body)
        with self._lock_of(who.name):
            self.check_quota(who, len(upload.body))
            fid = f"file-{uuid.uuid4().hex[:24]}"
            fd = os.open(self.path(fid), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(upload.body)
            filename = os.path.basename(upload.filename or "train.jsonl")[:255] or "train.jsonl"
            return self.store.add_file(
                {
                    "id": fid,
                    "user": who.name,
                    "filename": filename,
                    "purpose": purpose,
                    "bytes": len(upload.body),
                    "lines": lines,
                }
            )

    def _lock_of(self, user: str) -> threading.Lock:
        with self._locks:
            return self._adding.setdefault(user, threading.Lock())

    def check_upload(self, who, body_bytes: int) -> None:
        """:meth:`check_quota` for a multipart body of ``body_bytes``, before it is
        parsed: less its envelope (boundaries, headers, the purpose field), so a file
        that fits exactly is not refused for the envelope around it."""
        self.check_quota(who, max(0, body_bytes - UPLOAD_ENVELOPE_BYTES))

    def check_quota(self, who, size: int) -> None:
        """413 if ``size`` more bytes would pass ``who``'s quota (before an upload is
        parsed, and again under their lock before it is kept)."""
        used = self.store.file_bytes(who.name)
        if used + size > self.quota_mib << 20:
            raise OpenAIError(
                413,
                f"this file is {size / 2**20:.1f} MiB and your training files hold "
                f"{used / 2**20:.1f} MiB of your {self.quota_mib} MiB; delete files you no "
                f"longer need (client.files.delete(file_id)) or ask an admin to raise "
                f"c.LlmSettings.training_files_quota_mib",
                param="file",
                code="storage_quota_exceeded",
            )

    def get(self, who, fid: str) -> dict:
        row = self.store.file(fid)
        if row is None or not who.can_act_for(row["user"]):
            raise not_found("file", fid)
        return row

    def list(self, who, user: str | None = None) -> list[dict]:
        """The caller's files, or (admins and the service: ``?user=``) ``user``'s."""
        return self.store.files(listed_user(who, user, "files"))

    def read(self, row: dict) -> bytes:
        with open(self.path(row["id"]), "rb") as f:
            return f.read()

    def delete(self, who, fid: str) -> None:
        row = self.get(who, fid)
        self.store.remove_file(row["id"])
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(row["id"]))


def file_object(row: dict) -> dict:
    """A file as OpenAI's API shows it."""
    return {
        "id": row["id"],
        "object": "file",
        "bytes": row["bytes"],
        "created_at": epoch(row["created"]),
        "filename": row["filename"],
        "purpose": row["purpose"],
        "status": "processed",
        "status_details": None,
    }
