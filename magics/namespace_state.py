"""Save one kernel's user namespace to a file and put it back: what hibernate runs.

An idle notebook's kernels write their variables to the user's own files, the
server stops (its GPU slice goes back to the pool), and on wake each kernel reads
its file back. This module is the kernel-side half for ONE kernel:
``user_variables`` picks the names worth saving, ``save_namespace`` writes them,
``load_namespace`` puts them back. It runs inside the user's kernel, so it imports
only the standard library, cloudpickle and gpulab's size words; torch only when the
user imported it (to save) or the file holds tensors (to load).

Why cloudpickle with one shared memo, and not the two tools made for this:

- ``dill.dump_session`` pickles the whole session as one object: a single
  unpicklable value (a generator, an open file) fails the whole save, and nothing
  comes back.
- Kishu checkpoints after every cell: it costs something on every cell of every
  notebook, and needs its own store and an init per notebook, for a state we
  only need when a server goes idle.
- cloudpickle is a well-kept library (Ray, Dask and PySpark ship functions with
  it) on the C pickler, and pickles what a notebook defines (functions, classes,
  lambdas, closures from ``__main__``) by value.

Each variable is its own pickle (so one that cannot be saved is skipped, with a
reason, and the rest are saved), but all of them go through ONE pickler, so the
memo is shared: an object reachable from several variables (a model and its
optimizer's parameters, ``b = a``) is written once and comes back as one object.
A variable that fails rolls the memo back to where it was before it.

Notebook functions and classes come back bound to the namespace they are loaded
into (not to a private copy of the globals they saw), so they keep seeing the
notebook's current variables, as before the hibernate.

Tensors (``torch.Tensor`` and ``torch.nn.Parameter``: strided, not quantized)
are written as their storage's raw bytes, out of band (protocol 5 buffers), straight
from the tensor's memory to the file (a GPU storage goes through one CPU copy at a
time); tensors that share a storage (views, ``model.state_dict()``) share it again
after the load. Tensors that were on a GPU go back to the GPU, or to the CPU
(counted) when the machine has none. numpy arrays go in band, without copies too.

File format (version 1)::

    b"GPULAB-NS 1\\n"
    a record per saved variable: its tensor storages' raw bytes (out-of-band
        buffers), then an 8-byte little-endian length and one pickle
    the index: UTF-8 JSON (per variable: name, pickle offset and length, buffer
        offsets and lengths, memo range, GPU tensor count; the skipped names and
        why; never a pickle)
    the trailer: 8-byte little-endian length of the index, then b"NSINDEX\\n"

The index is at the end because it is only known once every variable is written;
the file is written under a temporary name, 0600 from its creation, and renamed
into place when complete, so a reader never sees half a file.
"""

from __future__ import annotations

import functools
import io
import json
import os
import pickle
import pickletools
import platform
import re
import secrets
import socket
import struct
import sys
import threading
import time
import types
from collections.abc import Iterable, Mapping
from contextlib import suppress
from dataclasses import dataclass, field

import cloudpickle

from gpulab.training.sizes import size_words

__all__ = [
    "LoadReport",
    "SaveReport",
    "StateTooLarge",
    "load_namespace",
    "save_namespace",
    "user_variables",
]

MAGIC = b"GPULAB-NS 1\n"
FORMAT = 1
_TRAILER = struct.Struct("<Q8s")
_TRAILER_TAG = b"NSINDEX\n"
_LEN = struct.Struct("<Q")
_PROTOCOL = 5

# --------------------------------------------------------------------------------------
# Which names are the user's
# --------------------------------------------------------------------------------------

_IPYTHON_NAMES = frozenset(
    {
        "In",
        "Out",
        "exit",
        "quit",
        "get_ipython",
        "_",
        "__",
        "___",
        "_i",
        "_ii",
        "_iii",
        "_ih",
        "_oh",
        "_dh",
        "_exit_code",
    }
)
_NUMBERED = re.compile(r"_i?\d+")


def user_variables(shell) -> dict[str, object]:
    """The names worth saving in an IPython shell's namespace, in insertion order.

    Everything in ``shell.user_ns`` except IPython's own: names it hides
    (``shell.user_ns_hidden``, when the value is still the one it put there),
    ``In``/``Out``/``exit``/``quit``/``get_ipython``, the output and input history
    (``_``, ``__``, ``___``, ``_i``, ``_ii``, ``_iii``, ``_<N>``, ``_i<N>``, ``_ih``,
    ``_oh``, ``_dh``, ``_exit_code``) and dunder names (``__name__``, ``__builtins__``).
    """
    hidden = getattr(shell, "user_ns_hidden", None) or {}
    out: dict[str, object] = {}
    for name, value in shell.user_ns.items():
        if name in _IPYTHON_NAMES or _NUMBERED.fullmatch(name):
            continue
        if len(name) > 4 and name.startswith("__") and name.endswith("__"):
            continue
        if name in hidden and hidden[name] is value:
            continue
        out[name] = value
    return out


# --------------------------------------------------------------------------------------
# Reports
# --------------------------------------------------------------------------------------


@dataclass
class SaveReport:
    saved: list[str]
    skipped: list[tuple[str, str]]
    bytes: int
    seconds: float

    def to_json(self) -> dict:
        return {
            "saved": list(self.saved),
            "skipped": [{"name": n, "why": w} for n, w in self.skipped],
            "bytes": self.bytes,
            "seconds": self.seconds,
        }


@dataclass
class LoadReport:
    restored: list[str]
    failed: list[tuple[str, str]]
    seconds: float
    device: str
    moved_to_cpu: int
    #: False when the caller chose the device: then "no GPU here" is not said.
    auto_device: bool = field(default=True, repr=False)

    def to_json(self) -> dict:
        return {
            "restored": list(self.restored),
            "failed": [{"name": n, "why": w} for n, w in self.failed],
            "seconds": self.seconds,
            "device": self.device,
            "moved_to_cpu": self.moved_to_cpu,
        }

    def line(self, name: str) -> str:
        """One short line for the notebook, e.g. ``analysis.ipynb: 12 of 14
        variables back in 1.3 s; not back: gen (a generator cannot be saved: run
        its cell again)``."""
        total = len(self.restored) + len(self.failed)
        took = f"{self.seconds:.1f} s" if self.seconds >= 0.1 else "under 0.1 s"
        text = f"{name}: {len(self.restored)} of {total} variables back in {took}"
        if self.failed:
            shown = ", ".join(f"{n} ({why})" for n, why in self.failed[:4])
            more = len(self.failed) - 4
            text += f"; not back: {shown}" + (f" and {more} more" if more > 0 else "")
        if self.moved_to_cpu:
            text += "; GPU tensors on the CPU" + (" (no GPU here)" if self.auto_device else "")
        return text


class StateTooLarge(Exception):
    """The variables would make a file over the cap; nothing was written."""

    def __init__(self, cap: int):
        self.cap = cap
        super().__init__(f"the state is over the cap of {size_words(cap)}")


# --------------------------------------------------------------------------------------
# Why a value cannot be saved
# --------------------------------------------------------------------------------------

_RUN_AGAIN = "run its cell again"
_FILE = ("an open file", "open it again")
_LOCK = ("a thread or lock", "create it again")
_DB = ("a database connection", "connect again")
#: type name in "cannot pickle 'X' object" -> (what it is, what to do)
_FRIENDLY_NAMES = {
    "generator": ("a generator", _RUN_AGAIN),
    "coroutine": ("a coroutine", _RUN_AGAIN),
    "async_generator": ("an async generator", _RUN_AGAIN),
    "TextIOWrapper": _FILE,
    "BufferedReader": _FILE,
    "BufferedWriter": _FILE,
    "BufferedRandom": _FILE,
    "FileIO": _FILE,
    "socket": ("a socket", "connect it again"),
    "_thread.lock": _LOCK,
    "_thread.RLock": _LOCK,
    "_thread._local": _LOCK,
    "Thread": _LOCK,
    "sqlite3.Connection": _DB,
    "sqlite3.Cursor": _DB,
}
_DB_MODULES = frozenset(
    {"sqlite3", "psycopg", "psycopg2", "pymysql", "MySQLdb", "sqlalchemy", "duckdb", "pymongo"}
)
_DB_WORDS = ("connection", "cursor", "engine", "session", "client")
_LOCK_TYPES = (type(threading.Lock()), type(threading.RLock()), threading.Thread)
_MEMORY_IO = (io.BytesIO, io.StringIO)


def _unsavable_kind(t: type) -> tuple[str, str] | None:
    """(what it is, what to do) when values of type ``t`` can never be saved."""
    if issubclass(t, types.GeneratorType):
        return _FRIENDLY_NAMES["generator"]
    if issubclass(t, types.CoroutineType):
        return _FRIENDLY_NAMES["coroutine"]
    if issubclass(t, types.AsyncGeneratorType):
        return _FRIENDLY_NAMES["async_generator"]
    if issubclass(t, io.IOBase) and not issubclass(t, _MEMORY_IO):
        return _FILE
    if issubclass(t, socket.socket):
        return _FRIENDLY_NAMES["socket"]
    if issubclass(t, _LOCK_TYPES):
        return _LOCK
    module = getattr(t, "__module__", "") or ""
    if module.split(".")[0] in _DB_MODULES and any(w in t.__name__.lower() for w in _DB_WORDS):
        return _DB
    return None


class _Unsavable(pickle.PicklingError):
    def __init__(self, kind: tuple[str, str]):
        self.kind = kind
        super().__init__(f"{kind[0]} cannot be saved")


def _why_not_saved(value: object, exc: BaseException) -> str:
    kind = exc.kind if isinstance(exc, _Unsavable) else None
    if kind is None:
        m = re.search(r"cannot pickle '([\w.]+)' object", str(exc))
        kind = _FRIENDLY_NAMES.get(m.group(1)) if m else None
    if kind is not None:
        noun, fix = kind
        if _unsavable_kind(type(value)) == kind:
            return f"{noun} cannot be saved: {fix}"
        return f"it holds {noun}, which cannot be saved: {fix}"
    if isinstance(exc, RecursionError) or "recursion" in str(exc):
        return f"{type(value).__name__} cannot be saved: it is nested too deeply"
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return f"{type(value).__name__} cannot be saved: {first[:200]}"


# --------------------------------------------------------------------------------------
# Saving
# --------------------------------------------------------------------------------------


def _was_on_gpu(tensor) -> bool:
    """Whether a tensor's bytes live on an accelerator. A seam: the tests replace
    it to write CPU tensors as if they had been on a GPU (no GPU there)."""
    return tensor.device.type != "cpu"


_LRU_CACHE_WRAPPER = type(functools.lru_cache(maxsize=None)(len))


def _rebuild_lru_cache(func, maxsize, typed):
    return functools.wraps(func)(functools.lru_cache(maxsize=maxsize, typed=typed)(func))


class _Namespace:
    """Stands for a notebook's global namespace in a pickle; loads as the dict the
    variables are loaded into, so notebook functions see the live namespace."""

    def __reduce__(self):
        return (_loading_namespace, ())


_NAMESPACE = _Namespace()


class _StorageRef:
    """One tensor storage, written once however many tensors use it.

    Its bytes are copied to the CPU (when on a GPU) only while the pickler writes
    them, out of band, straight into the file: a GPU copy lives for one storage at
    a time, not for the whole save."""

    __slots__ = ("storage", "on_gpu")

    def __init__(self, storage, on_gpu: bool):
        self.storage, self.on_gpu = storage, on_gpu


class _Sink:
    """What the pickler writes to: the current variable's chunks, kept by
    reference (a large array's bytes arrive as one buffer, not copied)."""

    __slots__ = ("chunks", "size", "base", "cap", "file", "buffers", "error")

    def __init__(self, file, cap: int | None):
        self.file = file
        self.cap = cap
        self.start(0)

    def start(self, base: int) -> None:
        self.chunks: list = []
        self.buffers: list[list[int]] = []  # [offset, length] written out of band
        self.size = 0
        self.base = base
        self.error: OSError | None = None

    def write_now(self, buf) -> None:
        """A tensor storage's bytes, out of band: to the file at once (the record's
        stream follows its buffers; a failed variable is truncated away)."""
        view = memoryview(buf).cast("B")
        n = len(view)
        if self.cap is not None and self.base + self.size + n > self.cap:
            raise StateTooLarge(self.cap)
        self.file.write(view)
        self.buffers.append([self.base + self.size, n])
        self.size += n

    def write(self, data) -> int:
        if type(data) is not bytes:
            data = memoryview(data)
            if data.obj is None:  # a view of memory the pickler may free: copy it
                data = bytes(data)
            elif data.ndim != 1 or data.format != "B":
                data = data.cast("B")
        n = len(data)
        self.size += n
        if self.cap is not None and self.base + self.size > self.cap:
            raise StateTooLarge(self.cap)
        self.chunks.append(data)
        return n

    def tail(self, n: int) -> bytes:
        out = b""
        for chunk in reversed(self.chunks):
            out = bytes(chunk[-(n - len(out)) :]) + out
            if len(out) >= n:
                break
        return out


def _memo_end(tail: bytes) -> int:
    """The memo length after a record ``(value, probe, probe)``: its tail is
    ``EMPTY_LIST MEMOIZE GET(idx) TUPLE3 MEMOIZE STOP``, probe at idx, tuple at idx+1."""
    if tail[-3:] == b"\x87\x94." and tail[-7:-4] == b"]\x94h":
        return tail[-4] + 2
    if tail[-3:] == b"\x87\x94." and tail[-10:-7] == b"]\x94j":
        return int.from_bytes(tail[-7:-3], "little") + 2
    raise AssertionError(f"unexpected record tail {tail!r}")  # pragma: no cover


class _Pickler(cloudpickle.Pickler):
    def __init__(self, sink: _Sink):
        super().__init__(sink, protocol=_PROTOCOL, buffer_callback=self._buffer)
        self._sink = sink
        # The PickleBuffers that go out of band, by id (held, so no id is reused).
        self.ours: dict[int, pickle.PickleBuffer] = {}
        self._kinds: dict[type, object] = {}
        torch = sys.modules.get("torch")
        self._tensor_types = (
            (torch.Tensor, torch.nn.Parameter) if torch is not None and hasattr(torch, "nn") else ()
        )
        self._storages: dict[tuple, tuple[_StorageRef, object]] = {}
        self.var_gpu_tensors = 0

    def _buffer(self, pb) -> bool:
        if self.ours.pop(id(pb), None) is None:
            return True  # numpy's and others': in band, in the stream
        try:
            self._sink.write_now(pb)
        except OSError as exc:  # the disk is full: not this variable's fault
            self._sink.error = exc
            raise
        return False

    def reducer_override(self, obj):
        t = type(obj)
        kind = self._kinds.get(t)
        if kind is None:
            if t in self._tensor_types:
                kind = "tensor"
            elif t is _StorageRef:
                kind = "storage"
            elif t is _LRU_CACHE_WRAPPER:
                kind = "lru_cache"
            else:
                kind = _unsavable_kind(t) or "plain"
            self._kinds[t] = kind
        if kind == "plain":
            if t is types.FunctionType:
                g = obj.__globals__
                if id(g) not in self.globals_ref and g.get("__name__") == "__main__":
                    self.globals_ref[id(g)] = _NAMESPACE
            return super().reducer_override(obj)
        if kind == "tensor":
            reduced = self._reduce_tensor(obj)
            return super().reducer_override(obj) if reduced is None else reduced
        if kind == "storage":
            return self._reduce_storage(obj)
        if kind == "lru_cache":
            # An @functools.lru_cache function of the notebook: pickle would write a
            # reference to __main__.<name>, which a fresh kernel does not have yet.
            # Its function is written by value instead; its cache is not kept.
            if getattr(obj, "__module__", None) != "__main__":
                return super().reducer_override(obj)
            params = obj.cache_parameters()
            return (_rebuild_lru_cache, (obj.__wrapped__, params["maxsize"], params["typed"]))
        raise _Unsavable(kind)

    def _reduce_tensor(self, t):
        import torch

        if (
            t.layout is not torch.strided
            or t.is_quantized
            or t.is_nested
            or t.device.type == "meta"
        ):
            return None
        if t.is_conj() or t.is_neg():
            t = t.resolve_conj().resolve_neg()
        storage = t.untyped_storage()
        key = (str(storage.device), storage.data_ptr(), storage.nbytes())
        held = self._storages.get(key)
        on_gpu = _was_on_gpu(t)
        if held is None:
            # Holding the storage keeps its address from being reused while we run.
            self._storages[key] = held = (_StorageRef(storage, on_gpu), storage)
        if on_gpu:
            self.var_gpu_tensors += 1
        attrs = dict(t.__dict__) if t.__dict__ else None
        return (
            _rebuild_tensor,
            (
                held[0],
                str(t.dtype).removeprefix("torch."),
                t.storage_offset(),
                tuple(t.shape),
                tuple(t.stride()),
                bool(t.requires_grad),
                type(t) is torch.nn.Parameter,
                attrs,
            ),
        )

    def _reduce_storage(self, ref: _StorageRef):
        import torch

        sink = self._sink
        nbytes = ref.storage.nbytes()
        if sink.cap is not None and sink.base + sink.size + nbytes > sink.cap:
            raise StateTooLarge(sink.cap)  # before copying anything off a GPU
        u8 = torch.empty(0, dtype=torch.uint8, device=ref.storage.device).set_(ref.storage)
        if u8.device.type != "cpu":
            u8 = u8.cpu()
        pb = pickle.PickleBuffer(u8.numpy())
        self.ours[id(pb)] = pb
        # Not in the args (a tuple, which the memo would keep alive), in the state:
        # the loaded object receives the bytes through __setstate__.
        return (_LoadedStorage, (ref.on_gpu,), pb)


def _rollback(pickler: _Pickler, length: int) -> None:
    memo = pickler.memo.copy()
    pickler.memo = {k: v for k, v in memo.items() if v[0] < length}


def save_namespace(
    variables: Mapping[str, object],
    path: str,
    *,
    max_bytes: int | None = None,
    not_back: Iterable[tuple[str, str]] = (),
) -> SaveReport:
    """Write ``variables`` to ``path``: atomically (a 0600 temporary file in the same
    folder, then renamed), each variable its own pickle through one shared pickler.

    A variable that cannot be saved is skipped with a reason (``SaveReport.skipped``).
    ``not_back``: (name, why) of variables an earlier hibernation held that are still
    not back; they are kept among the skipped, so a wake counts against them too.
    Raises ``StateTooLarge`` (nothing left behind) if the file would exceed
    ``max_bytes``; an ``OSError`` (folder missing, disk full) removes the temporary
    file and propagates.
    """
    start = time.perf_counter()
    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
    saved: list[str] = []
    skipped: list[tuple[str, str]] = []
    carried = [(n, why) for n, why in not_back if n not in variables]
    records: list[dict] = []
    try:
        with open(fd, "wb", buffering=1 << 20) as f:
            f.write(MAGIC)
            pos = len(MAGIC)
            sink = _Sink(f, max_bytes)
            pickler = _Pickler(sink)
            memo_len = 0
            for name, value in variables.items():
                sink.start(pos)
                pickler.var_gpu_tensors = 0
                probe: list = []
                try:
                    pickler.dump((value, probe, probe))
                except StateTooLarge:
                    raise
                except Exception as exc:
                    if sink.error is not None:  # the disk, not the variable
                        raise sink.error from None
                    sink.chunks = []
                    if sink.buffers:  # its tensors' bytes went out already
                        f.flush()
                        f.seek(pos)
                        f.truncate()
                    pickler.ours.clear()
                    _rollback(pickler, memo_len)
                    skipped.append((name, _why_not_saved(value, exc)))
                    continue
                end = _memo_end(sink.tail(16))
                stream = sink.size - sum(n for _, n in sink.buffers)
                f.write(_LEN.pack(stream))
                for chunk in sink.chunks:
                    f.write(chunk)
                sink.chunks = []
                records.append(
                    {
                        "name": name,
                        "offset": pos + sink.size - stream + _LEN.size,
                        "length": stream,
                        "buffers": sink.buffers,
                        "memo": [memo_len, end],
                        "gpu_tensors": pickler.var_gpu_tensors,
                    }
                )
                saved.append(name)
                pos += sink.size + _LEN.size
                memo_len = end
            del pickler
            skipped += carried
            torch = sys.modules.get("torch")
            index = json.dumps(
                {
                    "format": FORMAT,
                    "order": [*variables, *(n for n, _ in carried)],
                    "variables": records,
                    "skipped": [{"name": n, "why": w} for n, w in skipped],
                    "saved_at": time.time(),
                    "python": platform.python_version(),
                    "cloudpickle": cloudpickle.__version__,
                    "torch": getattr(torch, "__version__", None),
                }
            ).encode()
            pos += len(index) + _TRAILER.size
            if max_bytes is not None and pos > max_bytes:
                raise StateTooLarge(max_bytes)
            f.write(index)
            f.write(_TRAILER.pack(len(index), _TRAILER_TAG))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with suppress(OSError):
            os.unlink(tmp)
        raise
    with suppress(OSError):
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    return SaveReport(saved, skipped, pos, time.perf_counter() - start)


# --------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------


class _LoadState:
    """What the rebuild functions need during one load (a kernel loads once)."""

    def __init__(self, namespace: dict, device: str):
        self.namespace = namespace
        self.device = device
        self.moved = 0


_LOADING: _LoadState | None = None


def _loading_namespace() -> dict:
    return _LOADING.namespace if _LOADING is not None else {}


class _LoadedStorage:
    """A tensor storage as loaded: its bytes arrive out of band, via __setstate__."""

    __slots__ = ("storage", "on_gpu")

    def __init__(self, on_gpu: bool):
        self.on_gpu = on_gpu
        self.storage = None

    def __setstate__(self, u8) -> None:
        if self.on_gpu:
            device = _LOADING.device if _LOADING is not None else _auto_device(_torch())
            if device != "cpu":
                u8 = u8.to(device)
        self.storage = u8.untyped_storage()


def _torch():
    import torch

    return torch


def _rebuild_tensor(storage_info, dtype, offset, shape, stride, requires_grad, is_param, attrs):
    import torch

    storage, on_gpu = storage_info.storage, storage_info.on_gpu
    t = torch.empty((0,), dtype=getattr(torch, dtype), device=storage.device)
    t.set_(storage, offset, shape, stride)
    if on_gpu and storage.device.type == "cpu" and _LOADING is not None:
        _LOADING.moved += 1
    if is_param:
        t = torch.nn.Parameter(t, requires_grad=requires_grad)
    elif requires_grad:
        t.requires_grad_(True)
    if attrs:
        t.__dict__.update(attrs)
    return t


def _auto_device(torch) -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


class _Gone(Exception):
    pass


class _Unpickler(pickle.Unpickler):
    _prime: list = []

    def persistent_load(self, pid):  # only the priming pickle of _fresh_unpickler has any
        return self._prime[pid]

    def find_class(self, module, name):
        try:
            return super().find_class(module, name)
        except ModuleNotFoundError as exc:
            if exc.name and module.startswith(exc.name):
                raise _Gone(f"its module {exc.name} is gone") from exc
            raise
        except AttributeError as exc:
            what = "its class " if name[:1].isupper() else ""
            raise _Gone(f"{what}{module}.{name} is gone") from exc


class _Buffers:
    """The out-of-band buffers of the record being loaded, read from the file as the
    unpickler reaches them, each into a new CPU tensor (no copy after the read)."""

    def __init__(self, f):
        self.f = f
        self.pending: list[list[int]] = []

    def __iter__(self):
        return self

    def __next__(self):
        import torch

        if not self.pending:
            raise ValueError("the record refers to more tensor buffers than it has")
        offset, n = self.pending.pop(0)
        u8 = torch.empty(n, dtype=torch.uint8)
        if n:
            here = self.f.tell()
            self.f.seek(offset)
            view = memoryview(u8.numpy())
            got = 0
            while got < n:
                r = self.f.readinto(view[got:])
                if not r:
                    raise ValueError("the namespace file is truncated")
                got += r
            self.f.seek(here)
        return u8


class _Window:
    """The file as the unpickler sees it: one record, no further."""

    def __init__(self, f):
        self.f = f
        self.left = 0

    def open(self, offset: int, length: int) -> None:
        self.f.seek(offset)
        self.left = length

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0 or n > self.left:
            n = self.left
        data = self.f.read(n)
        self.left -= len(data)
        return data

    def readinto(self, buf) -> int:
        view = memoryview(buf)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        n = min(len(view), self.left)
        got = 0
        while got < n:
            r = self.f.readinto(view[got:n])
            if not r:
                break
            got += r
        self.left -= got
        return got

    def readline(self) -> bytes:
        line = self.f.readline(self.left)
        self.left -= len(line)
        return line


def _fresh_unpickler(window: _Window, buffers: _Buffers, objects: list) -> _Unpickler:
    """A new unpickler whose memo holds ``objects`` at indices 0, 1, ...

    Setting ``Unpickler.memo`` would not do: it leaves the count MEMOIZE numbers
    from at 0. So the memo is filled the way a pickle fills it: a small pickle of
    ``persistent id i, MEMOIZE, POP`` for each object, ``persistent_load`` handing
    the objects over."""
    unpickler = _Unpickler(window, buffers=buffers)
    if objects:
        ops = bytearray()
        for i in range(len(objects)):
            ops += b"J" + i.to_bytes(4, "little") + b"Q\x940"  # BININT, BINPERSID, MEMOIZE, POP
        ops += b"N."  # NONE, STOP
        unpickler._prime = objects
        real, window.f = window.f, io.BytesIO(ops)
        window.left = len(ops)
        try:
            unpickler.load()
        finally:
            window.f = real
            unpickler._prime = []
    return unpickler


def _why_not_loaded(exc: BaseException) -> str:
    if isinstance(exc, _Gone):
        return str(exc)
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        return f"its module {exc.name} is gone"
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    return f"could not be loaded: {type(exc).__name__}" + (f": {first}" if first else "")


def _gets(window: _Window) -> set[int]:
    """The memo indices a record reads (GET opcodes), read without loading it."""
    found = set()
    for op, arg, _ in pickletools.genops(window):
        if op.name in ("BINGET", "LONG_BINGET", "GET"):
            found.add(int(arg))
    return found


def _read_index(f) -> dict:
    head = f.read(len(MAGIC))
    if not head.startswith(b"GPULAB-NS "):
        raise ValueError("not a gpulab namespace file")
    if head != MAGIC:
        raise ValueError(
            f"namespace file format {head[10:].strip().decode(errors='replace')!r} "
            f"is newer than this gpulab reads ({FORMAT})"
        )
    size = f.seek(0, os.SEEK_END)
    if size < len(MAGIC) + _TRAILER.size:
        raise ValueError("the namespace file is truncated")
    f.seek(size - _TRAILER.size)
    length, tag = _TRAILER.unpack(f.read(_TRAILER.size))
    if tag != _TRAILER_TAG or length > size:
        raise ValueError("the namespace file is truncated")
    f.seek(size - _TRAILER.size - length)
    return json.loads(f.read(length))


def load_namespace(path: str, into: dict, *, device: str | None = None) -> LoadReport:
    """Read a file ``save_namespace`` wrote and put each variable into ``into``.

    ``device``: where tensors that were on a GPU go; None: ``"cuda"`` when this
    machine has one, else ``"cpu"`` (counted in ``moved_to_cpu``). Tensors that were
    on the CPU stay there. A variable that cannot be loaded (its class or module is
    gone, or it shares objects with one that failed) is reported in ``failed`` and
    the rest still load. Raises ``OSError`` if the file cannot be read and
    ``ValueError`` if it is not a namespace file this version reads.
    """
    global _LOADING
    start = time.perf_counter()
    with open(path, "rb", buffering=1 << 20) as f:
        index = _read_index(f)
        records = index["variables"]
        gpu = sum(r.get("gpu_tensors", 0) for r in records)
        auto = device is None
        if device is None:
            torch = sys.modules.get("torch")
            if gpu:
                import torch
            device = _auto_device(torch) if torch is not None else "cpu"
        why_failed = {s["name"]: s["why"] for s in index["skipped"]}
        restored: list[str] = []
        window = _Window(f)
        buffers = _Buffers(f)
        unpickler = _Unpickler(window, buffers=buffers)
        poisoned: dict[int, str] = {}  # memo index -> the variable that did not load
        _LOADING = state = _LoadState(into, device)
        try:
            for rec in records:
                name, (lo, hi) = rec["name"], rec["memo"]
                try:
                    if poisoned:
                        window.open(rec["offset"], rec["length"])
                        bad = {poisoned[i] for i in _gets(window) if i in poisoned}
                        if bad:
                            raise _Gone(
                                "it shares objects with " + ", ".join(sorted(bad)) + ", not back"
                            )
                    window.open(rec["offset"], rec["length"])
                    buffers.pending = [list(b) for b in rec.get("buffers", ())]
                    value = unpickler.load()[0]
                except Exception as exc:
                    why_failed[name] = _why_not_loaded(exc)
                    # A fresh unpickler (the failed one may hold a half-read frame),
                    # with the memo up to this record, and this record's range filled
                    # with a marker so later records keep their memo numbering.
                    memo = unpickler.memo.copy()
                    objects = [memo[i] for i in range(lo)] + [_NOT_LOADED] * (hi - lo)
                    poisoned.update(dict.fromkeys(range(lo, hi), name))
                    unpickler = _fresh_unpickler(window, buffers, objects)
                    continue
                into[name] = value
                restored.append(name)
        finally:
            _LOADING = None
    order = index.get("order") or [r["name"] for r in records]
    failed = [(n, why_failed[n]) for n in order if n in why_failed]
    return LoadReport(
        restored=restored,
        failed=failed,
        seconds=time.perf_counter() - start,
        device=device,
        moved_to_cpu=state.moved,
        auto_device=auto,
    )


class _NotLoaded:
    def __repr__(self) -> str:
        return "<not loaded>"


_NOT_LOADED = _NotLoaded()
