"""``%gpulab``: this server's slice and alerts (status), the magics (help), and subcommands.

``%gpulab dashboard`` lives in :mod:`.dashboard`, ``%gpulab nettest`` in
:mod:`.nettest`, ``%gpulab alerts`` (and the status's alert line) in :mod:`.alerts`.
"""

from __future__ import annotations

import difflib
import os
from html import escape

from IPython.core.magic import Magics, line_magic, magics_class

from gpulab.client.units import gpu_label

from .rich import Row, muted, rows_bundle, show_listing

HELP = """gpulab magics
  %gpulab            this server's GPU slice, the gpulab API address, the
                     alerts firing now (one line: how many, which) and, where
                     the site sets budgets, GPU-hours used and left this month
  %gpulab help       this text
  %gpulab dashboard  live Cluster / Cache / Network / Jobs / Alerts / Usage panel
                     (same as: from gpulab.widgets import Dashboard; Dashboard())
  %gpulab pools      where this site's GPUs are: each pool, its backend and
                     free slices, in the order jobs without --pool try them
  %gpulab alerts [--all]
                     the alerts firing now, as a table (--all: also those
                     resolved in the last 24 h, with how long they lasted)
  %gpulab alerts --ack ID
                     you have seen alert #ID: it stops counting as firing
                     (a failed job's resolves)
  %gpulab nettest [--size BYTES] [--iters N] [--nproc N] [--warmup N] [--no-report]
                     all-reduce probe under torchrun (gloo on CPU, NCCL on GPUs):
                     prints algbw = size/time and busbw = algbw*2(n-1)/n (nccl-tests)
  %gpulab nettest --nodes N [--nproc N] [--gpu G] [--size BYTES] [--iters N]
                     the same probe across N nodes, as a job named nettest; the
                     service records its result for the dashboard's Network tab
                     (--nproc ranks per node, --gpu GPUs per rank; default 1 and 0)
  %gpulab hibernate  save every kernel's variables to ~/.gpulab/hibernate, stop
                     this server and give its GPU back; starting it again (any
                     size, or none) brings each notebook's variables back
  %gpulab wake [--list | NAME]
                     restore a hibernated kernel's variables in this kernel by
                     hand (none: the most recent not restored; --list: all kept)
  %%train_distributed [flags]   run the cell as a distributed PyTorch job
                     (%%train_distributed? lists the flags)
  %quantize NAME --scheme S --example X --to NEW
                     shrink a model; prints size, latency and error (%quantize? for more)
  %deploy NAME --name ENDPOINT --example X [--gpu 0.25 --replicas 2 ...]
                     serve a model as an OIP v2 endpoint behind hub login (%deploy? for more)
  %deploy --list     your endpoints: state, replicas, requests/s, p99 latency
                     (refreshes in place every 5 s for 10 min; --once: not)
  %deploy --stop ENDPOINT   stop it and free its slices
  %vectors list | create NAME --dim N | create NAME --embed ENDPOINT
  %vectors search NAME TEXT [-k K] | count NAME | share NAME --users A,B | drop NAME
                     vector collections (rows go in from Python:
                     Collection("docs").insert(texts=..., metadata=...))
"""


#: The subcommands of %gpulab (an unknown one is answered with the closest).
COMMANDS = ("help", "dashboard", "alerts", "nettest", "pools", "hibernate", "wake")

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


def slice_rows(env: dict[str, str]) -> list[Row]:
    """This server's slice, what holds it to it, its limits, the API and the warnings."""
    milli = int(env.get("GPULAB_GPU_MILLI") or 0)
    if not milli:
        rows = [Row.of("GPU", "no GPU slice")]
    else:
        amount, uuid = gpu_label(milli), str(env.get("GPULAB_GPU_UUID"))
        text = f"{amount} on {uuid}"
        html = f"<b>{escape(amount)}</b> on <code>{escape(uuid)}</code>"
        if env.get("GPULAB_GPU_SIMULATED"):
            text += " (simulated: nothing enforced)"
            html += " " + muted("(simulated: nothing enforced)")
        rows = [Row.of("GPU", text, html)]
    if milli and env.get("GPULAB_GPU_ENFORCEMENT"):
        rows.append(Row.of("Held by", env["GPULAB_GPU_ENFORCEMENT"]))
    if env.get("GPULAB_LIMITS"):
        rows.append(Row.of("Limits", env["GPULAB_LIMITS"]))
    api = env.get("GPULAB_API_URL")
    if api:
        rows.append(Row.of("API", api, f"<code>{escape(api)}</code>"))
    else:
        rows.append(Row.of("API", "not set (this server was not started by gpulab)"))
    if env.get("GPULAB_DEMO_LOGIN") == "1":
        rows.append(Row.warn(DEMO_LOGIN_WARNING))
    if env.get("GPULAB_SINGLE_ACCOUNT"):
        rows.append(Row.warn(SINGLE_ACCOUNT_WARNING.format(account=env["GPULAB_SINGLE_ACCOUNT"])))
    return rows


def slice_status(env: dict[str, str]) -> str:
    """The slice's lines as text (``GPU: 1/4 GPU on GPU-...``, ``API: ...``)."""
    return "\n".join(row.text for row in slice_rows(env))


def status_bundle(env: dict[str, str]) -> dict[str, str]:
    """``%gpulab``'s one output: the slice, then the pools and the alerts the service
    gives (outside a server gpulab started, neither), as a table and as text."""
    from . import budget, hibernate
    from .alerts import status_alerts
    from .pools import status_row

    rows = slice_rows(env)
    more = (status_row(env), hibernate.status_row(env), status_alerts(env))
    rows += [row for row in more if row is not None]
    rows += budget.status_rows(env)
    return rows_bundle(rows, "gpulab-status")


@magics_class
class GpuLabMagics(Magics):
    @line_magic
    def gpulab(self, line: str = ""):
        """Show this server's GPU slice; `%gpulab help` lists the magics."""
        command, _, rest = line.strip().partition(" ")
        if command in ("help", "-h", "--help"):
            print(HELP)
            return
        if command in ("hibernate", "wake"):
            from . import hibernate

            if command == "hibernate":
                hibernate.hibernate_command(rest)
            else:
                hibernate.wake_command(self.shell, rest)
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
        show_listing(status_bundle(dict(os.environ)))
