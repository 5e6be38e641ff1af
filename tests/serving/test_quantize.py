"""Every scheme on CPU: what it saves, what it costs, that its model is served, and a clear
refusal where it cannot run."""

import numpy as np
import pytest
import torch
import tritonclient.http as triton

from gpulab.serving.export import ExportError, export_model, load_model
from gpulab.serving.quantize import SCHEMES, QuantizeError, quantize

# Relative output error each scheme may reach on the tiny model (int4 is the coarsest).
ERROR_BOUND = {"int8-dynamic": 0.05, "int8-weight": 0.05, "int4-weight": 0.3, "fp8-weight": 0.1}
# quantize_dynamic warns on every call made outside gpulab.serving.quantize (which hides it).
TORCH_AO_DEPRECATED = "ignore:torch.ao.quantization is deprecated:DeprecationWarning"


def model_and_example():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 32)
    ).eval()
    return model, torch.randn(8, 64)


@pytest.mark.parametrize(
    "scheme,engine,expected_engine",
    [
        ("int8-dynamic", "auto", "torch-ao"),
        ("int8-dynamic", "torchao", "torchao"),
        ("int8-weight", "auto", "torchao"),
        ("int4-weight", "auto", "torchao"),
        ("fp8-weight", "auto", "torchao"),
    ],
)
def test_scheme_runs_on_cpu(scheme, engine, expected_engine):
    model, x = model_and_example()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = quantize(model, scheme, engine=engine, example=x, runs=3)

    assert report.engine == expected_engine and report.scheme == scheme
    assert report.size_after < report.size_before  # int8/int4/fp8 weights replace fp32 ones
    assert report.relative_error < ERROR_BOUND[scheme]
    assert report.max_abs_error > 0  # it really changed the arithmetic
    assert report.latency_before_s > 0 and report.latency_after_s > 0
    assert report.model is not model
    for k, v in model.state_dict().items():  # the original is left alone
        torch.testing.assert_close(v, before[k])
    table = report.table()
    assert scheme in table and expected_engine in table and "MiB" in table and "ms" in table
    assert "x smaller" in table
    if scheme == "fp8-weight":
        # Runs on CPU, but as storage only: fp8 weights are widened for each matmul.
        assert any("not faster" in n for n in report.notes)


def test_fp8_dynamic_on_cpu_says_it_needs_a_recent_gpu():
    model, x = model_and_example()
    with pytest.raises(QuantizeError, match=r"compute capability >= 8\.9.*on cpu"):
        quantize(model, "fp8-dynamic", example=x)


@pytest.mark.parametrize(
    "scheme,engine,message",
    [
        ("int8-weight", "torch-ao", "only does int8-dynamic"),
        ("int2-magic", "auto", "unknown scheme"),
        ("int8-dynamic", "tensorrt", "unknown engine"),
    ],
)
def test_impossible_combinations_are_refused(scheme, engine, message):
    model, x = model_and_example()
    with pytest.raises(QuantizeError, match=message):
        quantize(model, scheme, engine=engine, example=x)


def test_a_model_without_linear_layers_is_refused():
    with pytest.raises(QuantizeError, match="no torch.nn.Linear"):
        quantize(torch.nn.ReLU(), "int8-dynamic", example=torch.randn(2, 3))


def test_torchao_quantized_model_exports_and_serves(tmp_path):
    model, x = model_and_example()
    report = quantize(model, "int8-weight", example=x, runs=1)
    card = export_model(report.model, x, str(tmp_path), name="q")
    assert card.requires == ["torchao"]
    (got,) = load_model(str(tmp_path))(x[:3])
    torch.testing.assert_close(got, report.model(x[:3]))


@pytest.mark.filterwarnings(TORCH_AO_DEPRECATED)
@pytest.mark.parametrize("scheme", ["per-tensor", "per-channel"])
def test_torch_ao_quantized_model_exports_and_answers_as_in_the_notebook(tmp_path, scheme):
    model, x = model_and_example()
    if scheme == "per-tensor":  # what %quantize's int8-dynamic makes on CPU
        report = quantize(model, "int8-dynamic", engine="torch-ao", example=x, runs=1)
        qmodel = report.model
    else:
        qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
        qmodel = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear: qconfig})
    card = export_model(qmodel, x, str(tmp_path), name="q")
    assert card.requires == []  # the op is gpulab's own, registered by the model server

    served = load_model(str(tmp_path))
    for rows in (1, 3, 8):  # the same fbgemm kernel on the same int8 weights: the same answer
        (got,) = served(x[:rows])
        torch.testing.assert_close(got, qmodel(x[:rows]), rtol=0, atol=0)
    assert isinstance(qmodel[0], torch.ao.nn.quantized.dynamic.Linear)  # left as it was


@pytest.mark.filterwarnings(TORCH_AO_DEPRECATED)
def test_torch_ao_layers_that_cannot_be_served_say_what_to_use(tmp_path):
    model, x = model_and_example()
    fp16 = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.float16)
    with pytest.raises(ExportError, match="float16 weights.*--engine torchao"):
        export_model(fp16, x, str(tmp_path))


def test_int8_dynamic_model_is_served_and_answers_like_the_float_model(tmp_path, start_server):
    """What %quantize then %deploy do: quantize on CPU (engine auto: torch-ao), export
    with a dynamic batch, serve it in a model server process as a replica does, call it."""
    model, x = model_and_example()
    report = quantize(model, "int8-dynamic", example=x, runs=1)
    assert report.engine == "torch-ao"
    export_model(report.model, x, str(tmp_path), name="qmlp", max_batch_size=32)
    server = start_server(str(tmp_path), "--max-batch-size", "32", "--max-latency-ms", "0")

    rows = np.random.default_rng(0).standard_normal((5, 64), dtype=np.float32)
    client = triton.InferenceServerClient(server.url, connection_timeout=60, network_timeout=60)
    inp = triton.InferInput("input", list(rows.shape), "FP32")
    inp.set_data_from_numpy(rows)
    got = client.infer("qmlp", [inp]).as_numpy("output")

    with torch.no_grad():
        want = model(torch.from_numpy(rows)).numpy()
        in_notebook = report.model(torch.from_numpy(rows)).numpy()
    assert got.shape == (5, 32)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < ERROR_BOUND["int8-dynamic"]
    np.testing.assert_allclose(got, in_notebook, rtol=1e-6, atol=1e-6)


def test_magic_and_library_agree_on_the_names():
    from gpulab.magics import quantize as magic

    assert magic.SCHEMES == SCHEMES
