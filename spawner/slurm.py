"""FractionalSlurmSpawner: the user's JupyterLab as a Slurm job, held to its slice.

Use it with ``c.JupyterHub.spawner_class = "gpulab-slurm"`` (and
``c.SlurmSite.*``, ``c.InventorySettings.inventory_class = "slurm"``; see
docs/howto/slurm.md). The model is batchspawner's: a server is a batch job.
What gpulab adds is the slice:

1. ``start`` asks the gpulab service for the slice (as ``gpulab-local`` does);
   the ledger picks the node and GPU.
2. The user's own account writes a job folder in their home (shared filesystem,
   mode 0700; :mod:`.slurm_job_dir`, never root, whom a planted link would lead
   elsewhere): ``env.sh`` with the server's environment (JupyterHub's
   API token among it, so it never goes on a command line: ``/proc/*/cmdline``
   is world-readable) and ``job.sh``, which picks a free port on the node,
   writes it to ``port`` and execs ``jupyterhub-singleuser``.
3. It submits ``job.sh`` (its text, on sbatch's stdin) as the user's Unix
   account (``sbatch --uid --gid``, ``--export=NIL``: none of the hub's
   environment travels), pinned to the ledger's node (``--nodelist``) with the
   slice as GRES (``--gres=shard:K``, see :mod:`gpulab.backend.slurm_inventory`).
4. Once the job runs and has written its port, the server's URL is the node's
   address (from ``sinfo``) and that port.

``poll`` is the Slurm job's state; ``stop`` is ``scancel`` and the slice's
release. The Slurm job id is kept in the hub's state, so a restarted hub
finds the running server again.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shlex
import time
from urllib.parse import urlsplit, urlunsplit

from tornado import web
from traitlets import Float, List, Unicode
from traitlets.config import Config

from gpulab.backend.slurm_inventory import PoolError, SlurmInventory
from gpulab.backend.slurm_site import ACTIVE_STATES, SlurmError, SlurmSite
from gpulab.enforcement.accounts import Account, first_user_uid
from gpulab.enforcement.slice_env import slice_env
from gpulab.scheduler.slices import label

from . import slurm_job_dir
from .host import FractionalHostSpawner
from .placement import STARTING_LAB
from .user_options import parse_user_options

#: Variables Slurm sets for the job itself: the server keeps Slurm's values.
SLURM_OWNS = ("CUDA_VISIBLE_DEVICES",)
_JOB_SH = """#!/bin/sh
# Written by gpulab's FractionalSlurmSpawner: one JupyterLab server as a Slurm job.
set -e
cd {job_dir}  # sbatch runs a copy of this script from its spool
# Slurm's GPU choice for the job (unset without --gres: then no GPU at all).
gpus="${{CUDA_VISIBLE_DEVICES-}}"
set -a
. ./env.sh
set +a
{modules}export CUDA_VISIBLE_DEVICES="$gpus"
port=$({python} -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')
export JUPYTERHUB_SERVICE_URL="http://0.0.0.0:$port$JUPYTERHUB_SERVICE_PREFIX"
echo "$port" > port.tmp && mv port.tmp port
cd "$HOME"
exec {command}
"""


def job_script(python: str, command: str, job_dir: str, modules: list[str] = ()) -> str:
    """The server's batch script; ``modules`` (an environment's, from the spawn form)
    are loaded before the server starts, as the site's own jobs load them."""
    load = f"module load {' '.join(shlex.quote(m) for m in modules)}\n" if modules else ""
    return _JOB_SH.format(
        python=python, command=command, job_dir=shlex.quote(job_dir), modules=load
    )


def env_file(env: dict[str, str]) -> str:
    """``export NAME='value'`` lines a POSIX shell sources (names it cannot take are left out)."""
    lines = [
        f"{name}={shlex.quote(value)}"
        for name, value in sorted(env.items())
        if name.isidentifier() and name not in SLURM_OWNS
    ]
    return "\n".join(lines) + "\n"


def sandbox_settings(info: dict) -> str:
    """Lines of ``gpulab_config.py`` that run users' servers on a sandbox as Slurm jobs.

    ``info``: ``data_dir``, ``slurm_conf``, ``controller_address`` (the bridge address
    the nodes reach this machine at), ``nodes``, and ``spawner`` (``gpulab
    slurm-sandbox up --spawner``). The spawner is off by default: its lines come
    commented out, as a note of how to switch it on; the inventory's are always on.
    Servers on the nodes reach the hub's API and the gpulab service on the bridge
    (their loopback is their own, so the public URL on 127.0.0.1 is not this
    machine's there): the hub listens there (``hub_ip``), and so does the service
    (``extra_listen_ips``, on its own port, which the ``gpulab up`` of the data dir
    picks); the servers' GPULAB_API_URL is that address with the service's port
    (``gpulab_connect_ip``), so the magics and widgets work on the nodes.
    """
    addr = info["controller_address"]
    inventory = [
        f"c.SlurmSite.slurm_conf = {info['slurm_conf']!r}",
        'c.InventorySettings.inventory_class = "slurm"',
        'c.SlurmInventory.gpu_model = "A100-80GB"',
        "c.SlurmInventory.simulated = True",
    ]
    spawner = [
        'c.JupyterHub.spawner_class = "gpulab-slurm"',
        f"c.JupyterHub.hub_ip = {addr!r}",
        f"c.JupyterHub.hub_connect_ip = {addr!r}",
        f"c.GpuLabService.extra_listen_ips = [{addr!r}]",
        f"c.FractionalSlurmSpawner.gpulab_connect_ip = {addr!r}",
    ]
    if info.get("spawner"):
        head = "# Servers as Slurm jobs on the sandbox (gpulab.spawner.slurm.sandbox_settings)"
        return "\n".join([*inventory, head, *spawner, ""])
    head = "# Servers as Slurm jobs (off; `gpulab slurm-sandbox up --spawner` writes these):"
    return "\n".join([*inventory, head, *(f"# {line}" for line in spawner), ""])


def api_url_at(url: str, ip: str) -> str:
    """``url`` with ``ip`` for its host, its port and path kept: the service's own
    URL (its port is the one ``gpulab up`` picked) as the nodes reach it."""
    parts = urlsplit(url)
    if not parts.hostname:
        raise ValueError(f"gpulab_api_url {url!r} names no host: set it to the service's URL")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = f"[{ip}]" if ":" in ip else ip
    return urlunsplit((parts.scheme, f"{host}:{port}", parts.path, "", ""))


#: The section this spawner took its shared settings from when it derived from the local
#: spawner; a site's ``c.FractionalLocalSpawner.gpulab_api_url``... still reaches it.
LOCAL_SECTION = "FractionalLocalSpawner"


class FractionalSlurmSpawner(FractionalHostSpawner):
    """A JupyterLab server as a Slurm batch job on the node the ledger chose.

    It shares ``c.FractionalHostSpawner.*`` with the local spawner (the gpulab
    service's URL and token, the kernel folder, the cache); of
    ``c.FractionalLocalSpawner.*`` it still takes those shared settings (it derived
    from that class once), below its own ``c.FractionalSlurmSpawner.*``.
    """

    #: A site environment runs here with modules (loaded in the batch script) or a
    #: prefix on the shared filesystem (its kernel, the user's layer), or both.
    environment_keys = ("modules", "prefix")

    unix_user_template = Unicode(
        "",
        help="""The Unix account a hub user's server runs as on the cluster
        ({username} is the hub name); it must exist on the nodes (LDAP...). Default
        "": gpulab's own accounts (c.UserAccounts, created on this host; the sandbox's
        nodes share it).

        c.FractionalSlurmSpawner.unix_user_template = "{username}"
        """,
    ).tag(config=True)

    sbatch_args = List(
        Unicode(),
        help="""More sbatch options for every server's job (time limit, memory, account).

        c.FractionalSlurmSpawner.sbatch_args = ["--time=08:00:00", "--mem=8G", "--account=lab"]
        """,
    ).tag(config=True)

    slurm_poll_seconds = Float(
        0.5,
        help="""How often a start asks Slurm whether the server's job runs yet.

        c.FractionalSlurmSpawner.slurm_poll_seconds = 2
        """,
    ).tag(config=True)

    gpulab_connect_ip = Unicode(
        "",
        help="""The address the nodes reach the gpulab service at, where the public
        URL (gpulab_public_api_url) does not reach from them. With it a server's
        GPULAB_API_URL is gpulab_api_url with this address for its host (the same
        port and path); the service must listen there too
        (c.GpuLabService.extra_listen_ips). The Slurm sandbox sets both to its
        bridge's address. Default "": gpulab_public_api_url.

        c.FractionalSlurmSpawner.gpulab_connect_ip = "10.77.0.1"
        """,
    ).tag(config=True)

    #: The server's Slurm job (kept in the hub's state).
    slurm_job_id: str = ""
    slurm_job_dir: str = ""

    def _find_my_config(self, cfg):
        # traitlets merges the sections of the class's bases, then its own. The local
        # spawner's shared settings rank between them; its others (a local process's)
        # are not this spawner's, left out rather than warned about on every start.
        mine = super()._find_my_config(cfg)
        if not cfg._has_section(LOCAL_SECTION):
            return mine
        name = type(self).__name__
        own = cfg[name] if cfg._has_section(name) else {}
        ours = self.traits(config=True)
        shared = {k: v for k, v in cfg[LOCAL_SECTION].items() if k in ours and k not in own}
        mine.merge(Config(shared))
        return mine

    def site(self) -> SlurmSite:
        return SlurmSite(parent=self)

    def get_env(self):
        env = super().get_env()  # the account's HOME, USER, SHELL among it
        if self.gpulab_connect_ip:
            env["GPULAB_API_URL"] = api_url_at(self.gpulab_api_url, self.gpulab_connect_ip)
        return env

    # -- who and where -----------------------------------------------------------------
    async def _cluster_account(self) -> Account:
        if self.unix_user_template:
            name = self.unix_user_template.format(username=self.user.name)
            try:
                pw = pwd.getpwnam(name)
            except KeyError:
                raise web.HTTPError(
                    500,
                    f"{self.user.name}'s Unix account {name!r} does not exist here; create it "
                    f"(the nodes need it too) or fix "
                    f"c.FractionalSlurmSpawner.unix_user_template",
                ) from None
            first = first_user_uid()
            if pw.pw_uid < first:
                # root, slurm, munge, daemon...: a hub user named so (an approved
                # sign-up, an OAuth login) would run as the system's own account.
                raise web.HTTPError(
                    403,
                    f"{self.user.name}'s Unix account {name!r} is a system account (uid "
                    f"{pw.pw_uid}, below UID_MIN {first}): servers do not run as "
                    f"one; give the user a name of their own or fix "
                    f"c.FractionalSlurmSpawner.unix_user_template",
                )
            return Account(name, pw.pw_uid, pw.pw_gid, (), pw.pw_dir, pw.pw_shell or "/bin/sh")
        accounts = self._accounts()
        if not accounts.enabled:
            raise web.HTTPError(
                500,
                "servers on Slurm run as their users' accounts: run the hub as root with "
                "c.UserAccounts.enabled, or set c.FractionalSlurmSpawner.unix_user_template",
            )
        return await self._ensure_account(accounts)

    # -- the server's life ----------------------------------------------------------------
    async def start(self):
        if self.internal_ssl:
            # A server on a Slurm node would need the hub's certificate for that node's
            # address, copied to it: not built yet. Refused before anything is held.
            raise web.HTTPError(
                500,
                "servers on Slurm nodes do not run with the hub's internal TLS yet: "
                "start this hub without --tls/--ssl-cert, or use the local spawner",
            )
        self.begin_progress()
        self.slurm_job_id = ""  # a failed start must never cancel an earlier job
        milli = parse_user_options(self.user_options)
        self.chosen_environment()  # an unknown one is a 400 before a slice is taken
        allocations = await self._allocate(milli)
        try:
            site = self.site()
            nodes = {n["name"]: n for n in await site.nodes()}
            node = allocations[0]["node"] if allocations else ""
            gres = ""
            if node:
                if node not in nodes:
                    raise web.HTTPError(
                        503, f"the ledger placed the slice on {node}, which Slurm does not list"
                    )
                try:
                    gres = SlurmInventory(parent=self).gres_request(nodes[node]["gres"], milli)
                except PoolError as e:
                    raise web.HTTPError(400, str(e)) from None
            self._slice = slice_env(allocations, any(a.get("simulated") for a in allocations), None)
            if gres and "GPULAB_GPU_SIMULATED" not in self._slice:
                self._slice["GPULAB_GPU_ENFORCEMENT"] = (
                    f"Slurm --gres={gres} (the card: CUDA_VISIBLE_DEVICES and the site's "
                    f"cgroup ConstrainDevices; the share: advice only)"
                )
            await self.show_placement(milli, allocations)
            self.account = await self._cluster_account()
            await self._make_user_env()
            if self.chosen_environment()[1].get("prefix"):
                await self._prepare_environment()  # its kernel, the user's layer over it
            self._write_kernelspec()
            await self._submit(site, node, gres, milli)
            self.report_progress(60, STARTING_LAB)
            return await self._wait_running(site, nodes)
        except BaseException:
            await self._cancel()
            await self._release()
            raise

    async def _submit(self, site: SlurmSite, node: str, gres: str, milli: int) -> None:
        account = self.account
        server = self.name or "default"
        job_dir = slurm_job_dir.path_in(account.home, server)
        command = " ".join(shlex.quote(a) for a in [*self.cmd, *self.get_args()])
        python = shlex.quote(self._python())
        modules = self.chosen_environment()[1].get("modules", [])
        files = {
            "env.sh": (env_file(self.get_env()), 0o600),
            "job.sh": (job_script(python, command, job_dir, modules), 0o700),
        }
        try:
            self.slurm_job_dir = await asyncio.get_running_loop().run_in_executor(
                None, slurm_job_dir.make_as, account, server, files
            )
        except RuntimeError as e:
            raise web.HTTPError(500, str(e)) from None
        argv = [
            "sbatch",
            "--parsable",
            f"--uid={account.uid}",
            f"--gid={account.gid}",
            "--export=NIL",
            f"--job-name=gpulab-server-{self.user.name}",
            f"--comment=gpulab-server:{self._owner}",
            f"--chdir={job_dir}",
            f"--output={job_dir}/slurm-%j.out",
            "--nodes=1",
            "--ntasks=1",
        ]
        if site.partition:
            argv.append(f"--partition={site.partition}")
        if node:
            argv.append(f"--nodelist={node}")
        if gres:
            argv.append(f"--gres={gres}")
        argv += self.sbatch_args
        try:
            # The script on stdin, as written here: sbatch runs as root, and would open
            # a job.sh in the user's folder through whatever link the user put there.
            out = await site.run(argv, input=files["job.sh"][0].encode())
        except SlurmError as e:
            raise web.HTTPError(503, f"Slurm did not take the server's job: {e}") from None
        self.slurm_job_id = out.strip().split(";")[0]
        self.log.info(
            "%s: Slurm job %s on %s (%s, %s) as %s",
            self._owner,
            self.slurm_job_id,
            node or "any node",
            label(milli),
            gres or "no GPU",
            account.name,
        )

    def _python(self) -> str:
        """The Python next to the server's command (the venv's), to pick a port."""
        cmd = self.cmd[0] if self.cmd else ""
        candidate = os.path.join(os.path.dirname(cmd), "python3") if os.path.isabs(cmd) else ""
        return candidate if candidate and os.path.exists(candidate) else "python3"

    async def _wait_running(self, site: SlurmSite, nodes: dict[str, dict]):
        """Until the job runs and has written its port: the server's (address, port)."""
        port_file = os.path.join(self.slurm_job_dir, "port")
        said = ""
        while True:
            job = await site.job(self.slurm_job_id)
            state = (job or {}).get("state", "GONE")
            if state not in ACTIVE_STATES:
                raise web.HTTPError(
                    500,
                    f"the server's Slurm job {self.slurm_job_id} ended ({state}) before "
                    f"JupyterLab started: {self._job_log_tail()}",
                )
            if state == "PENDING" and job.get("reason") and job["reason"] != said:
                said = job["reason"]
                self.report_progress(55, f"Waiting in Slurm's queue ({said})")
            written = self._users_file(port_file, 32) if state == "RUNNING" else None
            if written and written.strip().isdigit():
                port = int(written)
                node = job["nodes"]
                address = (nodes.get(node) or {}).get("address") or node
                self.report_progress(
                    80, f"JupyterLab starts on Slurm node {node} (job {self.slurm_job_id})"
                )
                return address, port
            await asyncio.sleep(self.slurm_poll_seconds)

    def _users_file(self, path: str, limit: int, tail: bool = False) -> bytes | None:
        """A file the server's job wrote in the user's home, as its account's plain file
        (root reads it: never through a link, never a FIFO, never another's file)."""
        return slurm_job_dir.read_users_file(path, self.account.uid, limit, tail)

    def _job_log_tail(self) -> str:
        path = os.path.join(self.slurm_job_dir, f"slurm-{self.slurm_job_id}.out")
        tail = self._users_file(path, 1500, tail=True)
        if tail is None:
            return f"(no log at {path})"
        return tail.decode(errors="replace") or "(its log is empty)"

    async def poll(self):
        if not self.slurm_job_id:
            return 0
        try:
            job = await self.site().job(self.slurm_job_id)
        except SlurmError as e:  # the controller is busy or down: not a dead server
            self.log.warning("Cannot ask Slurm about job %s: %s", self.slurm_job_id, e)
            return None
        if job and job["state"] in ACTIVE_STATES:
            return None
        return 1

    async def _cancel(self) -> None:
        if not self.slurm_job_id:
            return
        site = self.site()
        await site.cancel(self.slurm_job_id)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            job = await site.job(self.slurm_job_id)
            if not job or job["state"] not in ACTIVE_STATES:
                return
            await asyncio.sleep(0.5)
        self.log.warning("Slurm job %s still not ended 30 s after scancel", self.slurm_job_id)

    async def stop(self, now=False):
        try:
            await self._cancel()
        finally:
            await self._release()

    # -- what a restarted hub needs ------------------------------------------------------
    def get_state(self):
        state = super().get_state()
        if self.slurm_job_id:
            state["slurm_job_id"] = self.slurm_job_id
            state["slurm_job_dir"] = self.slurm_job_dir
        return state

    def load_state(self, state):
        super().load_state(state)
        self.slurm_job_id = state.get("slurm_job_id", "")
        self.slurm_job_dir = state.get("slurm_job_dir", "")

    def clear_state(self):
        super().clear_state()
        self.slurm_job_id = ""
        self.slurm_job_dir = ""
