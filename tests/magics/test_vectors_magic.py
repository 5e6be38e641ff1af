"""``%vectors``'s words: how a line is read, and what a search and a listing show."""

from gpulab.client.collections import Hit
from gpulab.magics.vectors import _options, hits_bundle, listing


def test_a_line_is_words_and_flag_values():
    assert _options(["search", "docs", "open a tar file", "-k", "3"]) == (
        ["search", "docs", "open a tar file"],
        {"k": "3"},
    )
    assert _options(["share", "docs", "--users", "bob,carol"]) == (
        ["share", "docs"],
        {"users": "bob,carol"},
    )


def test_hits_are_ranked_lines_and_a_table_with_the_metadata_escaped():
    hits = [Hit("tarfile", 0.652, {"module": "tarfile"}), Hit("<b>x</b>", 0.5, {"k": "<i>"})]
    out = hits_bundle("alice/stdlib", "open a tar file", hits)
    assert out["text/plain"].splitlines() == [
        "alice/stdlib: 2 hits for 'open a tar file'",
        "  1. tarfile  0.652  module=tarfile",
        "  2. <b>x</b>  0.500  k=<i>",
    ]
    assert "&lt;b&gt;x&lt;/b&gt;" in out["text/html"] and "<i>" not in out["text/html"]


def test_a_listing_says_size_metric_endpoint_and_sharing():
    views = [
        {
            "collection": "alice/docs",
            "dim": 384,
            "metric": "cosine",
            "embed": "alice/minilm",
            "share_users": ["bob"],
            "share_groups": ["lab"],
        }
    ]
    assert listing(views)["text/plain"] == (
        "alice/docs: 384-d, cosine, texts through alice/minilm; shared with bob, group lab"
    )
    assert "none yet" in listing([])["text/plain"]
