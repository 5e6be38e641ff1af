"""``%gpulab``: this server's slice and alerts (status), the magics (help), and subcommands.

``%gpulab dashboard`` lives in :mod:`.dashboard`, ``%gpulab nettest`` in
:mod:`.nettest`, ``%gpulab alerts`` (and the status's alert line) in :mod:`.alerts`.
"""

from __future__ import annotations

import difflib
import os

from IPython.core.magic import Magics, line_magic, magics_class

from gpulab.client.units import gpu_label

HELP = """gpulab magics
  %gpulab            this server's GPU slice, the gpulab API address, and the
                     alerts firing now (one line: how many, which)
  %gpulab help       this text
  %gpulab dashboard  live Cluster / Cache / Network / Jobs / Alerts / Usage panel
                     (same as: from gpulab.widgets import Dashboard; Dashboard())
  %gpulab pools      where this site's GPUs are: each pool, its backend and
                     free slices, in the order jobs without --pool try them
  %gpulab alerts [--all]
                     the alerts firing now, as a table (--all: also those
                     resolved in the last 24 h, with how long they lasted)
  %gpulab nettest [--size BYTES] [--iters N] [--nproc N] [--warmup N] [--no-report]
                     all-reduce probe under torchrun (gloo on CPU, NCCL on GPUs):
                     prints algbw = size/time and busbw = algbw*2(n-1)/n (nccl-tests)
  %gpulab nettest --nodes N [--nproc N] [--gpu G] [--size BYTES] [--iters N]
                     the same probe across N nodes, as a job named nettest; the
                     service records its result for the dashboard's Network tab
                     (--nproc ranks per node, --gpu GPUs per rank; default 1 and 0)
  %%train_distributed [flags]   run the cell as a distributed PyTorch job
                     (%%train_distributed? lists the flags)
  %quantize NAME --scheme S --example X --to NEW
                     shrink a model; prints size, latency and error (%quantize? for more)
  %deploy NAME --name ENDPOINT --example X [--gpu 0.25 --replicas 2 ...]
                     serve a model as an OIP v2 endpoint behind hub login (%deploy? for more)
  %deploy --list     your endpoints: state, replicas, requests/s, p99 latency
                     (refreshes in place every 5 s for 10 min; --once: not)
  %deploy --stop ENDPOINT   stop it and free its slices
"""


#: The subcommands of %gpulab (an unknown one is answered with the closest).
COMMANDS = ("help", "dashboard", "alerts", "nettest", "pools")

# The same sentence as the spawn form's (gpulab.spawner.form); magics reach the
# platform only over HTTP, so the words are kept here too.
DEMO_LOGIN_WARNING = (
    "Demo login: anyone with the shared password can log in as any user. "
    "Restart without --demo for per-user accounts."
)
# The spawn form's too (gpulab.spawner.form.SINGLE_ACCOUNT_WARNING).
SINGLE_ACCOUNT_WARNING = (
    "Single account: every user's code runs as {account}; users are not separated on this host."
)


def slice_status(env: dict[str, str]) -> str:
    milli = int(env.get("GPULAB_GPU_MILLI") or 0)
    if not milli:
        gpu = "no GPU slice"
    else:
        gpu = f"{gpu_label(milli)} on {env.get('GPULAB_GPU_UUID')}"
        if env.get("GPULAB_GPU_SIMULATED"):
            gpu += " (simulated: nothing enforced)"
    api = env.get("GPULAB_API_URL") or "not set (this server was not started by gpulab)"
    status = f"GPU: {gpu}"
    if milli and env.get("GPULAB_GPU_ENFORCEMENT"):
        status += f"\nHeld by: {env['GPULAB_GPU_ENFORCEMENT']}"
    if env.get("GPULAB_LIMITS"):
        status += f"\nLimits: {env['GPULAB_LIMITS']}"
    status += f"\nAPI: {api}"
    if env.get("GPULAB_DEMO_LOGIN") == "1":
        status += f"\n{DEMO_LOGIN_WARNING}"
    if env.get("GPULAB_SINGLE_ACCOUNT"):
        status += "\n" + SINGLE_ACCOUNT_WARNING.format(account=env["GPULAB_SINGLE_ACCOUNT"])
    return status


@magics_class
class GpuLabMagics(Magics):
    @line_magic
    def gpulab(self, line: str = ""):
        """Show this server's GPU slice; `%gpulab help` lists the magics."""
        command, _, rest = line.strip().partition(" ")
        if command in ("help", "-h", "--help"):
            print(HELP)
            return
        if command in ("dashboard", "nettest", "alerts", "pools"):
            from . import alerts, dashboard, nettest, pools

            if command == "pools":
                pools.pools(rest)
            elif command == "dashboard":
                dashboard.dashboard(rest)
            elif command == "alerts":
                alerts.alerts(rest)
            else:
                nettest.nettest(rest)
            return
        if line.strip():
            close = difflib.get_close_matches(command, COMMANDS, n=1)
            hint = f" Did you mean %gpulab {close[0]}?" if close else ""
            print(f"unknown %gpulab command {line.strip()!r}.{hint}\n\n{HELP}")
            return
        env = dict(os.environ)
        print(slice_status(env))
        from .pools import status_line

        pools_line = status_line(env)
        if pools_line is not None:
            print(pools_line)
        from .alerts import status_alerts

        alert_line = status_alerts(env)
        if alert_line is not None:
            from IPython.display import display

            display(alert_line)
