"""What a client may send to a collection, checked before the engine sees it."""

from __future__ import annotations

import pytest

from gpulab.service.vectors import checks
from gpulab.service.vectors.checks import CollectionLimits, Refused

LIMITS = CollectionLimits(max_rows=10, max_dim=8, max_per_user=1)


@pytest.mark.parametrize("value", [1e300, -3.5e38, 10**39])
def test_a_value_past_float32s_range_is_a_400_naming_the_row(value):
    """The engines keep float32: 1e300 passed the check (finite as a float64) and was
    stored as inf, turning the row's scores into inf or NaN."""
    with pytest.raises(Refused) as refused:
        checks.vectors([[0.5, 1.0], [1.0, value]], 2, LIMITS)
    assert refused.value.status == 400
    assert str(refused.value) == (
        f"vectors[1] holds {float(value):g}, outside float32's range (±3.403e+38), "
        "in which vectors are kept: scale the vector down"
    )


def test_values_within_float32s_range_are_taken():
    assert checks.vectors([[3.4e38, -3.4e38], [1e-300, 0]], 2, LIMITS).shape == (2, 2)


@pytest.mark.parametrize("value", ["docs\n", "docs\r\n", "Docs", "-docs", ""])
def test_a_collection_name_with_a_line_break_or_other_characters_is_a_400(value):
    with pytest.raises(Refused, match="use 1-63 of a-z"):
        checks.name(value)
    assert checks.name("docs-2.v1") == "docs-2.v1"


def test_a_rows_metadata_holds_at_most_256_keys_and_items():
    """64 KiB of small keys ({"k1": 0, ...}: 6,900 of them) took 15 times its JSON in
    the engine's memory; keys and list items, nested ones too, are counted."""
    assert checks.metadata([{f"k{i}": i for i in range(256)}], 1)
    assert checks.metadata([{"tags": list(range(200)), "a": {"b": [1] * 53}}], 1)
    for many in (
        {f"k{i}": i for i in range(257)},
        {"tags": list(range(256))},
        {"a": {"b": [[] for _ in range(300)]}},
    ):
        with pytest.raises(Refused) as refused:
            checks.metadata([{}, many], 2)
        assert refused.value.status == 413
        assert str(refused.value).startswith("metadata[1] holds more than 256 keys and list items")


def test_a_lone_surrogate_deep_in_a_body_is_a_400_not_a_recursion_error():
    body = inner = []
    for _ in range(100_000):
        inner.append([])
        inner = inner[0]
    inner.append("\ud800")
    with pytest.raises(Refused) as refused:
        checks.unicode_text({"metadata": body}, b"\\ud800")
    assert refused.value.status == 400
    assert str(refused.value).startswith("body...[0][0]")
    assert len(str(refused.value)) < 300
    with pytest.raises(Refused, match=r"^metadata\[1\]\['k'\] holds a lone UTF-16 surrogate"):
        checks.unicode_text({"metadata": [{}, {"k": "ok\udc00"}]}, b"\\udc00")
    with pytest.raises(Refused, match=r"^body: a key holds"):
        checks.unicode_text({"\ud800": 1}, b"\\ud800")
