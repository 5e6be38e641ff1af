"""torch.export round trip: one program answers every batch size, the card describes it."""

import json
import os

import pytest
import torch

from gpulab.serving.export import CARD_FILE, ExportError, export_model, load_model


class TwoHeads(torch.nn.Module):
    """Two inputs (one integer), a tuple of outputs."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 8)
        self.proj = torch.nn.Linear(8, 3)

    def forward(self, features, token):
        h = features + self.embed(token)
        return self.proj(h), h.sum(dim=1, keepdim=True)


@pytest.mark.parametrize("example_rows", [1, 4])
def test_round_trip_any_batch_size(tmp_path, tiny_model, example_rows):
    card = export_model(tiny_model, torch.randn(example_rows, 16), str(tmp_path), name="tiny")
    assert card.inputs[0].name == "input" and card.inputs[0].shape == [-1, 16]
    assert card.outputs[0].name == "output" and card.outputs[0].shape == [-1, 4]
    with open(os.path.join(tmp_path, CARD_FILE)) as f:
        on_disk = json.load(f)
    assert on_disk["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 16]}]

    served = load_model(str(tmp_path))
    for rows in (1, 2, 7, 33):
        x = torch.randn(rows, 16)
        (got,) = served(x)
        assert got.shape == (rows, 4)
        torch.testing.assert_close(got, tiny_model(x).detach())


def test_several_inputs_and_outputs(tmp_path):
    torch.manual_seed(0)
    model = TwoHeads().eval()
    example = (torch.randn(3, 8), torch.randint(0, 10, (3,)))
    card = export_model(
        model, example, str(tmp_path), name="heads", output_names=["logits", "total"]
    )
    assert [(s.name, s.datatype, s.shape) for s in card.inputs] == [
        ("features", "FP32", [-1, 8]),
        ("token", "INT64", [-1]),
    ]
    assert [(s.name, s.shape) for s in card.outputs] == [("logits", [-1, 3]), ("total", [-1, 1])]
    served = load_model(str(tmp_path))
    x = (torch.randn(5, 8), torch.randint(0, 10, (5,)))
    want = model(*x)
    for got, ref in zip(served(*x), want, strict=False):
        torch.testing.assert_close(got, ref.detach())


def test_outputs_without_batch_dimension_are_refused(tmp_path):
    class Pooled(torch.nn.Module):
        def forward(self, x):
            return x.sum(dim=0)

    with pytest.raises(ExportError, match="batch dimension first"):
        export_model(Pooled(), torch.randn(3, 4), str(tmp_path))


def test_missing_directory_says_how_to_make_one(tmp_path):
    with pytest.raises(FileNotFoundError, match="export_model"):
        load_model(str(tmp_path / "nothing"))
