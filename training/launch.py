"""torchrun with gpulab's signed rendezvous: ``python -m gpulab.training.launch ARGS...``.

The same arguments as ``python -m torch.distributed.run``; it registers
``--rdzv-backend=gpulab`` (:mod:`gpulab.training.rendezvous`) first. Every gpulab
backend starts its nodes' agents this way (``gpulab.backend.render``).

When the ranks run gpulab's runner (``--module gpulab.training.runner``, what every
backend renders) in this same interpreter, the agent forks them instead of starting
a fresh ``python`` for each: the agent has torch imported already, which a new
interpreter pays again (1.2 to 1.8 CPU-seconds a rank, at every start and restart).
The rank is the same process it would have been otherwise: its own session, the
default signal handlers, the same variables, its pid in ``pids/rank<R>.json``,
the same exit codes. ``GPULAB_RANK_START=exec`` in the job's environment starts
each rank as a new interpreter again. The agent never touches CUDA, so a forked
rank can (torch refuses CUDA only in a child whose parent initialised it).
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import sys

RUNNER = "gpulab.training.runner"
#: "exec": each rank a new interpreter (torchrun's own way); "fork" (the default).
RANK_START = "GPULAB_RANK_START"


def forks_ranks(args) -> bool:
    """Do this agent's ranks run the runner in this interpreter, and may they be forked?"""
    return (
        args.module
        and not args.no_python
        and args.training_script == RUNNER
        and os.environ.get("PYTHON_EXEC", sys.executable) == sys.executable
        and os.environ.get(RANK_START, "fork") != "exec"
    )


def forked_rank(job_dir: str) -> None:
    """One rank, in a child forked by torchrun's agent (its function entrypoint)."""
    from . import runner

    os.setsid()  # as torchrun's subprocess ranks: a signal to the agent's group misses it
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)  # the agent's raise SignalException
    _close_inherited_listeners()
    sys.argv = [runner.__file__, job_dir]
    runner.run(job_dir)
    runner.finish()
    # The agent reads the return value; then the child ends at once, as a rank run
    # as ``python -m`` does (its os._exit): threads the cell left running, or gloo's
    # unwinding, must not hold up or abort a finished rank.
    import multiprocessing.util

    multiprocessing.util._exit_function = lambda: os._exit(0)


def _close_inherited_listeners() -> None:
    """The agent's listening sockets (its rendezvous store's) are not the rank's: a rank
    that outlived its agent would keep the port (a new interpreter inherits none)."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if fd < 3 or not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            sock = socket.socket(fileno=fd)
        except OSError:
            continue  # the listing's own fd, gone by now
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            sock.close()
        else:
            sock.detach()


def main(argv: list[str] | None = None) -> None:
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import record

    from .rendezvous import register

    register()
    argv = sys.argv[1:] if argv is None else argv
    args = torchrun.parse_args(argv)
    if not forks_ranks(args):
        torchrun.main(argv)
        return
    import cloudpickle  # noqa: F401 - every rank loads the cell's variables with it

    from . import runner  # noqa: F401 - imported once here rather than in every rank

    record(_launch_forking)(torchrun, args)


def _report_every_failed_rank() -> None:
    """torchrun's forked workers report only the first failed rank it sees; its
    subprocess workers report every one, and gpulab names the root cause from that
    list (``backend/failures.py``: a rank killed by a signal, seen after the peers
    its death broke). Make the forked ones report every one too."""
    from torch.distributed.elastic import multiprocessing as elastic_mp
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    class ForkedRanks(elastic_mp.MultiprocessContext):
        def _poll(self):
            result = super()._poll()
            if result is None or not result.failures:
                return result
            for local_rank, proc in enumerate(self._pc.processes):
                if local_rank not in result.failures and proc.exitcode not in (None, 0):
                    result.failures[local_rank] = ProcessFailure(
                        local_rank=local_rank,
                        pid=proc.pid,
                        exitcode=proc.exitcode,
                        error_file=self.error_files[local_rank],
                    )
            return result

    # start_processes picks the class by this module-level name when it is called.
    elastic_mp.MultiprocessContext = ForkedRanks


def _launch_forking(torchrun, args) -> None:
    from torch.distributed.launcher.api import elastic_launch

    _report_every_failed_rank()
    if args.master_port is None:  # as torchrun.run does
        args.master_port = 29500
    config, _, _ = torchrun.config_from_args(args)
    config.start_method = "fork"
    elastic_launch(config=config, entrypoint=forked_rank)(*args.training_script_args)


if __name__ == "__main__":
    main()
