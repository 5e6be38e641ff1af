"""A job's directory: what the service, the backend and the ranks share on disk.

Layout of ``<data_dir>/jobs/<id>/`` (on Kubernetes, the same tree on a shared volume)::

    spec.json  cell.py  vars.pkl      what to run (written at submit)
    launch.json  node<N>.exit         how it was started; each node's exit code
    events.log                        lines for the user ("restart 1: ...")
    logs/rank<R>.log  logs/node<N>.log  each rank's output; each torchrun agent's
    metrics/rank<R>.jsonl             report() records
    errors/rank<R>.json               a failed rank's exception (copy of torchrun's error file)
    checkpoints/                      torch.distributed.checkpoint steps + ``latest``
    out/value.pkl  out/state_dict.pt  the --out variable (rank 0)

Everything here is plain files, so a restarted service picks up where it was.
"""

from __future__ import annotations

import glob
import json
import os
import re

from .spec import JobSpec

_RANK_LOG = re.compile(r"rank(\d+)\.log$")
_NODE_LOG = re.compile(r"node(\d+)\.log$")


class JobDir:
    def __init__(self, root: str, job_id: str):
        self.path = os.path.join(root, job_id)

    def p(self, *parts: str) -> str:
        return os.path.join(self.path, *parts)

    # -- inputs ------------------------------------------------------------------
    def write_inputs(self, spec: JobSpec) -> None:
        for sub in ("logs", "metrics", "errors", "checkpoints", "out"):
            os.makedirs(self.p(sub), exist_ok=True)
        with open(self.p("cell.py"), "w") as f:
            f.write(spec.code)
        if spec.vars_b64:
            with open(self.p("vars.pkl"), "wb") as f:
                f.write(spec.vars_bytes)
        self.write_json("spec.json", spec.to_dict())

    def spec(self) -> JobSpec:
        return JobSpec.from_dict(self.read_json("spec.json"))

    def write_json(self, name: str, data) -> None:
        tmp = self.p(f".{name}.tmp")
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.replace(tmp, self.p(name))

    def read_json(self, name: str, default=None):
        try:
            with open(self.p(name)) as f:
                return json.load(f)
        except (OSError, ValueError):
            return default

    def event(self, message: str) -> None:
        with open(self.p("events.log"), "a") as f:
            f.write(message.rstrip("\n") + "\n")

    # -- outputs -----------------------------------------------------------------
    def errors(self) -> list[dict]:
        """Failed ranks' errors, earliest first."""
        found = []
        for path in glob.glob(self.p("errors", "rank*.json")):
            try:
                with open(path) as f:
                    found.append(json.load(f))
            except (OSError, ValueError):
                pass
        return sorted(found, key=lambda e: (e.get("time", 0), e.get("rank", 0)))

    def restarts(self) -> int:
        seen = [0]
        for path in glob.glob(self.p("pids", "rank*.json")):
            try:
                with open(path) as f:
                    seen.append(int(json.load(f).get("restart", 0)))
            except (OSError, ValueError):
                pass
        return max(seen)

    def out_path(self) -> str | None:
        path = self.p("out", "value.pkl")
        return path if os.path.exists(path) else None

    def metrics(self, rank: int = 0, cursor: int = 0) -> tuple[list[dict], int]:
        """``report()`` records of one rank from byte ``cursor``; and the next cursor."""
        path = self.p("metrics", f"rank{rank}.jsonl")
        records = []
        try:
            with open(path, "rb") as f:
                f.seek(cursor)
                data = f.read()
        except OSError:
            return [], cursor
        end = data.rfind(b"\n") + 1  # a line still being written waits for next time
        for line in data[:end].splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                pass
        return records, cursor + end

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
        return sources + [(pre, p) for _, pre, p in sorted(ranks)] + \
            [(pre, p) for _, pre, p in sorted(nodes)]


class LogTail:
    """Reads new complete lines from all of a job's logs, each with its prefix."""

    def __init__(self, jobdir: JobDir, rank: int | None = None):
        self.jobdir = jobdir
        self.rank = rank
        self.offsets: dict[str, int] = {}

    def read(self, final: bool = False) -> list[str]:
        """New lines since the last call; ``final`` also returns an unterminated last line."""
        lines = []
        for prefix, path in self.jobdir.log_sources():
            if self.rank is not None and prefix != f"[r{self.rank}] ":
                continue
            offset = self.offsets.get(path, 0)
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    data = f.read()
            except OSError:
                continue
            end = len(data) if final else data.rfind(b"\n") + 1
            self.offsets[path] = offset + end
            for raw in data[:end].splitlines():
                lines.append(prefix + raw.decode(errors="replace"))
        return lines
