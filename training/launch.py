"""torchrun with gpulab's signed rendezvous: ``python -m gpulab.training.launch ARGS...``.

The same arguments as ``python -m torch.distributed.run``; it only registers
``--rdzv-backend=gpulab`` (:mod:`gpulab.training.rendezvous`) first. Every gpulab
backend starts its nodes' agents this way (``gpulab.backend.render``).
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    from torch.distributed.run import main as torchrun_main

    from .rendezvous import register

    register()
    torchrun_main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
