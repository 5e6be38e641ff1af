"""A ``%deploy`` whose replicas do not start, told in a few lines, as an exception.

The service says what happened to the version (``replica 0 exited with code 1 (5
times in 300 s); slices released. Last log: ...``); the replica's log says why (its
last line is the model server's own: ``gpulab-serving: cannot load the model ...``).
:class:`DeploymentFailed` carries both and what to do next, and stops a notebook run
like any error (a ``UsageError`` only prints a line, and the next cell runs against an
endpoint that is not there).
"""

from __future__ import annotations

RED, BOLD, RESET = "\x1b[31m", "\x1b[1m", "\x1b[0m"
#: The last lines of a replica's log shown under the cause.
LOG_LINES = 3


def what_happened(message: str) -> str:
    """The service's words without the log it appends (shown from the log itself)."""
    head = message.split(" Last log:", 1)[0].strip()
    return head.removesuffix("slices released.").strip().rstrip(";").strip() or message


def log_cause(log: str) -> list[str]:
    """The last lines of a replica's log that say something (not blank, not the
    repeated prefix of a torch warning's traceback)."""
    lines = [line.rstrip() for line in log.splitlines() if line.strip()]
    return lines[-LOG_LINES:]


class DeploymentFailed(RuntimeError):
    """The endpoint's replicas did not start (or not in time); the message says why
    and what to do. IPython shows :meth:`_render_traceback_`: these lines, not a
    traceback through gpulab's magics."""

    def __init__(self, label: str, name: str, message: str, log: str = "", timed_out=False):
        self.name = name
        if timed_out:
            head = f"{label}: the replicas are not ready after the wait ({message})"
            todo = (
                f"see why with %deploy --logs {name} and %deploy --list; stop it with "
                f"%deploy --stop {name}"
            )
        else:
            head = f"{label}: the replicas did not start: {what_happened(message)}"
            todo = (
                f"fix the model (export it again; check it runs in the notebook), then "
                f"%deploy ... --replace; the whole log: %deploy --logs {name}"
            )
        cause = log_cause(log)
        self.lines = [
            f"{RED}{BOLD}DeploymentFailed: {head}{RESET}",
            *(["replica log (last lines):", *(f"  {line}" for line in cause)] if cause else []),
            f"what to do: {todo}",
        ]
        plain = [head, *(["replica log: " + " | ".join(cause)] if cause else []), todo]
        super().__init__("; ".join(plain))

    def _render_traceback_(self) -> list[str]:
        return list(self.lines)
