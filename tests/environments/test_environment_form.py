"""The environments' choice as the spawn form renders it and as each spawner reads it
back; the Slurm batch script loads an environment's modules; a bad setting is said on
one line."""

import pytest
from tornado import web
from traitlets import TraitError
from traitlets.config import Config

from gpulab.enforcement.environments import SiteEnvironments
from gpulab.spawner.form import render_form
from gpulab.spawner.local import FractionalLocalSpawner
from gpulab.spawner.slurm import FractionalSlurmSpawner, job_script
from gpulab.spawner.user_options import parse_user_options

ENVIRONMENTS = {
    "science": {"prefix": "/opt/envs/science", "description": "pandas 3, PyTorch 2.5"},
    "cu12": {"image": "ghcr.io/site/cu12:1", "modules": ["cuda/12.4", "cudnn/9 beta"]},
}
AVAILABILITY = {
    "sizes": [
        {"milli": 0, "label": "no GPU", "count": 0, "available": True, "reason": None},
        {"milli": 250, "label": "1/4 GPU", "count": 4, "available": True, "reason": None},
    ],
    "held_milli": 0,
    "quota_milli": None,
}


def spawner(cls=FractionalLocalSpawner):
    c = Config()
    c.SiteEnvironments.environments = ENVIRONMENTS
    return cls(config=c)


def test_the_form_offers_the_environments_this_spawner_runs_beside_the_slice():
    local = spawner()
    html = render_form(
        AVAILABILITY, demo=False, shared_account="", environments=local.environments_html()
    )
    assert "<legend>Environment</legend>" in html
    assert 'name="environment" id="gpulab-env-0" value="" checked> <strong>gpulab (default)' in html
    assert 'value="science"> <strong>science</strong>' in html
    assert "pandas 3, PyTorch 2.5" in html
    assert "cu12" not in html  # an image and modules: not something the box runs
    # The last start's pick is picked again.
    assert 'value="science" checked>' in local.environments_html("science")
    # The Slurm spawner runs modules as well as prefixes.
    assert 'value="cu12">' in spawner(FractionalSlurmSpawner).environments_html()
    # Nothing declared: no fieldset, the form as before.
    assert FractionalLocalSpawner(config=Config()).environments_html() == ""


def test_the_pick_comes_back_as_user_options_and_an_unknown_one_is_a_400():
    local = spawner()
    assert local.options_from_form({"gpu_milli": ["250"], "environment": ["science"]}) == {
        "gpu_milli": 250,
        "environment": "science",
    }
    assert local.options_from_form({"gpu_milli": ["250"], "environment": [""]}) == {
        "gpu_milli": 250
    }
    assert parse_user_options({"gpu_milli": 250, "environment": "science"}) == 250
    with pytest.raises(web.HTTPError, match='"environment" must be the name'):
        parse_user_options({"gpu_milli": 0, "environment": 3})
    local.user_options = {"gpu_milli": 0, "environment": "cu12"}
    with pytest.raises(web.HTTPError, match="unknown environment 'cu12'; this site's: science"):
        local.chosen_environment()
    local.user_options = {"gpu_milli": 0, "environment": "science"}
    assert local.chosen_environment() == ("science", ENVIRONMENTS["science"])


def test_the_slurm_script_loads_the_environments_modules_before_the_server():
    plain = job_script("python3", "jupyterhub-singleuser", "/srv/jobs/1")
    assert "module load" not in plain
    script = job_script(
        "python3", "jupyterhub-singleuser", "/srv/jobs/1", ["cuda/12.4", "cudnn/9 beta"]
    )
    assert "module load cuda/12.4 'cudnn/9 beta'\nexport CUDA_VISIBLE_DEVICES" in script
    assert script.index("module load") < script.index("exec jupyterhub-singleuser")


def test_a_bad_setting_is_one_line_that_says_what_to_write():
    with pytest.raises(TraitError, match=r"environments\['my env'\]: a name is 1-63 letters"):
        SiteEnvironments(environments={"my env": {"prefix": "/opt/x"}})
    with pytest.raises(TraitError, match=r"must be a dict of description, prefix, image, modules"):
        SiteEnvironments(environments={"x": {"path": "/opt/x"}})
    with pytest.raises(TraitError, match=r"\['modules'\] must be a list of module names"):
        SiteEnvironments(environments={"x": {"modules": "cuda"}})
