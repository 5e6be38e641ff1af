"""Streaming detokenization: the pieces a stream sends add up to what one decode of
all the tokens says, and a stop string cuts the text before it, even when it
spans tokens or arrives in pieces."""

import random

import pytest
from tiny_lm import tiny_tokenizer

from gpulab.serving.openai_routes import TextStream


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "GPU",
    "slice",
    "héllo",
    "wörld",
    "✓",
    "naïve",
    "数据",
    ",",
    ".",
    "!",
    "42",
]


def token_runs(tokenizer, n=200):
    """Token ids of made-up sentences, accents, CJK and symbols among them."""
    rng = random.Random(0)
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(1, 12))]
        yield tokenizer("".join(w + rng.choice(["", " ", "  "]) for w in words)).input_ids


def stream(tokenizer, ids, stop):
    text = TextStream(tokenizer, stop)
    out = ""
    for t in ids:
        out += text.push(t)
        if text.stopped:
            break
    return out + text.flush(), text.stopped


def test_the_pieces_add_up_to_the_whole_decode(tokenizer):
    for ids in token_runs(tokenizer):
        whole = tokenizer.decode(ids, skip_special_tokens=True)
        out, _ = stream(tokenizer, ids, [])
        assert out == whole


def test_a_stop_string_cuts_the_text_before_it(tokenizer):
    checked = 0
    for ids in token_runs(tokenizer):
        whole = tokenizer.decode(ids, skip_special_tokens=True)
        if len(whole) < 8:
            continue
        stop = whole[4:7]  # three characters, often across tokens
        out, stopped = stream(tokenizer, ids, [stop, "never-in-the-text"])
        assert stopped and out == whole[: whole.index(stop)]
        checked += 1
    assert checked > 50


def test_characters_split_across_tokens_come_out_whole(tokenizer):
    ids = tokenizer("héllo wörld ✓").input_ids
    text = TextStream(tokenizer, [])
    pieces = [text.push(t) for t in ids] + [text.flush()]
    assert "".join(pieces) == "héllo wörld ✓"
    assert not any("\ufffd" in p for p in pieces)
