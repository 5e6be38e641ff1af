"""The one place gpulab runs Slurm's commands (``sbatch``, ``squeue``, ``sinfo``...).

A site is a ``slurm.conf`` (exported as ``SLURM_CONF`` to every command), an
optional partition and an optional folder of the Slurm binaries. Everything
else (job backend, inventory, spawner) goes through :class:`SlurmSite`, so a
deployment configures Slurm once::

    c.SlurmSite.slurm_conf = "/etc/slurm/slurm.conf"
    c.SlurmSite.partition = "gpu"

Commands run as root (the service) unless ``user`` is given: then they run as
that Unix account through ``runuser -u USER --`` (the service must be root for
that). ``sbatch`` can also submit for a user itself with ``--uid/--gid``; the job
backend does that, so its ``sbatch`` needs no ``user=``.

Slurm 22.05 (Debian 12) is the oldest version this is written against: its
``squeue --json`` ignores ``-j`` and ``scontrol --json`` does not exist, so jobs
are read with ``squeue -o`` formats and ``scontrol show job``; nodes with
``sinfo --json``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re

from traitlets import Unicode
from traitlets.config import Configurable


class SlurmError(Exception):
    """A Slurm command failed; the message is its stderr (or why it did not run)."""


#: squeue's fields, in the order of ``_SQUEUE_FORMAT``: Slurm's own first, then the
#: two a job's owner writes (``scontrol update Comment=... JobName=...``), which may
#: hold "|": a line is split at the first six, so they cannot move the others.
_SQUEUE_FIELDS = ("job_id", "state", "nodes", "user", "gres", "reason", "comment", "name")
_SQUEUE_FORMAT = "%i|%T|%N|%u|%b|%r|%k|%j"
#: What a command run as a user inherits from the service's environment.
_USER_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ")
# States in which the job still holds (or will hold) its nodes.
ACTIVE_STATES = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "SUSPENDED",
        "REQUEUED",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
        "STOPPED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "RESV_DEL_HOLD",
    }
)


def parse_gres(text: str | None) -> tuple[dict[str, int], str | None]:
    """``"gpu:a100:2(S:0),shard:8"`` -> ``({"gpu": 2, "shard": 8}, "a100")``.

    Slurm writes ``name[:type]:count`` with an optional ``(S:...)`` socket
    suffix; ``(null)`` means none.
    """
    counts: dict[str, int] = {}
    gpu_type = None
    if not text or text == "(null)":
        return counts, None
    for part in re.split(r",(?![^(]*\))", text):
        part = re.sub(r"\(.*?\)", "", part).strip()
        if not part:
            continue
        fields = part.split(":")
        name = fields[0]
        if len(fields) >= 2 and fields[-1].isdigit():
            count = int(fields[-1])
            kind = fields[1] if len(fields) == 3 else None
        else:
            count, kind = 1, (fields[1] if len(fields) == 2 else None)
        counts[name] = counts.get(name, 0) + count
        if name == "gpu" and kind and kind != "(null)":
            gpu_type = kind
    return counts, gpu_type


def parse_scontrol(text: str) -> dict[str, str]:
    """``scontrol show job`` output (``Key=Value`` pairs) -> dict."""
    out: dict[str, str] = {}
    for token in re.findall(r"(\w[\w:/]*)=(\S*)", text):
        out.setdefault(token[0], token[1])
    return out


class SlurmSite(Configurable):
    slurm_conf = Unicode(
        "",
        config=True,
        help="""Path of the cluster's slurm.conf, exported as SLURM_CONF to every Slurm
        command gpulab runs; "" = Slurm's default (/etc/slurm/slurm.conf).
        E.g. c.SlurmSite.slurm_conf = "/srv/sandbox/etc/slurm.conf" """,
    )
    partition = Unicode(
        "",
        config=True,
        help="""Partition gpulab's jobs and servers are submitted to; "" = the cluster's
        default partition. E.g. c.SlurmSite.partition = "gpu" """,
    )
    bin_dir = Unicode(
        "",
        config=True,
        help="""Folder of the Slurm commands (sbatch, squeue, sinfo, scontrol, scancel);
        "" = found on PATH. E.g. c.SlurmSite.bin_dir = "/opt/slurm/bin" """,
    )

    # -- running commands -----------------------------------------------------------
    def env(self, user: str | None = None) -> dict[str, str]:
        """The environment of a Slurm command: the service's plus SLURM_CONF; for a
        command run as a user only PATH, the locale and SLURM_CONF (the service's
        tokens must not be in a process the user owns: /proc/<pid>/environ)."""
        if user is None:
            env = dict(os.environ)
        else:
            env = {k: os.environ[k] for k in _USER_ENV if k in os.environ}
        if self.slurm_conf:
            env["SLURM_CONF"] = self.slurm_conf
        if self.bin_dir:
            env["PATH"] = self.bin_dir + os.pathsep + env.get("PATH", "")
        return env

    def command(self, name: str) -> str:
        return os.path.join(self.bin_dir, name) if self.bin_dir else name

    async def run(
        self,
        argv: list[str],
        *,
        user: str | None = None,
        input: bytes | None = None,
        timeout: float = 30,
    ) -> str:
        """Run a Slurm command (``argv[0]`` a bare name like ``"squeue"``); its stdout.

        ``user``: run it as that Unix account (``runuser -u USER --``), so Slurm
        applies that user's view and rights (PrivateData, scancel of own jobs).
        Raises :class:`SlurmError` with the command's stderr when it fails. A
        user's command gets a minimal environment (:meth:`env`).
        """
        argv = [self.command(argv[0]), *argv[1:]]
        if user is not None:
            argv = ["runuser", "-u", user, "--", *argv]
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self.env(user),
            )
        except FileNotFoundError as e:
            raise SlurmError(
                f"{argv[0]} not found: install Slurm's clients (apt-get install slurm-wlm) "
                f"or set c.SlurmSite.bin_dir"
            ) from e
        try:
            out, err = await asyncio.wait_for(proc.communicate(input), timeout)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise SlurmError(f"{' '.join(argv[:3])}: no answer after {timeout:.0f}s") from None
        if proc.returncode != 0:
            msg = err.decode(errors="replace").strip() or out.decode(errors="replace").strip()
            raise SlurmError(f"{os.path.basename(argv[0])} failed ({proc.returncode}): {msg}")
        return out.decode(errors="replace")

    # -- reading the cluster -----------------------------------------------------------
    async def nodes(self) -> list[dict]:
        """The cluster's nodes (``sinfo --json``): name, address, hostname, gres
        (``{"gpu": 2, "shard": 8}``), gpu_type, cpus, state, partitions."""
        argv = ["sinfo", "--json"]
        if self.partition:
            argv += ["-p", self.partition]
        data = json.loads(await self.run(argv))
        out: dict[str, dict] = {}
        for node in data.get("nodes", []):
            if self.partition and self.partition not in (node.get("partitions") or []):
                continue
            gres, gpu_type = parse_gres(node.get("gres"))
            state = node.get("state")
            out[node["name"]] = {
                "name": node["name"],
                "address": node.get("address") or node["name"],
                "hostname": node.get("hostname") or node["name"],
                "gres": gres,
                "gpu_type": gpu_type,
                "cpus": int(node.get("cpus") or 0),
                "state": (state if isinstance(state, str) else ",".join(state or [])).lower(),
                "partitions": list(node.get("partitions") or []),
            }
        return list(out.values())

    async def job(self, job_id: str | int) -> dict | None:
        """A job's state, nodes, user, gres, comment, name (and reason while pending);
        None when Slurm no longer knows it. Finished jobs come from ``scontrol show
        job`` (kept for MinJobAge after the end), with ``exit_code`` too."""
        job_id = str(job_id)
        try:
            out = await self.run(["squeue", "-h", "-j", job_id, "-o", _SQUEUE_FORMAT])
        except SlurmError as e:
            if "Invalid job id" not in str(e):
                raise
            out = ""
        for line in out.splitlines():
            fields = line.strip().split("|", 6)
            if len(fields) == 7 and fields[0] == job_id:
                comment, _, name = fields[6].rpartition("|")  # the owner's: best effort
                return dict(zip(_SQUEUE_FIELDS, [*fields[:6], comment, name], strict=True))
        try:
            text = await self.run(["scontrol", "show", "job", job_id])
        except SlurmError as e:
            if "Invalid job id" in str(e):
                return None
            raise
        info = parse_scontrol(text)
        if info.get("JobId") != job_id:
            return None
        return {
            "job_id": job_id,
            "state": info.get("JobState", "UNKNOWN"),
            "nodes": info.get("NodeList", ""),
            "user": info.get("UserId", "").split("(")[0],
            "gres": info.get("TresPerNode", ""),
            "comment": info.get("Comment", ""),
            "name": info.get("JobName", ""),
            "reason": info.get("Reason", ""),
            "exit_code": info.get("ExitCode", ""),
        }

    async def cancel(self, job_id: str | int, *, signal: str | None = None) -> None:
        """``scancel`` the job (or send it ``signal``, e.g. "TERM", to every task with
        ``--full``: batch script and steps). A job that is already gone is no error."""
        argv = ["scancel"]
        if signal:
            argv += ["--full", f"--signal={signal}"]
        try:
            await self.run([*argv, str(job_id)])
        except SlurmError as e:
            if "Invalid job id" not in str(e) and "already completing" not in str(e):
                raise
