"""The collection filter grammar (gpulab.service.vectors.filters) on its own: what it
takes is written out again canonically for Milvus, what it refuses is refused with one
line that names the problem and the fix, and the bounds hold before any engine runs
(a pattern that backtracks, nesting past the engine parser's stack, lone surrogates)."""

from __future__ import annotations

import pytest

from gpulab.service.vectors import filters
from gpulab.service.vectors.checks import Refused, filter_expression


def milvus(text: str) -> str:
    return filters.to_milvus(filters.parse(text))


@pytest.mark.parametrize(
    "given, written",
    [
        # The docs' and tests' filters, as they are written today.
        ('metadata["lang"] == "de"', 'metadata["lang"] == "de"'),
        ('metadata["year"] >= 2020', 'metadata["year"] >= 2020'),
        ("metadata['year'] > 2020", 'metadata["year"] > 2020'),
        # A literal on the left is turned around; numbers, booleans, nested paths.
        ('2020 <= metadata["year"]', 'metadata["year"] >= 2020'),
        ('metadata["a"]["b"][0] != -2.5', 'metadata["a"]["b"][0] != -2.5'),
        ('metadata["ok"] == True', 'metadata["ok"] == true'),
        # and/or/not in both spellings, flattened and parenthesised by precedence.
        (
            'metadata["a"] == 1 && (metadata["b"] == 2 || !(metadata["c"] == 3))',
            'metadata["a"] == 1 and (metadata["b"] == 2 or not (metadata["c"] == 3))',
        ),
        (
            'metadata["a"] == 1 OR metadata["b"] == 2 AND NOT metadata["c"] == 3',
            'metadata["a"] == 1 or (metadata["b"] == 2 and not (metadata["c"] == 3))',
        ),
        ("(((metadata['a'] == 1)))", 'metadata["a"] == 1'),
        # in on a JSON path: the engine takes in on plain fields only.
        (
            'metadata["lang"] in ["de", "fr"]',
            '(metadata["lang"] == "de" or metadata["lang"] == "fr")',
        ),
        ('metadata["lang"] not in ["de"]', 'not (metadata["lang"] == "de")'),
        ('id in ["doc-1", "doc-2"]', 'id in ["doc-1", "doc-2"]'),
        ('id not in ["doc-1"]', 'id not in ["doc-1"]'),
        # like with bounded patterns; %% is one %.
        ('metadata["t"] like "intro%"', 'metadata["t"] like "intro%"'),
        ('metadata["t"] like "%intro%%"', 'metadata["t"] like "%intro%"'),
        ('metadata["t"] like "a%b"', 'metadata["t"] like "a%b"'),
        ('metadata["t"] not like "%x"', 'not (metadata["t"] like "%x")'),
        (
            'json_contains(metadata["tags"], "x") and json_contains_any(metadata["tags"], [1, 2])',
            'json_contains(metadata["tags"], "x") and json_contains_any(metadata["tags"], [1, 2])',
        ),
        # Strings: escapes read, and written back in the engine's own escapes.
        (
            r'metadata["s"] == "a\"b\\c\n\u00e9\ud83d\ude00"',
            'metadata["s"] == "a\\"b\\\\c\\né😀"',
        ),
        ("metadata['s'] == 'it\\'s'", 'metadata["s"] == "it\'s"'),
    ],
)
def test_a_filter_is_written_out_canonically(given, written):
    assert milvus(given) == written
    # What we write is in the grammar too, and writing it again changes nothing more.
    again = milvus(written)
    assert milvus(again) == again


@pytest.mark.parametrize(
    "given, words",
    [
        # The pathological pattern: 39.9 s of backtracking in the engine per search.
        ('metadata["s"] like "%a%a%a%a%a%a%a%a%b"', "has 9 % before its end; at most 1"),
        ('metadata["s"] like "%a%b"', "has 2 % before its end"),
        ('metadata["s"] like "' + "x" * 300 + '%"', "at most 256"),
        ('metadata["s"] like "50\\\\%"', "backslash"),
        ("(" * 1500 + 'metadata["a"] == 1' + ")" * 1500, "nested more than 32 levels"),
        ("not " * 1000 + 'metadata["a"] == 1', "nested more than 32 levels"),
        ("! " * 40 + 'metadata["a"] == 1', "flatten it"),
        ('metadata["s"] == "\ud800"', "lone UTF-16 surrogate (\\ud800) at character 18"),
        (r'metadata["s"] == "\ud800"', "lone UTF-16 surrogate (\\ud800)"),
        (r'metadata["s"] == "\udc00\ud800"', "lone UTF-16 surrogate (\\udc00)"),
        ('metadata["a"] == 1 and ' * 70 + 'metadata["a"] == 1', "more than 64 conditions"),
        ("id in [" + ", ".join(["1"] * 1001) + "]", "more than 1000 values"),
        ('metadata["a"] == "' + "x" * 5000 + '"', "more than 4096"),
        ('lang == "en"', "unknown field 'lang' at character 0; rows have id and metadata"),
        ("metadata == 1", "needs a key"),
        ('metadata["a"] = 1', "a single '=' at character 14; compare with =="),
        ('metadata["a"] < 1 < 2', "a second comparison"),
        ("1 == 2", "two values compared"),
        ('metadata["a"] == metadata["b"]', "two fields compared"),
        ('metadata["a"] in []', "in [] matches nothing"),
        ('metadata["a"] > true', "compare them with == or !="),
        ('metadata["a"] == 99999999999999999999', "out of range"),
        ('metadata["a"] == 1e999', "out of range"),
        ('metadata["a"] == "open', "has no closing"),
        ('metadata["a"] == "\\x41"', "unknown escape \\x"),
        ('metadata["a"] == 1 )', "expected and, or or the end"),
        ('metadata["a"] + 1 == 2', "unexpected '+'"),
        ('text_match(metadata, "x")', "unknown field 'text_match'"),
        ("   ", "it is empty"),
        ('metadata["a"] == "\x00"', "NUL"),
    ],
)
def test_a_filter_outside_the_grammar_is_refused_with_one_line(given, words):
    with pytest.raises(filters.FilterError) as refused:
        filters.parse(given)
    message = str(refused.value)
    assert words in message, message
    assert message.startswith("filter: ") and "\n" not in message and len(message) < 300


def test_the_dict_form_is_the_same_tree():
    assert filters.to_milvus(filters.from_pairs({"lang": "de", "n": 3, "ok": False})) == (
        'metadata["lang"] == "de" and metadata["n"] == 3 and metadata["ok"] == false'
    )
    # Values that would break out of the expression are only ever literals.
    assert filters.to_milvus(filters.from_pairs({"k": '" or id != "'})) == (
        'metadata["k"] == "\\" or id != \\""'
    )
    for bad, words in (({"k": [1]}, "string, number or bool"), ({"k": "\udfff"}, "surrogate")):
        with pytest.raises(filters.FilterError, match=words):
            filters.from_pairs(bad)


def test_the_service_check_refuses_with_a_400_and_never_passes_text_through():
    assert filter_expression(None) == "" and filter_expression("") == ""
    # The text sent is not what the engine gets: it is parsed and written again.
    assert filter_expression("metadata['lang']=='de'") == 'metadata["lang"] == "de"'
    assert filter_expression({"lang": "de"}) == 'metadata["lang"] == "de"'
    for bad in ('metadata["s"] like "%a%a%b"', "(" * 1500, ["x"], {"bad key": 1}):
        with pytest.raises(Refused) as refused:
            filter_expression(bad)
        assert refused.value.status == 400


#: Filters as people write them, and at the grammar's limits: each as long, as deep and
#: with as many conditions and values as the checks take.
AT_THE_LIMITS = [
    'metadata["doc"] in [' + ", ".join(f'"d{i}"' for i in range(100)) + "]",
    'metadata["n"] not in [' + ",".join(str(i) for i in range(1000)) + "]",
    " && ".join(f'metadata["k{i}"] in [1, 2]' for i in range(64)),
    "!" * 31 + 'metadata["k"] not in [1, 2, 3]',
    "!(" * 16 + 'metadata["a"] == 1 or metadata["b"] in [1e15, 2e15]' + ")" * 16,
    'metadata["a"] == 1 OR metadata["b"] == 2 AND NOT metadata["c"] not like "%x"',
    'id not in ["a"] && json_contains_all(metadata["t"], [1e22, -0.0, 123e5, true])',
    'metadata["s"] in ["it\'s", \'say "hi"\', "tab\there", "\\u00e9", \'\\\\\']',
    "metadata['x'][0]==1&&metadata['y']in[1e-5,0.000123]||id in['q']",
    'metadata["t"] like "%intro%%" and 2020 <= metadata["year"]',
]


@pytest.mark.parametrize("given", AT_THE_LIMITS)
def test_the_embedded_engines_text_passes_the_checks_its_filter_passed(given):
    """The embedded engine parses what the service writes with the same limits: in on a
    metadata path written as ==s or'd counted a condition per value (65 values: "more
    than 64 conditions at character 1463", where the user wrote none), and not (...)
    doubled the nesting. Its text keeps in, and is never longer, deeper or of more
    conditions than the filter sent: it reads back as the same filter."""
    tree = filters.parse(given)
    written = filters.to_text(tree)
    assert filters.parse(written) == tree
    assert len(written) <= len(given)


def test_the_embedded_engines_text_of_any_filter_reads_back_within_the_checks():
    """Random filters, as tersely or as wordily as the grammar allows (symbols or
    keywords, spaces or none, redundant parentheses, numbers in short and long forms)."""
    import random

    rng = random.Random(7)
    numbers = ["1e5", "100000.0", "123e5", "12.3e9", "0.5", "5e-1", "1e+16", "00012", "7"]

    def gap() -> str:  # a space where the grammar needs none
        return rng.choice(["", " "])

    def literal() -> str:
        kind = rng.randrange(4)
        if kind == 0:
            return rng.choice(numbers)
        if kind == 1:
            return rng.choice(["true", "False", "-3", "-2.5e-7"])
        text = "".join(rng.choice("ab'\"\\\t é") for _ in range(rng.randrange(6)))
        quote = rng.choice("'\"")
        return quote + text.replace("\\", "\\\\").replace(quote, "\\" + quote) + quote

    def field() -> str:
        if rng.random() < 0.2:
            return "id "  # a keyword after it needs the space
        keys = ['"k"', "'k'", "0"]
        return "metadata" + "".join("[" + rng.choice(keys) + "]" for _ in range(2)) + gap()

    def listing() -> str:
        return "[" + ("," + gap()).join(literal() for _ in range(rng.randrange(1, 5))) + "]"

    def condition() -> str:
        kind = rng.randrange(4)
        if kind == 0:
            return f"{field()}{rng.choice(['==', '!=', '<', '>='])}{gap()}{literal()}"
        if kind == 1:
            return f"{field()}{rng.choice(['in', 'not in'])}{gap()}{listing()}"
        if kind == 2:
            return f'{field()}{rng.choice(["like", "not like"])}{gap()}"%a_b%"'
        return f"json_contains_any({field()},{gap()}{listing()})"

    def expr(depth: int) -> str:
        if depth <= 0 or rng.random() < 0.3:
            return condition()
        kind = rng.randrange(4)
        if kind == 0:
            return rng.choice(["not ", "!", "! "]) + expr(depth - 1)
        if kind == 1:
            return f"({gap()}{expr(depth - 1)}{gap()})"
        word = rng.choice([" and ", " AND ", "&&", " && ", " or ", "||", " || "])
        return word.join(expr(depth - 1) for _ in range(rng.randrange(2, 4)))

    tried = 0
    while tried < 500:
        given = expr(rng.randrange(8))
        try:
            tree = filters.parse(given)
        except filters.FilterError:
            continue  # past a limit already: refused before any engine
        tried += 1
        written = filters.to_text(tree)
        assert filters.parse(written) == tree, (given, written)
        assert len(written) <= len(given), (given, written)


def test_a_dict_filter_too_long_to_write_out_is_refused_here():
    with pytest.raises(
        filters.FilterError, match="come to 5017 characters written out, more than 4096"
    ):
        filters.from_pairs({"k": "x" * 5000})
