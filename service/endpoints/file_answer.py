"""An answer of the gateway's routes that is a file on disk, sent a chunk at a time:
a training file may be as large as its owner's quota (1 GiB), and however many
downloads run at once none is held whole in the service's memory."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

from gpulab.service.endpoints.openai_errors import OpenAIError

#: Read (in a thread) and written a chunk at a time.
CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class FileAnswer:
    path: str
    #: What the caller is told when the file is gone (deleted since it was found).
    gone: str = "the file was deleted"

    async def send(self, reply, status: int, kind: str) -> None:
        """The file on ``reply`` (a gateway ``Reply``), its length said first."""
        try:
            f = await asyncio.to_thread(open, self.path, "rb")
        except FileNotFoundError:
            raise OpenAIError(404, self.gone) from None
        try:
            size = os.fstat(f.fileno()).st_size
            headers = {"Content-Type": kind, "Cache-Control": "no-store"}
            await reply.start(status, {**headers, "Content-Length": str(size)})
            sent = 0
            while sent < size:
                chunk = await asyncio.to_thread(f.read, min(CHUNK_BYTES, size - sent))
                if not chunk:  # cut short since: the length said cannot be kept
                    raise ConnectionResetError(f"{self.path} ended at {sent} of {size} bytes")
                await reply.write(chunk)
                sent += len(chunk)
        finally:
            f.close()
