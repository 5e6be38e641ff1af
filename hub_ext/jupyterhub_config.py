# The hub configuration `gpulab up` runs: everything comes from gpulab's
# settings (environment set by the CLI), then <data-dir>/gpulab_config.py.
from gpulab.hub_ext.hub_config import Settings, configure

c = get_config()  # noqa: F821 (provided by JupyterHub)
settings = Settings.from_env()
configure(c, settings)

_override = settings.data_dir / "gpulab_config.py"
if _override.exists():
    load_subconfig(str(_override))  # noqa: F821

# Where one Unix account runs everyone's code (no root, or accounts turned off above),
# the banner, the spawn form and %gpulab say so, and the hub is its first user's alone.
from gpulab.hub_ext.single_account import one_person_only, say_single_account  # noqa: E402

say_single_account(c)
one_person_only(c, settings.data_dir)
