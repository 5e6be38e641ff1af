"""What every backend is: a traitlets ``Configurable`` the service builds one way.

A job backend, a serving backend (and a site's own, found by its entry point)
declares its settings as its own traits, ``c.<ClassName>.<setting>``, beside the
code that reads them: adding a setting touches that one file. The service
builds each the same way, handing over the parts of the service it works
with by name, never the service itself::

    cls(parent=service, log=service.log, root=..., gpus=the_pool's_gpus,
        accounts=..., limits=..., log_max_bytes=..., grace_seconds=...)

and calls :meth:`Plugin.check_settings` before anything listens, so a setting
the backend cannot run with stops the start on one line.
"""

from __future__ import annotations

import sys

from traitlets import Any, Bool, Float, Int, List, Unicode, default
from traitlets.config import LoggingConfigurable

from .log_pipe import DEFAULT_LOG_MAX_BYTES


class Plugin(LoggingConfigurable):
    """The collaborators every backend gets from the service (traits, not settings:
    the service sets them, a site's config does not)."""

    root = Unicode(help="The folder its work lives under: <data-dir>/jobs or /deployments.")
    gpus = List(help="The GPUs of its pool (gpulab.scheduler.inventory.Gpu).")
    accounts = Any(None, help="The users' Unix accounts (UserAccounts); None: run as the service.")
    limits = Any(None, help="What holds each account's processes (AccountLimits), or None.")
    log_max_bytes = Int(DEFAULT_LOG_MAX_BYTES, help="Each log's cap (0: none).")
    grace_seconds = Float(
        None, allow_none=True, help="SIGTERM to SIGKILL when its work is preempted."
    )
    python = Unicode(sys.executable, help="The interpreter that runs users' work.")
    real_gpus = Bool(help="Whether its GPUs are real (NVML) rather than simulated.")

    @default("real_gpus")
    def _any_real(self) -> bool:
        return any(not g.simulated for g in self.gpus)

    def __init__(self, root: str | None = None, **kwargs):
        # The folder comes first, as before backends were Configurables.
        if root is not None:
            kwargs["root"] = root
        super().__init__(**kwargs)

    def check_settings(self) -> None:
        """Raise ``ValueError`` (what is wrong and what to set) for settings this
        backend cannot run with; the service stops its start on it."""
