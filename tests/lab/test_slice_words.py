"""The status bar's words for each kind of slice (gpulab.lab.slice_info), from the
environment the spawner really writes (gpulab.enforcement.slice_env)."""

import pytest

from gpulab.enforcement.slice_env import slice_env
from gpulab.lab.slice_info import describe, fraction_words, read_slice

A100 = {"model": "A100-80GB", "memory_mib": 81920}
API = {"GPULAB_API_URL": "http://hub/services/gpulab/api/v1"}


def words(allocations, simulated=False, mps_dir=None, used=None, extra=None, models=None):
    env = {**API, **slice_env(allocations, simulated, mps_dir), **(extra or {})}
    s = read_slice(env)
    models = models if models is not None else {u: A100 for u in s["gpus"]}
    return describe(s, models, used, "note")["text"]


def row(uuid="GPU-a", milli=250, memory_mib=20480):
    return {"gpu_uuid": uuid, "milli": milli, "memory_mib": memory_mib}


@pytest.mark.parametrize(
    "milli, text",
    [(250, "1/4"), (500, "1/2"), (125, "1/8"), (1000, "1"), (2000, "2"), (333, "0.333")],
)
def test_fractions(milli, text):
    assert fraction_words(milli) == text


def test_each_kind_of_slice_in_words():
    assert words([row()]) == "1/4 A100-80GB · 20 GiB · PyTorch memory limit"
    assert words([row()], simulated=True) == "1/4 A100-80GB · 20 GiB · simulated"
    assert words([row()], mps_dir="/tmp/mps") == "1/4 A100-80GB · 20 GiB · MPS limit"
    assert words([row()], used=3.2 * 1024) == "1/4 A100-80GB · 3.2/20 GiB · PyTorch memory limit"
    assert words([row(milli=1000, memory_mib=81920)]) == "1 A100-80GB · 80 GiB · whole GPU"
    assert (
        words([row(milli=1000, memory_mib=81920), row("GPU-b", 1000, 81920)])
        == "2 A100-80GB · 160 GiB · whole GPU"
    )
    mig = [row("MIG-1", 142, 10240)]
    assert words(mig, extra={"GPULAB_MIG_PROFILE": "1g.10gb"}) == "1g.10gb A100-80GB · 10 GiB · MIG"
    # The service could not be asked: the slice is still known, the model is not.
    assert words([row()], models={}) == "1/4 GPU · 20 GiB · PyTorch memory limit"
    assert words([]) == "no GPU"
    assert describe(read_slice({}), {}, None, "")["text"] == "gpulab: not set up here"
