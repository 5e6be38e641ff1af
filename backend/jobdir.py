"""A job's directory: what the service, the backend and the ranks share on disk.

Layout of ``<data_dir>/jobs/<id>/`` (on Kubernetes, the same tree on a shared volume)::

    spec.json  cell.py  vars.pkl      what to run (written at submit; vars.pkl removed at its end)
    rdzv.secret                       the rendezvous secret (:mod:`gpulab.training.rendezvous`)
    launch.json                       how it was started
    events.log                        lines for the user ("restart 1: ...")
    logs/rank<R>.log  logs/node<N>.log  each rank's output; each torchrun agent's
    metrics/rank<R>.jsonl             report() records
    errors/rank<R>.json               a failed rank's exception (copy of torchrun's error file)
    checkpoints/                      torch.distributed.checkpoint steps + ``latest``
    out/value.pkl  out/state_dict.pt  the --out variable (rank 0)
    pids/rank<R>.json  pids/node<N>.exit  the ranks' pids; each node's exit code
    pids/preempted.json               the step the ranks stopped at when preempted
    torchrun/                         torchrun's own per-node logs

Everything here is plain files, so a restarted service picks up where it was.

When the ranks run as the job owner's Unix account (:meth:`JobDir.hand_over`),
the directory itself and what the service wrote stay root's (group: the owner,
``0750``), and only :data:`USER_DIRS` and ``events.log`` become the owner's.
The service reads what the owner can write through :meth:`JobDir.open_user`,
which refuses symlinks, FIFOs and files the owner does not own, so a rank cannot
make the service read or write another file of the host for it.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import secrets
import stat
from collections import OrderedDict

from .spec import MAX_CODE_BYTES, MAX_ENV_VALUE, MAX_ENV_VARS, JobSpec, SpecError

_RANK_LOG = re.compile(r"rank(\d+)\.log$")
_NODE_LOG = re.compile(r"node(\d+)\.log$")
#: A checkpoint's folder (:func:`gpulab.training.checkpoint.save`): ``step_00000010``.
_STEP_DIR = re.compile(r"^step_(\d+)$")
#: Folders the ranks write; the owner's once the job is handed over.
USER_DIRS = ("logs", "metrics", "errors", "checkpoints", "out", "pids", "torchrun")
#: The one file both the service and the ranks append to.
EVENTS = "events.log"
#: Rank 0's line for each restart (:func:`gpulab.training.checkpoint.resume_range`):
#: the checkpoint step every rank resumed from, or the start.
_RESTART_EVENT = re.compile(
    r"^restart (\d+): .*restarted from (?:checkpoint at step (\d+)|the start)", re.M
)
#: Where rank 0 notes the step it stopped at for a preemption
#: (:data:`gpulab.training.preemption.MARKER`).
PREEMPTED = os.path.join("pids", "preempted.json")
#: Rank 0's note that its run stops at step boundaries when asked
#: (:data:`gpulab.training.preemption.RESUMABLE`).
RESUMABLE = os.path.join("pids", "resumable.json")
#: The most of a ranks' ``report()`` file one read takes: a rank may write any amount
#: (a sparse file of many GiB costs it nothing), the service reads it in steps.
METRICS_READ_BYTES = 8 << 20
#: The most restarts a job is taken to have had (a rank's pid file says its restart;
#: a job's own --max-restarts is far below).
MAX_RESTARTS = 1000
#: The most error files of failed ranks read (one per rank; far above any job's ranks),
#: and what all of them together may give (a traceback is a few KiB).
MAX_ERROR_FILES = 4096
ERRORS_READ_BYTES = 8 << 20
#: The most pid files read for a job's restart count, and of each (``{"pid", "restart"}``
#: is a few dozen bytes): every pass of the job loop reads them, and the ranks may
#: hard-link one big file as thousands.
MAX_PID_FILES = 1024
PID_FILE_BYTES = 4096


def _number_or_0(value) -> float:
    """A field of a rank's file as a sort key: a number, else 0."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return value if ok and value == value else 0


#: The most of a JSON file of the service's (``launch.json``) that is read: where a
#: job's pods write its folder, they may replace the file with one of any size.
JSON_READ_BYTES = 1 << 20
#: ... and of ``spec.json``, which holds the code and the environment at their
#: limits, each character escaped to at most 12 bytes of JSON (a surrogate pair),
#: and the other fields in the last MiB.
SPEC_READ_BYTES = 12 * (MAX_CODE_BYTES + MAX_ENV_VARS * MAX_ENV_VALUE) + (1 << 20)

#: The specs the service wrote (or read once since it started), by job folder, most
#: recently used last: where a job's pods write its folder (Kubernetes) they may
#: rewrite spec.json, up to SPEC_READ_BYTES of it, which every poll would otherwise
#: parse again on the service's loop.
_SPECS: OrderedDict[str, dict] = OrderedDict()
#: How many are kept (a spec is at most its code and environment, ~9 MiB).
SPECS_KEPT = 512


def _keep_spec(path: str, data: dict) -> None:
    _SPECS[path] = data
    _SPECS.move_to_end(path)
    while len(_SPECS) > SPECS_KEPT:
        _SPECS.popitem(last=False)


#: The job's rendezvous secret: ``0600`` the service's, ``root:<owner's private
#: group> 0640`` once handed over, so only the owner's ranks read it.
RDZV_SECRET = "rdzv.secret"


class JobDir:
    def __init__(self, root: str, job_id: str):
        self.path = os.path.join(root, job_id)

    def p(self, *parts: str) -> str:
        return os.path.join(self.path, *parts)

    # -- who may write what ----------------------------------------------------------
    def hand_over(self, uid: int, gid: int) -> None:
        """Let the job's ranks, running as ``uid``, write their folders, and nobody
        else read anything: the directory becomes ``root:<gid> 0750``."""
        # Done again at each launch of a job on Kubernetes, after its pods wrote the
        # folder: nothing here follows a link (root would chown and chmod its target).
        for sub in USER_DIRS:
            if os.path.islink(self.p(sub)):
                os.unlink(self.p(sub))
            os.makedirs(self.p(sub), exist_ok=True)
            fd = os.open(self.p(sub), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            try:
                os.fchown(fd, uid, gid)
                os.fchmod(fd, 0o700)
            finally:
                os.close(fd)
        try:
            fd = self.open_user(EVENTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        except PermissionError:  # the service's own, from before the hand-over
            fd = os.open(self.p(EVENTS), os.O_WRONLY | os.O_NOFOLLOW)
        os.fchown(fd, uid, gid)
        os.fchmod(fd, 0o600)
        os.close(fd)
        for name in os.listdir(self.path):
            if name in USER_DIRS or name == EVENTS:
                continue
            try:
                fd = os.open(self.p(name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:  # a link, or gone
                continue
            try:
                st = os.fstat(fd)
                # A plain file of the service's (a hard link to another's file is not).
                if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                    os.fchown(fd, 0, gid)
                    os.fchmod(fd, 0o640)
            finally:
                os.close(fd)
        os.chown(self.path, 0, gid)
        os.chmod(self.path, 0o750)

    def owner(self) -> tuple[int, int]:
        """Who the ranks run as: the owner of ``logs/`` (the service, before hand-over)."""
        try:
            st = os.lstat(self.p("logs"))
            return st.st_uid, st.st_gid
        except OSError:
            return os.geteuid(), os.getegid()

    def open_user(self, name: str, flags: int = os.O_RDONLY) -> int:
        """Open a file the ranks may write; an fd, or OSError.

        Refused: a symlink, a FIFO or device (which could hang the service), and
        in a handed-over job a file the ranks' account does not own (a hard link
        to one of root's). A file made here (``O_CREAT``) is given to that account.
        """
        safe = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        uid, gid = self.owner()
        if flags & os.O_CREAT:
            try:
                fd = self._open_beneath(name, flags | os.O_EXCL | safe, 0o600)
            except FileExistsError:
                flags &= ~os.O_CREAT
            else:
                if uid != os.geteuid():
                    os.fchown(fd, uid, gid)
                os.set_blocking(fd, True)
                return fd
        fd = self._open_beneath(name, flags | safe)
        try:
            st = os.fstat(fd)
            # A job handed over to an account: only that account's files. Otherwise
            # (ranks of the service's own account, or pods writing a shared volume
            # as whichever uid their image has) any plain file.
            handed_over = uid != os.geteuid()
            if not stat.S_ISREG(st.st_mode) or (handed_over and st.st_uid != uid):
                raise PermissionError(f"{self.p(name)}: not a plain file of the job's own")
            os.set_blocking(fd, True)
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _open_beneath(self, name: str, flags: int, mode: int = 0o600) -> int:
        """``os.open`` of ``name`` (``"logs/rank0.log"``) in the folder, one component
        at a time, none of them a link (OSError otherwise): the ranks may replace a
        folder of theirs (``out/``) with a link to another job's, which O_NOFOLLOW on
        the last component alone would follow."""
        parts = name.split(os.sep)
        if any(part in ("", ".", "..") for part in parts):
            raise PermissionError(f"{self.p(name)}: not a plain path in the job's folder")
        at = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for part in parts[:-1]:
                step = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
                inner = os.open(part, step, dir_fd=at)
                os.close(at)
                at = inner
            return os.open(parts[-1], flags, mode, dir_fd=at)
        finally:
            os.close(at)

    def read_user(self, name: str, offset: int = 0, limit: int | None = None) -> bytes:
        """Bytes of a ranks' file from ``offset`` (at most ``limit``); OSError if unsafe."""
        fd = self.open_user(name)
        with os.fdopen(fd, "rb") as f:
            f.seek(offset)
            return f.read() if limit is None else f.read(limit)

    def read_user_end(self, name: str, limit: int = 1 << 20) -> bytes:
        """The last ``limit`` bytes of a ranks' file (a log may be any size)."""
        fd = self.open_user(name)
        try:
            size = os.fstat(fd).st_size
            return os.pread(fd, min(size, limit), max(0, size - limit))
        finally:
            os.close(fd)

    # -- inputs ------------------------------------------------------------------
    def drop_variables(self) -> None:
        """Remove the shipped variables once the job has ended: up to
        max_job_vars_mib a job, written as the service's account (no user's disk
        quota holds them), read only by the ranks when they start."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.p("vars.pkl"))

    def write_inputs(self, spec: JobSpec) -> None:
        for sub in ("logs", "metrics", "errors", "checkpoints", "out"):
            os.makedirs(self.p(sub), exist_ok=True)
        with open(self.p("cell.py"), "w") as f:
            f.write(spec.code)
        if spec.vars_b64:
            with open(self.p("vars.pkl"), "wb") as f:
                f.write(spec.vars_bytes)
        self.write_rdzv_secret()
        # The variables are in vars.pkl: spec.json, read at every poll of the job, is
        # kept small (it held them again, up to 345 MB of base64, parsed each second).
        self.write_spec({**spec.to_dict(), "vars_b64": ""})

    def write_rdzv_secret(self) -> None:
        """A fresh secret for the job's rendezvous, if it has none (a requeue keeps it)."""
        try:
            fd = os.open(self.p(RDZV_SECRET), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")

    def spec(self) -> JobSpec:
        """The job's spec as the service last wrote it (read from the folder once)."""
        data = _SPECS.get(self.path)
        if data is not None:
            _SPECS.move_to_end(self.path)
            return JobSpec.from_dict(dict(data))
        data = self.read_json("spec.json", limit=SPEC_READ_BYTES)
        if data is None and os.path.lexists(self.p("spec.json")):
            raise SpecError(
                f"{self.p('spec.json')} is not a plain JSON file of at most "
                f"{SPEC_READ_BYTES >> 20} MiB"
            )
        spec = JobSpec.from_dict(dict(data) if isinstance(data, dict) else data)
        _keep_spec(self.path, data)
        return spec

    def write_spec(self, data: dict) -> None:
        """Write the job's spec (``spec.json``), and keep it as :meth:`spec` reads it."""
        self.write_json("spec.json", data)
        _keep_spec(self.path, data)

    def write_json(self, name: str, data) -> None:
        # Where a job's pods write its folder as the service's account (Kubernetes),
        # a link may wait at the temporary name: removed, never written through.
        tmp = self.p(f".{name}.tmp")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, 0o666)  # as open(): the umask decides
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, self.p(name))

    def read_own(self, name: str, limit: int) -> bytes:
        """A file of the service's in the folder (``cell.py``), at most ``limit`` bytes:
        only a regular file, never followed through a link, never waited on; OSError
        otherwise (as :meth:`read_json`, for the same pods)."""
        fd = os.open(self.p(name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise PermissionError(f"{self.p(name)}: not a plain file")
            return f.read(limit)

    def read_json(self, name: str, default=None, limit: int = JSON_READ_BYTES):
        """A JSON file of the service's in the folder: only a regular file of at most
        ``limit`` bytes, never followed through a link, never waited on (where a job's
        pods run as the same account as the service, they could put a FIFO in its
        place, or make it a sparse file of many GiB); ``default`` otherwise."""
        try:
            fd = os.open(self.p(name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return default
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return default
            with os.fdopen(fd, "rb") as f:
                fd = -1
                data = f.read(limit + 1)  # what the service wrote is within the limit
            return default if len(data) > limit else json.loads(data)
        except (OSError, ValueError, RecursionError):
            return default
        finally:
            if fd >= 0:
                os.close(fd)

    def event(self, message: str) -> None:
        fd = self.open_user(EVENTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        with os.fdopen(fd, "a") as f:
            f.write(message.rstrip("\n") + "\n")

    def read_user_json(self, name: str, default=None, limit: int = 1 << 20):
        """A JSON file the ranks write (at most ``limit`` bytes): ``default`` for one
        that is missing, larger, or not JSON (deep nesting included: RecursionError)."""
        try:
            return json.loads(self.read_user(name, limit=limit))
        except (OSError, ValueError, RecursionError):
            return default

    # -- outputs -----------------------------------------------------------------
    def errors(self) -> list[dict]:
        """Failed ranks' errors, earliest first (at most MAX_ERROR_FILES of them: the
        ranks may write any number of files)."""
        found, left = [], ERRORS_READ_BYTES
        for path in sorted(glob.glob(self.p("errors", "rank*.json")))[:MAX_ERROR_FILES]:
            if left <= 0:
                break
            try:
                data = self.read_user(os.path.relpath(path, self.path), limit=min(1 << 20, left))
            except OSError:
                continue
            left -= len(data)
            try:
                error = json.loads(data)
            except (ValueError, RecursionError):
                continue
            if isinstance(error, dict):
                found.append(error)
        return sorted(
            found, key=lambda e: (_number_or_0(e.get("time")), _number_or_0(e.get("rank")))
        )

    def restarts(self) -> int:
        """The highest restart a rank says it is in, at most MAX_RESTARTS (the pid
        files are their owner's to write)."""
        seen = [0]
        for path in sorted(glob.glob(self.p("pids", "rank*.json")))[:MAX_PID_FILES]:
            info = self.read_user_json(os.path.relpath(path, self.path), limit=PID_FILE_BYTES)
            with contextlib.suppress(AttributeError, TypeError, ValueError, OverflowError):
                seen.append(int(info.get("restart", 0)))
        return max(0, min(max(seen), MAX_RESTARTS))

    def restart_steps(self) -> dict[int, int | None]:
        """Restart number -> the checkpoint step the ranks resumed from (None: the
        start, no checkpoint), as rank 0 told it; a restart of a run that steps
        without ``resume_range`` is not in it."""
        try:
            text = self.read_user_end(EVENTS).decode(errors="replace")
        except OSError:
            return {}
        return {
            int(m.group(1)): int(m.group(2)) if m.group(2) is not None else None
            for m in _RESTART_EVENT.finditer(text)
        }

    # -- preemption -----------------------------------------------------------------
    def checkpoint(self) -> dict | None:
        """The newest complete checkpoint's ``{"step", "time"}``, if any."""
        latest = self.read_user_json(os.path.join("checkpoints", "latest"))
        return latest if isinstance(latest, dict) and isinstance(latest.get("step"), int) else None

    def checkpoint_steps(self) -> list[int]:
        """Steps of the complete checkpoints still on disk (the newest few), oldest first."""
        latest = self.checkpoint()
        if latest is None:
            return []
        try:
            # The folder itself, not where a link in its place leads (another job's).
            fd = self._open_beneath("checkpoints", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            try:
                names = os.listdir(fd)
            finally:
                os.close(fd)
        except OSError:
            return [latest["step"]]
        steps = {int(m.group(1)) for n in names if (m := _STEP_DIR.match(n))}
        return sorted(s for s in steps | {latest["step"]} if s <= latest["step"])

    def preempted_at(self) -> int | None:
        """The step the ranks stopped at for a preemption (they checkpointed there)."""
        marker = self.read_user_json(PREEMPTED)
        step = marker.get("step") if isinstance(marker, dict) else None
        return step if isinstance(step, int) else None

    def resumable(self) -> bool:
        """Does the run step under ``resume_range`` (so a resize loses no work)?"""
        return self.stepping_since() is not None

    def stepping_since(self) -> float | None:
        """When this run's ranks began stepping under ``resume_range`` (epoch
        seconds), or None: not yet, or the cell never calls it."""
        note = self.read_user_json(RESUMABLE)
        since = note.get("time") if isinstance(note, dict) else None
        return float(since) if isinstance(since, (int, float)) else None

    def reset_run(self) -> None:
        """Forget how the last run went (pids, exit codes, launch), before it runs again.

        Logs, metrics, events and checkpoints stay: the next run appends and resumes.
        """
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.p("launch.json"))
        if os.path.islink(self.p("pids")):  # its files are found through it: never
            os.unlink(self.p("pids"))
            os.makedirs(self.p("pids"), exist_ok=True)
        for path in glob.glob(self.p("pids", "*")):
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                os.unlink(path)  # a symlink is removed, never followed

    def out_path(self) -> str | None:
        """The --out value's path if it is there, as :meth:`open_user` would open it."""
        try:
            os.close(self.open_user(os.path.join("out", "value.pkl")))
        except OSError:
            return None
        return self.p("out", "value.pkl")

    def metrics(
        self, rank: int = 0, cursor: int = 0, limit: int = METRICS_READ_BYTES
    ) -> tuple[list[dict], int]:
        """``report()`` records of one rank from byte ``cursor``, at most ``limit``
        bytes of them; and the next cursor."""
        records = []
        try:
            data = self.read_user(f"metrics/rank{rank}.jsonl", cursor, limit)
        except OSError:
            return [], cursor
        end = data.rfind(b"\n") + 1  # a line still being written waits for next time
        if not end and len(data) == limit:
            return [], cursor + limit  # no record is that long: step over it
        for line in data[:end].splitlines():
            with contextlib.suppress(ValueError, RecursionError):
                records.append(json.loads(line))
        return records, cursor + end

    def last_metric(self, rank: int = 0) -> dict | None:
        """The last whole ``report()`` record of one rank, read from the file's end."""
        try:
            data = self.read_user_end(f"metrics/rank{rank}.jsonl", 1 << 16)
        except OSError:
            return None
        for line in reversed(data[: data.rfind(b"\n") + 1].splitlines()):
            with contextlib.suppress(ValueError, RecursionError):
                record = json.loads(line)
                if isinstance(record, dict):
                    return record
        return None

    def log_sources(self) -> list[tuple[str, str]]:
        """(prefix, path) of every log: gpulab's events, ranks in order, then agents."""
        sources = [("[gpulab] ", self.p("events.log"))]
        ranks, nodes = [], []
        for path in glob.glob(self.p("logs", "*.log")):
            name = os.path.basename(path)
            if m := _RANK_LOG.match(name):
                ranks.append((int(m.group(1)), f"[r{m.group(1)}] ", path))
            elif m := _NODE_LOG.match(name):
                nodes.append((int(m.group(1)), f"[node{m.group(1)}] ", path))
        return (
            sources
            + [(pre, p) for _, pre, p in sorted(ranks)]
            + [(pre, p) for _, pre, p in sorted(nodes)]
        )


#: The most bytes one read of a job's logs returns (a whole-log read, or a tail of
#: long lines); what is older is skipped with a note saying so.
MAX_READ_BYTES = 8 << 20
#: The most lines one read returns over all of a job's logs (each is a Python string:
#: 8 MiB of empty lines would be millions); the rest come at the next read.
MAX_READ_LINES = 100_000
#: Blocks a tail is read in, from the end of the file back.
TAIL_BLOCK = 64 << 10


class LogTail:
    """Reads new complete lines from all of a job's logs, each with its prefix.

    Reads are bounded (:data:`MAX_READ_BYTES` per call, from the end when there is
    more) and ``tail`` reads a file backwards, block by block, never all of it. A
    log cut by :mod:`gpulab.training.log_cap` (a new inode whose first line says how
    many bytes it dropped) is followed on from where the reader was.
    """

    def __init__(self, jobdir: JobDir, rank: int | None = None):
        self.jobdir = jobdir
        self.rank = rank
        self.offsets: dict[str, int] = {}
        self.inodes: dict[str, int] = {}
        #: The last read stopped at its budget with lines left to read (read again).
        self.behind = False

    def _sources(self) -> list[tuple[str, str]]:
        return [
            (prefix, path)
            for prefix, path in self.jobdir.log_sources()
            if self.rank is None or prefix == f"[r{self.rank}] "
        ]

    def read(self, final: bool = False, tail: int | None = None) -> list[str]:
        """New lines since the last call; ``final`` also returns an unterminated last
        line; ``tail``: of what is there, only the last ``tail`` lines (first call).

        One file is open at a time, and all of them together give at most
        :data:`MAX_READ_BYTES` and :data:`MAX_READ_LINES` a call (the ranks may write
        any number of logs): what is left is read at the next call."""
        sources = self._sources()
        self.behind = False
        if tail is not None:
            return self._tail(sources, final, tail)
        budget = {"bytes": MAX_READ_BYTES, "lines": MAX_READ_LINES}
        lines: list[str] = []
        for prefix, path in sources:
            if budget["bytes"] <= 0 or budget["lines"] <= 0:
                self.behind = True
                break
            fd = self._open(path)
            if fd is None:
                continue
            try:
                lines += self._new(prefix, path, fd, final, budget)
            finally:
                os.close(fd)
        return lines

    def _open(self, path: str) -> int | None:
        try:
            return self.jobdir.open_user(os.path.relpath(path, self.jobdir.path))
        except OSError:
            return None

    def _start(self, path: str, fd: int) -> int:
        """Where to go on reading ``path``: the last offset, moved over a cut."""
        st = os.fstat(fd)
        offset = self.offsets.get(path, 0)
        seen = self.inodes.get(path)
        self.inodes[path] = st.st_ino
        if seen is not None and seen != st.st_ino:
            from gpulab.training.log_cap import dropped_of

            first = os.pread(fd, 200, 0)
            line = first[: first.find(b"\n") + 1]
            dropped = dropped_of(line)
            moved = dropped is not None and offset >= dropped
            offset = len(line) + offset - dropped if moved else 0
        return min(offset, st.st_size)

    def _new(self, prefix: str, path: str, fd: int, final: bool, budget: dict) -> list[str]:
        """The file's new lines within what is left of the call's ``budget``. A file
        more than MAX_READ_BYTES behind gives its newest lines (the older are skipped,
        with a line saying so); one within it gives what fits, in order, and the rest
        at the next call."""
        offset = self._start(path, fd)
        size = os.fstat(fd).st_size
        room = budget["bytes"]
        skipped = size - offset > MAX_READ_BYTES
        if skipped:
            offset = size - min(MAX_READ_BYTES, room)
        short = size - offset > room
        data = os.pread(fd, min(size - offset, room), offset)
        end = len(data) if final and not short else data.rfind(b"\n") + 1
        if not skipped and data.count(b"\n", 0, end) > budget["lines"]:
            end = _after_nth_newline(data, budget["lines"])
            short = True
        self.behind = self.behind or short
        self.offsets[path] = offset + end
        body = data[:end]
        budget["bytes"] -= end
        lines = []
        if skipped:
            # From the start of a line, and at most the lines left: the newest.
            cut = max(body.find(b"\n") + 1, _last_lines_start(body, budget["lines"] - 1))
            body = body[cut:]
            lines.append(f"{prefix}[gpulab] {_mib(offset + cut)} of this log skipped")
        lines += [prefix + raw.decode(errors="replace") for raw in body.splitlines()]
        budget["lines"] -= len(lines)
        return lines

    def _tail(self, sources, final: bool, n: int) -> list[str]:
        """The last ``n`` lines over all sources (in their order), read from the ends,
        one file open at a time."""
        found: list[list[str]] = []
        budget = MAX_READ_BYTES
        for prefix, path in reversed(sources):
            fd = self._open(path)
            if fd is None:
                continue
            try:
                size = os.fstat(fd).st_size
                self._start(path, fd)
                end = size if final else _last_newline(fd, size)
                self.offsets[path] = end
                if n <= 0 or budget <= 0:
                    continue
                raws, used, complete = _last_lines(fd, end, n, budget)
            finally:
                os.close(fd)
            budget -= used
            lines = [prefix + raw.decode(errors="replace") for raw in raws]
            if not complete:
                lines.insert(0, f"{prefix}[gpulab] older lines skipped: over {_mib(used)}")
            n -= len(raws)
            found.append(lines)
        return [line for lines in reversed(found) for line in lines]


def _last_lines_start(data: bytes, n: int) -> int:
    """Where the last ``n`` lines of ``data`` (ending in a newline) start (0: it has
    no more than ``n``)."""
    pos = len(data) - 1  # the last newline ends the last line; it starts none
    for _ in range(max(n, 0)):
        pos = data.rfind(b"\n", 0, pos)
        if pos < 0:
            return 0
    return pos + 1 if n > 0 else len(data)


def _after_nth_newline(data: bytes, n: int) -> int:
    """The offset just after the ``n``-th newline of ``data`` (0 for n = 0)."""
    end = 0
    for _ in range(n):
        end = data.index(b"\n", end) + 1
    return end


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _last_newline(fd: int, size: int) -> int:
    """The offset after the last newline before ``size`` (0 if none in the last
    :data:`MAX_READ_BYTES`: a line still being written waits)."""
    pos = size
    while pos > 0 and size - pos < MAX_READ_BYTES:
        start = max(0, pos - TAIL_BLOCK)
        block = os.pread(fd, pos - start, start)
        i = block.rfind(b"\n")
        if i >= 0:
            return start + i + 1
        pos = start
    return 0 if pos == 0 else size


def _last_lines(fd: int, end: int, n: int, budget: int) -> tuple[list[bytes], int, bool]:
    """The last ``n`` lines before ``end``, reading back in blocks and at most
    ``budget`` bytes; ``(lines, bytes read, whether the first line is whole)``."""
    chunks: list[bytes] = []
    newlines = 0
    pos = end
    while pos > 0 and newlines < n and end - pos < budget:
        start = max(0, pos - TAIL_BLOCK, end - budget)
        block = os.pread(fd, pos - start, start)
        # A newline ending the data closes the last line; it starts none.
        newlines += block.count(b"\n", 0, len(block) - (1 if pos == end else 0))
        chunks.append(block)
        pos = start
    lines = b"".join(reversed(chunks)).splitlines()
    whole = pos == 0 or newlines >= n
    if not whole:
        lines = lines[1:]  # it began before what the budget let us read
    # With n newlines read, the first (maybe partial) line is not among the last n.
    return lines[-n:], end - pos, whole
