"""The model upload of ``POST /deployments``: multipart/form-data streamed to disk.

The body is parsed as it arrives (:class:`MultipartUpload`): small form fields
(the ``spec`` JSON) are kept in memory under a cap (:data:`MAX_FIELD_BYTES` all
together), a field the route does not read is refused by name before a byte of it
is kept, and the one file field (``model``) goes chunk by chunk into a private
spool file in the data dir.
Nothing is held whole in memory, and whatever happens (refusal, a client
that goes away) the spool file is removed by :meth:`MultipartUpload.cleanup`.

Problems found while streaming cannot be answered mid-body (tornado calls
``data_received`` for each chunk); they are remembered and raised when the
body is complete, by :meth:`MultipartUpload.finish`.
"""

from __future__ import annotations

import contextlib
import email.message
import os
import tempfile

from tornado import web

#: The form fields that are not a file (the deployment's JSON settings), together:
#: thousands of fields of 64 KiB each held 250 MiB when the cap was per field.
MAX_FIELD_BYTES = 64 << 10
#: The part headers of one field.
MAX_PART_HEADER_BYTES = 16 << 10


def boundary_of(content_type: str) -> bytes:
    msg = email.message.Message()
    msg["content-type"] = content_type
    if msg.get_content_type() != "multipart/form-data":
        raise web.HTTPError(
            400,
            "send multipart/form-data with a 'spec' field (JSON settings) "
            "and a 'model' file (a tar of the exported model directory); "
            "%deploy does this for you",
        )
    boundary = msg.get_param("boundary")
    if not isinstance(boundary, str) or not 0 < len(boundary) <= 200:
        raise web.HTTPError(400, "the multipart/form-data Content-Type has no usable boundary")
    return boundary.encode("latin-1", "replace")


def _disposition(header_block: bytes) -> tuple[str | None, str | None]:
    """(name, filename) of one part's Content-Disposition."""
    msg = email.message.Message()
    for line in header_block.decode("utf-8", "replace").split("\r\n"):
        key, sep, value = line.partition(":")
        if sep:
            msg[key.strip()] = value.strip()
    name = msg.get_param("name", header="content-disposition")
    filename = msg.get_param("filename", header="content-disposition")
    return (
        name if isinstance(name, str) else None,
        filename if isinstance(filename, str) else None,
    )


class MultipartUpload:
    """Parses a multipart/form-data body fed in chunks; ``file_field`` goes to ``spool_dir``."""

    def __init__(
        self,
        boundary: bytes,
        spool_dir: str,
        file_field: str,
        max_file_bytes: int,
        file_setting: str = "",
        fields: tuple[str, ...] | None = None,
    ):
        """``fields``: the names of the form fields (other than the file) the route
        reads; any other is refused (400, by name). None: any, up to the cap."""
        self._delimiter = b"\r\n--" + boundary
        # The body starts with the delimiter less its CRLF; pretend it had one.
        self._buf = bytearray(b"\r\n")
        self._state = "preamble"
        self._part: str | None = None
        self._part_is_file = False
        self._file = None
        self.file_field = file_field
        self.max_file_bytes = max_file_bytes
        self.file_setting = file_setting
        self.spool_dir = spool_dir
        self.known_fields = fields
        self.fields: dict[str, bytes] = {}
        self.field_bytes = 0  # of every field but the file, together
        self.file_path: str | None = None
        self.file_bytes = 0
        self.error: web.HTTPError | None = None

    # -- feeding ---------------------------------------------------------------------
    def feed(self, chunk: bytes) -> None:
        if self.error is not None or self._state == "done":
            return  # the rest is read and dropped; finish() says why
        self._buf += chunk
        try:
            self._parse()
        except web.HTTPError as e:
            self.error = e
            self._buf.clear()
            self._close_file()
            self._remove_file()

    def _parse(self) -> None:
        d = self._delimiter
        while True:
            if self._state in ("preamble", "body"):
                at = self._buf.find(d)
                if at < 0:
                    # Keep what could be the start of a delimiter split across chunks.
                    keep = len(d) - 1
                    if len(self._buf) > keep:
                        self._emit(bytes(self._buf[:-keep]))
                        del self._buf[:-keep]
                    return
                self._emit(bytes(self._buf[:at]))
                self._end_part()
                del self._buf[: at + len(d)]
                self._state = "after_delimiter"
            if self._state == "after_delimiter":
                if len(self._buf) < 2:
                    return
                if self._buf[:2] == b"--":
                    self._state = "done"
                    self._buf.clear()
                    return
                if self._buf[:2] != b"\r\n":
                    raise web.HTTPError(400, "malformed multipart/form-data body")
                del self._buf[:2]
                self._state = "headers"
            if self._state == "headers":
                end = self._buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(self._buf) > MAX_PART_HEADER_BYTES:
                        raise web.HTTPError(400, "a multipart part's headers are too long")
                    return
                self._start_part(bytes(self._buf[:end]))
                del self._buf[: end + 4]
                self._state = "body"

    def _start_part(self, headers: bytes) -> None:
        name, filename = _disposition(headers)
        if name is None:
            raise web.HTTPError(400, "a multipart part has no Content-Disposition name")
        if name in self.fields or (name == self.file_field and self.file_path is not None):
            raise web.HTTPError(400, f"the form field {name[:100]!r} is sent twice; send it once")
        if (
            name != self.file_field
            and self.known_fields is not None
            and name not in self.known_fields
        ):
            known = ", ".join(repr(f) for f in (*self.known_fields, self.file_field))
            raise web.HTTPError(
                400,
                f"the form field {name[:100]!r} is not one this upload takes; send only "
                f"{known} (%deploy does this for you)",
            )
        self._part = name
        self._part_is_file = name == self.file_field
        if self._part_is_file:
            os.makedirs(self.spool_dir, mode=0o700, exist_ok=True)
            fd, self.file_path = tempfile.mkstemp(prefix="upload-", dir=self.spool_dir)
            self._file = os.fdopen(fd, "wb")
        else:
            self.field_bytes += len(name)  # a name is held too (its part's headers: 16 KiB)
            if self.field_bytes > MAX_FIELD_BYTES:
                raise web.HTTPError(
                    413,
                    f"the form's fields are over {MAX_FIELD_BYTES >> 10} KiB in all; "
                    f"the settings are small JSON",
                )
            self.fields[name] = b""

    def _emit(self, data: bytes) -> None:
        if not data or self._state != "body":
            return  # the preamble is ignored, as RFC 2046 says
        if self._part_is_file:
            self.file_bytes += len(data)
            if self.file_bytes > self.max_file_bytes:
                raise too_large_upload(self.file_bytes, self.max_file_bytes, self.file_setting)
            self._file.write(data)
        else:
            self.field_bytes += len(data)
            if self.field_bytes > MAX_FIELD_BYTES:
                raise web.HTTPError(
                    413,
                    f"the form field {self._part[:100]!r} takes the form's fields over "
                    f"{MAX_FIELD_BYTES >> 10} KiB in all; the settings are small JSON",
                )
            self.fields[self._part] += data

    def _end_part(self) -> None:
        if self._state == "body" and self._part_is_file:
            self._close_file()
        self._part = None
        self._part_is_file = False

    # -- ending ------------------------------------------------------------------------
    def finish(self) -> None:
        """Raise what went wrong while streaming, or if the body ended early."""
        if self.error is not None:
            raise self.error
        if self._state != "done":
            self.cleanup()
            raise web.HTTPError(
                400, "the multipart/form-data body ended before its closing boundary; send it again"
            )

    def _close_file(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _remove_file(self) -> None:
        if self.file_path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.file_path)

    def cleanup(self) -> None:
        """Remove the spool file (always: after unpacking, on refusal, on a lost client)."""
        self._close_file()
        self._remove_file()


def too_large_upload(size: int, limit: int, setting: str) -> web.HTTPError:
    return web.HTTPError(
        413,
        f"the model upload is over {limit / 2**20:g} MiB (compressed); "
        f"export a smaller model or quantize it (%quantize); an admin "
        f"can raise c.GpuLabService.{setting}",
    )
