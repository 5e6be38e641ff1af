"""Range checks for the service's settings, shared by the parts' ``@validate`` methods.

Each check takes traitlets' proposal and names the setting as a site writes it
(``c.<Class>.<name>``), so a refused value says which line of the config to change.
"""

from traitlets import TraitError


def setting_name(proposal) -> str:
    """``c.<Class>.<trait>`` of the setting a proposal is for."""
    return f"c.{type(proposal.owner).__name__}.{proposal.trait.name}"


def positive(proposal):
    """Above 0 (a size, a count, a duration that cannot be off)."""
    if proposal.value <= 0:
        raise TraitError(f"{setting_name(proposal)} must be positive, got {proposal.value}")
    return proposal.value


def zero_or_more(proposal, zero_means: str):
    """0 or more, 0 meaning ``zero_means`` (e.g. "off")."""
    if proposal.value < 0:
        raise TraitError(
            f"{setting_name(proposal)} must be 0 ({zero_means}) or more, got {proposal.value}"
        )
    return proposal.value


def at_least_one(proposal, one_means: str):
    """1 or more, 1 meaning ``one_means``."""
    if proposal.value < 1:
        raise TraitError(
            f"{setting_name(proposal)} must be 1 ({one_means}) or more, got {proposal.value}"
        )
    return proposal.value


def share(proposal):
    """A share from 0 to 1."""
    if not 0 <= proposal.value <= 1:
        raise TraitError(
            f"{setting_name(proposal)} is a share from 0 to 1 (0.9 = 90%), got {proposal.value}"
        )
    return proposal.value


def tcp_port(proposal):
    """A TCP port, 0 for one the system picks."""
    if not 0 <= proposal.value <= 65535:
        raise TraitError(
            f"{setting_name(proposal)} is a TCP port from 1 to 65535 (0: one the system "
            f"picks), got {proposal.value}"
        )
    return proposal.value
