"""MIG profiles per card model, and snapping a slice to the profile that holds it.

A MIG card's memory comes in eighths (A30: quarters, written here as two
eighths each) and its compute in sevenths (A30: fourths). gpulab offers
slices as fractions of a card; a fraction is snapped *up* to the smallest
balanced profile whose memory is at least the fraction of the card's memory,
the fewest compute slices winning a tie (``3g.40gb`` over ``4g.40gb``). So on
an H100-80GB a 1/10 slice is ``1g.10gb``, 1/4 is ``2g.20gb``, 1/2 is
``3g.40gb`` and a whole card is ``7g.80gb``.

Only the balanced profiles are listed: the extra-memory ones (``1g.20gb``)
would otherwise win ties with less compute than the slice asked for.
Operators with other cards or layouts pass their own table (the ``profiles``
option of the ``mig`` backend), e.g. ``{"A100-80GB": ["1g.10gb", "3g.40gb", "7g.80gb"]}``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from .base import EnforcementError

#: Balanced MIG profiles by card, smallest first (NVIDIA MIG user guide).
MIG_PROFILES: dict[str, tuple[str, ...]] = {
    "A30-24GB": ("1g.6gb", "2g.12gb", "4g.24gb"),
    "A100-40GB": ("1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
    "A100-80GB": ("1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    "H100-80GB": ("1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    "H100-94GB": ("1g.12gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"),
    "H200-141GB": ("1g.18gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
    "B200-180GB": ("1g.23gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"),
}

_FAMILY = re.compile(r"(?<![A-Z0-9])(A100|A30|H100|H200|B200)(?![0-9])")
_GB = re.compile(r"(\d+)\s*GB")
_PROFILE = re.compile(r"^(\d+)g\.(\d+)gb$")


@dataclass(frozen=True)
class MigProfile:
    name: str  # "2g.20gb"
    compute_slices: int
    memory_gb: int
    memory_eighths: int  # share of the card's memory, in eighths

    @property
    def resource(self) -> str:
        """The extended resource NVIDIA's device plugin offers (mixed strategy)."""
        return f"nvidia.com/mig-{self.name}"


def profiles_of(names: tuple[str, ...] | list[str]) -> list[MigProfile]:
    parsed = []
    for name in names:
        m = _PROFILE.match(name)
        if not m:
            raise EnforcementError(f"cannot read MIG profile {name!r}; write it like 2g.20gb")
        parsed.append((name, int(m.group(1)), int(m.group(2))))
    if not parsed:
        raise EnforcementError("a MIG profile table needs at least one profile, e.g. 7g.80gb")
    card_gb = max(gb for _, _, gb in parsed)
    return [MigProfile(name, g, gb, max(1, round(gb * 8 / card_gb))) for name, g, gb in parsed]


def card_key(model: str, memory_mib: int = 0, table: dict | None = None) -> str:
    """The table's key for a card: ``"NVIDIA H100 80GB HBM3"`` -> ``"H100-80GB"``.

    GFD's ``"NVIDIA-H100-80GB-HBM3"`` and the simulated ``"H100-80GB"`` read the
    same; names without a size (``"NVIDIA H200"``) take the variant nearest to
    ``memory_mib``. A key equal to the model as reported always wins.
    """
    table = MIG_PROFILES if table is None else table
    if model in table:
        return model
    upper = model.upper().replace("_", "-")
    family = _FAMILY.search(upper)
    if not family:
        example = f'{{"profiles": {{"{model}": ["1g.10gb", "7g.80gb"]}}}}'
        raise EnforcementError(
            f"no MIG profiles known for GPU model {model!r}; known: {', '.join(sorted(table))}. "
            f"Pass a table: enforcement_options = {example}"
        )
    variants = {
        k: int(m.group(1))
        for k in table
        if k.upper().startswith(family.group(1) + "-") and (m := _GB.search(k))
    }
    if not variants:
        raise EnforcementError(
            f"no MIG profiles known for {family.group(1)} cards "
            f"(model {model!r}); known: {', '.join(sorted(table))}"
        )
    gb = _GB.search(upper)
    want = int(gb.group(1)) if gb else memory_mib / 1024
    return min(variants, key=lambda k: abs(variants[k] - want))


def snap(milli: int, model: str, memory_mib: int = 0, table: dict | None = None) -> MigProfile:
    """The smallest profile of ``model`` that holds ``milli`` of one card (1..1000)."""
    if not 0 < milli <= 1000:
        raise EnforcementError(f"a MIG profile holds 1..1000 milli-GPU of one card, got {milli}")
    table = MIG_PROFILES if table is None else table
    key = card_key(model, memory_mib, table)
    need = math.ceil(milli * 8 / 1000)
    fits = [p for p in profiles_of(table[key]) if p.memory_eighths >= need]
    if not fits:
        raise EnforcementError(f"no MIG profile of {key} holds {milli} milli-GPU")
    return min(fits, key=lambda p: (p.memory_eighths, p.compute_slices))
