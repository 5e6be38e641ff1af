"""A small Llama and its tokenizer, made here (no weights can be downloaded).

The tokenizer is a byte-level BPE trained in a few milliseconds on a fixed text,
with a chat template, so ``apply_chat_template`` and streaming decode work as for
a real model. The weights are random (seeded): the model says nothing sensible,
but it generates, and the same seed gives the same text.

    model, tokenizer = tiny_llama()                      # ~0.1M parameters, tests
    model, tokenizer = tiny_llama(**BENCH_33M)           # the issue's 33.5M model
"""

from __future__ import annotations

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A GPU slice serves a language model to every notebook user.",
    "Hello! How are you today? I am fine, thank you.",
    "user assistant system: tell me a story about shared compute.",
    "0123456789 +-*/=()[]{}<>.,;:!?'\"",
]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL = ["<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]
#: A 33.4M-parameter Llama, the size the issue's figures were measured with (the
#: shape of benchmarks/llm_engines.py's: 11 layers of width 384, a 16k vocabulary).
BENCH_33M = {
    "hidden_size": 384,
    "num_hidden_layers": 11,
    "intermediate_size": 1152,
    "vocab_size": 16000,
    "num_attention_heads": 6,
    "max_position_embeddings": 512,
}


def _words(n: int = 40000) -> list[str]:
    """Made-up words (seeded), so that the BPE learns up to ``vocab_size`` tokens."""
    import random

    rng = random.Random(0)
    letters = "etaoinshrdlucmfwypvbgkqjxz"
    return [
        " ".join(
            "".join(rng.choice(letters[: rng.randint(6, 26)]) for _ in range(rng.randint(2, 9)))
            for _ in range(12)
        )
        for _ in range(n // 12)
    ]


def tiny_tokenizer(vocab_size: int = 512):
    """A ``PreTrainedTokenizerFast`` with a chat template, trained on :data:`CORPUS`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS + _words(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        chat_template=CHAT_TEMPLATE,
    )


def tiny_llama(
    hidden_size: int = 32,
    num_hidden_layers: int = 2,
    intermediate_size: int = 64,
    vocab_size: int = 512,
    num_attention_heads: int = 4,
    max_position_embeddings: int = 256,
    seed: int = 0,
):
    """``(LlamaForCausalLM, tokenizer)``: random weights from ``seed``, eval mode."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = tiny_tokenizer(vocab_size)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=num_hidden_layers,
        intermediate_size=intermediate_size,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_attention_heads,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    return model, tokenizer


def trained_lora(text: str = "SELECT name FROM users;", steps: int = 10, seed: int = 0):
    """A PEFT LoRA adapter (q/v projections) on :func:`tiny_llama`'s model of ``seed``,
    trained a few steps to say ``text`` after a chat turn, so that its greedy answer
    differs from the base model's. Returns the ``PeftModel`` (eval mode); the base it
    wraps is changed in place, so make the model to serve with another ``tiny_llama()``."""
    import torch
    from peft import LoraConfig, get_peft_model

    base, tokenizer = tiny_llama(seed=seed)
    model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hello! How are you today?"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    ids = torch.tensor([tokenizer(prompt + text + "</s>")["input_ids"]])
    model.train()
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=3e-2)
    for _ in range(steps):
        optimizer.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
    return model.eval()
