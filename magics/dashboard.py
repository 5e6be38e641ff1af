"""``%gpulab dashboard``: the live panel (GPUs, dataset cache, network)."""

from __future__ import annotations


def dashboard(line: str):
    """The ``%gpulab dashboard`` subcommand: display a live Dashboard."""
    from gpulab.widgets import Dashboard
    from gpulab.widgets.dashboard import TEXT
    from gpulab.widgets.show import show

    if line.strip():
        print(
            f"%gpulab dashboard takes no arguments (got {line.strip()!r}); "
            "for options use: from gpulab.widgets import Dashboard; Dashboard(...)"
        )
        return None
    show(Dashboard(), TEXT)
    return None
