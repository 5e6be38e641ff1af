import pytest

from gpulab.backend.local_inventory import load_inventory
from gpulab.scheduler.inventory import InventoryError, parse_simulated
from gpulab.scheduler.slices import SliceError, label, parse_gpu_milli, shape_of


def test_parse_simulated_spec():
    gpus = parse_simulated("1xH200-141GB,4xT4-16GB", node="n")
    assert [g.model for g in gpus] == ["H200-141GB"] + ["T4-16GB"] * 4
    assert gpus[0].memory_mib == 141 * 1024 and all(g.simulated for g in gpus)
    assert [g.index for g in gpus] == [0, 1, 2, 3, 4]
    assert len({g.uuid for g in gpus}) == 5
    # Stable across restarts: the ledger keeps pointing at the same GPUs.
    assert parse_simulated("1xH200-141GB,4xT4-16GB", node="n") == gpus


@pytest.mark.parametrize("bad", ["", "2A100", "0xA100-80GB", "twoxA100"])
def test_bad_spec_says_how_to_write_it(bad):
    with pytest.raises(InventoryError, match="COUNTxMODEL-MEMGB"):
        parse_simulated(bad)


def test_no_driver_path_on_this_machine():
    gpus, reason = load_inventory(None)
    if gpus:
        pytest.skip("this machine has an NVIDIA driver; the no-driver path cannot be shown")
    assert "driver" in reason or "nvidia-ml-py" in reason


def test_slices():
    assert parse_gpu_milli(250) == 250 and parse_gpu_milli("500") == 500
    assert shape_of(2000).num_gpus == 2 and shape_of(250).milli_per_gpu == 250
    assert label(250) == "1/4 GPU" and label(100) == "1/10 GPU" and label(2000) == "2 GPUs"
    for bad in [-1, 1500, "x", None, True, 2.5]:
        with pytest.raises(SliceError):
            parse_gpu_milli(bad)
    with pytest.raises(SliceError, match="choose one of"):
        parse_gpu_milli(300, allowed=(0, 250, 500))
