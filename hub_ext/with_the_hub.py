"""Run a command for as long as the hub that started it runs:
``python -m gpulab.hub_ext.with_the_hub HUB_PID COMMAND [ARG...]``.

The hub's idle culler sends its token (which stops anyone's server) to the hub's
port at every round. A hub killed without its shutdown leaves the services it
manages running, and a user's process that then takes the hub's port would be sent
that token. Started through this, the culler is ended (SIGTERM) by the kernel when
its parent, the hub, ends; the next ``gpulab up`` starts another.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

#: prctl(2): the signal this process gets when the thread that started it ends (the
#: hub starts its services from its event loop's thread, which lives as long as it).
PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> None:
    if len(argv) < 2 or not argv[0].isdigit():
        sys.exit("usage: python -m gpulab.hub_ext.with_the_hub HUB_PID COMMAND [ARG...]")
    hub, command = int(argv[0]), argv[1:]
    # Its default action: an ignored SIGTERM (inherited from whoever started the hub)
    # would be kept across exec, and the command would run on.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")
    # Asked after the signal was set: a hub that ended before could send none.
    if os.getppid() != hub:
        sys.exit(f"the hub (pid {hub}) is gone; not starting {command[0]}")
    os.execvp(command[0], command)  # the signal is kept across exec


if __name__ == "__main__":
    main(sys.argv[1:])
