"""IPython magics of gpulab: ``%load_ext gpulab.magics`` (gpulab's servers load it).

``%gpulab`` shows the slice this server holds and where the gpulab API is.
"""

from __future__ import annotations

from .status import GpuLabMagics


def load_ipython_extension(ipython) -> None:
    ipython.register_magics(GpuLabMagics)


def unload_ipython_extension(ipython) -> None:  # pragma: no cover - IPython keeps magics
    pass
