"""The site's environments on the spawn form, beside the slice.

The admin declares them once (``c.SiteEnvironments.environments``, read by the
service's job backends too); each spawner offers those it can run
(``environment_keys``: a prefix on the box, an image on Kubernetes, modules or a
prefix on Slurm). A user picks one (``user_options["environment"]``); nothing picked
(``""``) is gpulab's own environment, as before. The server's kernels then run in it
(:mod:`gpulab.enforcement.environments`: the user's installs layered on top), its
``GPULAB_ENVIRONMENT`` names it, and jobs submitted from the server carry that name.
"""

from __future__ import annotations

import os
from html import escape

from gpulab.enforcement.environments import SiteEnvironments

from .user_options import bad_options

#: The environment variable that names the server's environment ("" or unset: gpulab's).
ENVIRONMENT_ENV = "GPULAB_ENVIRONMENT"


class EnvironmentsMixin:
    """The spawn form's environment choice (mixed into gpulab's spawners)."""

    #: The keys of an environment this spawner can run (one is enough).
    environment_keys: tuple[str, ...] = ("prefix",)

    def site_environments(self) -> SiteEnvironments:
        return SiteEnvironments(config=self.config)

    def offered_environments(self) -> dict[str, dict]:
        return self.site_environments().offered(*self.environment_keys)

    def chosen_environment(self) -> tuple[str, dict]:
        """``(name, its settings)`` the start asks for; ``("", {})`` for gpulab's own.
        A name this spawner does not offer is a 400 that lists those it does."""
        name = (self.user_options or {}).get("environment") or ""
        if not name:
            return "", {}
        offered = self.offered_environments()
        if name not in offered:
            known = ", ".join(sorted(offered)) or "none are set up"
            raise bad_options(f"unknown environment {name!r}; this site's: {known}")
        return name, dict(offered[name])

    def environments_html(self, last: str | None = None) -> str:
        """The form's fieldset (empty where the site offers none here)."""
        offered = self.offered_environments()
        if not offered:
            return ""
        chosen = last if last in offered else ""
        title = self.site_environments().default_title
        rows = []
        for i, (name, env) in enumerate([("", {}), *sorted(offered.items())]):
            ident = f"gpulab-env-{i}"
            about = env.get("description") or ""
            checked = " checked" if name == chosen else ""
            rows.append(
                f'<div class="radio"><label for="{ident}"><input type="radio" '
                f'name="environment" id="{ident}" value="{escape(name)}"{checked}> '
                f"<strong>{escape(name or title)}</strong>"
                + (f' <span class="text-muted">{escape(about)}</span>' if about else "")
                + "</label></div>"
            )
        return (
            '<fieldset class="gpulab-environments"><legend>Environment</legend>'
            + "".join(rows)
            + '<p class="help-block">Your kernels and jobs run in it; what you '
            "<code>%pip install</code> stays yours.</p></fieldset>"
        )


def prefix_problem(prefix: str) -> str | None:
    """Why a prefix cannot be a server's environment on this host, or None."""
    python = os.path.join(prefix, "bin", "python")
    if not os.access(python, os.X_OK):
        return f"{python} is not an executable interpreter"
    return None
