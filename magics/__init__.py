"""IPython magics of gpulab: ``%load_ext gpulab.magics`` (gpulab's servers load it).

``%gpulab`` shows the slice this server holds and where the gpulab API is;
``%%train_distributed`` runs a cell as a distributed PyTorch job; ``%quantize``
shrinks a model; ``%deploy`` serves one as an endpoint; ``%vectors`` works with vector
collections. ``%gpulab help`` lists them all.
"""

from __future__ import annotations

from .deploy import DeployMagics
from .quantize import QuantizeMagics
from .status import GpuLabMagics
from .train import TrainMagics
from .vectors import VectorsMagics


def load_ipython_extension(ipython) -> None:
    ipython.register_magics(GpuLabMagics)
    ipython.register_magics(QuantizeMagics)
    ipython.register_magics(TrainMagics)
    ipython.register_magics(DeployMagics)
    ipython.register_magics(VectorsMagics)
    # A notebook that was hibernated gets its variables back as its kernel starts.
    from .hibernate import restore_on_start

    restore_on_start(ipython)
    # The user's threads, for the server's idle check (a thread at work: not idle).
    from .kernel_work import start_in_kernel

    start_in_kernel()


def unload_ipython_extension(ipython) -> None:  # pragma: no cover - IPython keeps magics
    pass
