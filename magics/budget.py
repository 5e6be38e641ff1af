"""The budget line of ``%gpulab``: GPU-hours used and left this period, yours and your
groups', with what it cost where the site sets a price, and the refusal when new GPU
work would be refused."""

from __future__ import annotations

from html import escape

from gpulab.client.budget import budget_text

from .alerts import STATUS_TIMEOUT_S  # %gpulab waits as long for each of its lines
from .rich import Row


def _fetch(timeout: float) -> dict:
    from gpulab.client import Client

    return Client(timeout=timeout).budget()


def status_rows(env: dict[str, str]) -> list[Row]:
    """``Budget: This month (until 2027-01-01): 1.5 GPU-hours used, 8.5 left of your
    10; ...`` and, over a budget, the refusal; nothing where no budget or price applies
    or outside a server gpulab started."""
    if not env.get("GPULAB_API_URL"):
        return []
    try:
        status = _fetch(STATUS_TIMEOUT_S)
    except Exception:  # noqa: BLE001
        # Never a traceback; and no line of its own: the pools line above already says
        # the service did not answer (an older service without budgets answers 404).
        return []
    if not (status.get("set") or status.get("price_per_gpu_hour")):
        return []
    text = budget_text(status)
    rows = [Row.of("Budget", text, escape(text))]
    if status.get("refusal"):
        rows.append(Row.warn(status["refusal"]))
    return rows
