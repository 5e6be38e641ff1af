"""``%quantize`` of language models: GPT-2's ``Conv1D`` layers are quantized (as the
``nn.Linear`` they compute), a tied ``lm_head`` stays in float, the report counts
what it quantized, warns when that is little, and adds held-out perplexity.

A small GPT-2 built in code (no weights can be downloaded here)."""

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell
from transformers import GPT2Config, GPT2LMHeadModel

from gpulab.serving.linear_like import convert_conv1d
from gpulab.serving.quantize import QuantizeError, quantize

VOCAB = 256
LAYERS = 2


def gpt2():
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=64,
        n_embd=128,
        n_layer=LAYERS,
        n_head=4,
        bos_token_id=0,
        eos_token_id=0,
    )
    return GPT2LMHeadModel(config).eval()


def ids(batch, length, seed):
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_conv1d_becomes_the_linear_it_computes():
    model = gpt2()
    x = torch.randn(3, 128)
    before = model.transformer.h[0].mlp.c_fc(x)
    names = convert_conv1d(model)
    assert len(names) == 4 * LAYERS and "transformer.h.0.attn.c_attn" in names
    layer = model.transformer.h[0].mlp.c_fc
    assert isinstance(layer, torch.nn.Linear) and layer.weight.shape == (512, 128)
    torch.testing.assert_close(layer(x), before)


@pytest.mark.parametrize("scheme", ["int8-dynamic", "int8-weight"])
def test_gpt2_is_quantized_smaller_with_perplexity_beside_size_and_speed(scheme):
    model = gpt2()
    report = quantize(model, scheme, example=ids(1, 32, 1), runs=3, heldout=ids(2, 48, 2))
    # Before: only lm_head (tied to the embedding) was quantized: 1.10x larger.
    assert report.size_after < report.size_before / 2, report.table()
    assert report.layers_converted == 4 * LAYERS
    assert report.layers_quantized == 4 * LAYERS  # lm_head stays in float (tied)
    assert report.params_share > 0.8 and report.warnings == []
    assert 1 < report.perplexity_before < 2 * VOCAB
    assert abs(report.perplexity_after / report.perplexity_before - 1) < 0.05
    assert report.heldout_tokens == 96
    table = report.table()
    assert "perplexity (96 held-out tokens)" in table and "x smaller" in table
    assert "quantized: 8 linear layers, 8 of them Conv1D" in table
    assert any(
        "lm_head kept in float: its weight is tied to transformer.wte.weight" in n
        for n in report.notes
    )
    # The copy still generates; the original is untouched (its Conv1D layers stay).
    assert type(model.transformer.h[0].attn.c_attn).__name__ == "Conv1D"
    assert report.model(ids(1, 8, 3)).logits.shape == (1, 8, VOCAB)


class Mostly(torch.nn.Module):
    """A matrix layer no quantizer takes holds most of the parameters."""

    class Bilinearish(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(256, 256) / 16)

        def forward(self, x):
            return x @ self.weight

    def __init__(self):
        super().__init__()
        self.big = self.Bilinearish()
        self.head = torch.nn.Linear(256, 8)

    def forward(self, x):
        return self.head(self.big(x))


def test_little_quantized_is_a_warning_and_the_layer_left_is_named():
    report = quantize(Mostly().eval(), "int8-dynamic", example=torch.randn(4, 256), runs=3)
    assert report.layers_quantized == 1 and report.params_share < 0.1
    table = report.table()
    assert "warning: only 3% of the parameters were quantized (1 linear layers)" in table, table
    assert "not quantized (no quantizer takes Bilinearish): big" in table


def test_a_model_with_only_a_tied_head_is_refused_by_name():
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(64, 16)
            self.head = torch.nn.Linear(16, 64, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, x):
            return self.head(self.emb(x))

    with pytest.raises(QuantizeError, match=r"nothing to quantize.*head is tied to emb\.weight"):
        quantize(Tied().eval(), "int8-dynamic", example=torch.tensor([[1, 2, 3]]), runs=1)


def test_the_magic_shows_perplexity_for_a_language_model(capsys):
    ip = InteractiveShell.instance()
    try:
        ip.run_line_magic("load_ext", "gpulab.magics")
        ip.user_ns.update(lm=gpt2(), x=ids(1, 16, 4), val=ids(1, 64, 5))
        result = ip.run_cell(
            "%quantize lm --scheme int8-dynamic --example x --heldout val --to q --runs 2"
        )
        out = capsys.readouterr().out
        assert result.success, out
        assert "perplexity (64 held-out tokens)" in out and "of them Conv1D" in out, out
        result = ip.run_cell(
            "%quantize lm --scheme int8-dynamic --example x --heldout x.float() --to q"
        )
        assert not result.success
        assert "held-out text must be token ids" in capsys.readouterr().err
    finally:
        InteractiveShell.clear_instance()
