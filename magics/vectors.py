"""``%vectors``: the common verbs of vector collections, one line each.

    %vectors list
    %vectors create docs --dim 384            (or --embed minilm, an embedding endpoint)
    %vectors search docs "open a compressed tar file" -k 3
    %vectors count docs
    %vectors share docs --users bob --groups lab
    %vectors drop docs

A name is yours, or ``owner/name`` for one shared with you. Inserting rows belongs in
Python (``Collection("docs").insert(texts=..., metadata=...)``): data is not a line.
"""

from __future__ import annotations

import re
import shlex
from html import escape

from IPython.core.magic import Magics, line_magic, magics_class

from gpulab.client.units import plural

from .rich import CELL, Row, rows_bundle, show_listing

USAGE = (
    "usage: %vectors list | create NAME (--dim N | --embed ENDPOINT) [--metric cosine|l2|ip]"
    " | search NAME TEXT [-k K] | count NAME | share NAME [--users A,B] [--groups G] | drop NAME"
)


#: The flags each verb takes (``-k`` is written with one dash).
FLAGS = {
    "list": (),
    "create": ("dim", "embed", "metric"),
    "search": ("k",),
    "count": (),
    "share": ("users", "groups"),
    "drop": (),
}
#: What the client and the service say in Python's words, said in the magic's flags.
IN_FLAG_WORDS = (
    (
        re.compile(r"give dim= \(or embed=\) to make it"),
        "make it with %vectors create NAME --dim N (or --embed ENDPOINT)",
    ),
    (
        re.compile(r'send vectors, or make the collection with embed="owner/endpoint"'),
        "search it with vector= in Python, or make one with %vectors create NAME --embed ENDPOINT",
    ),
    (re.compile(r"(?<![-\w])k must be\b"), "-k must be"),
    (re.compile(r"(?<![-\w])k=(\d+)"), r"-k \1"),
    (
        re.compile(r"(?<![-\w])(dim|embed|metric)(?: must\b|=)"),
        lambda m: f"--{m.group(1)}" + (" must" if m.group(0).endswith("must") else " "),
    ),
    (re.compile(r"\b(leave|give) dim\b(?!=)"), r"\1 --dim"),
    (re.compile(r"(?<![-\w])dim is missing\b"), "--dim is missing"),
)


class UsageError(ValueError):
    """A line the magic cannot read: said with the usage."""


def _options(words: list[str]) -> tuple[list[str], dict[str, str]]:
    """Positional words and ``--flag value`` pairs (``-k`` too)."""
    args, opts, i = [], {}, 0
    while i < len(words):
        w = words[i]
        if w.startswith("-") and len(w) > 1 and not _number(w):
            if i + 1 >= len(words):
                raise UsageError(f"{w} needs a value")
            opts[w.lstrip("-")] = words[i + 1]
            i += 2
        else:
            args.append(w)
            i += 1
    return args, opts


def _number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def _flag(name: str) -> str:
    return f"-{name}" if len(name) == 1 else f"--{name}"


def _check_flags(verb: str, opts: dict[str, str]) -> None:
    known = FLAGS.get(verb, ())
    unknown = [_flag(o) for o in opts if o not in known]
    if unknown:
        takes = ", ".join(_flag(o) for o in known) if known else "no options"
        raise UsageError(f"unknown option {', '.join(unknown)}; {verb} takes {takes}")


def _whole(opts: dict[str, str], name: str, default: int | None = None) -> int | None:
    if name not in opts:
        return default
    try:
        return int(opts[name])
    except ValueError:
        raise UsageError(f"{_flag(name)} must be a whole number, not {opts[name]!r}") from None


def in_flag_words(message: str) -> str:
    """An error of the client or the service, in the magic's flags (``--dim``, not
    ``dim=``): the line is what a notebook user typed, not Python."""
    for pattern, replacement in IN_FLAG_WORDS:
        message = pattern.sub(replacement, message)
    return message


def hits_bundle(where: str, query: str, hits) -> dict[str, str]:
    """The hits as a table (rank, id, score, metadata) and as lines."""
    lines = [f"{where}: {plural(len(hits), 'hit')} for {query!r}"]
    rows = []
    for rank, h in enumerate(hits, 1):
        meta = ", ".join(f"{k}={v}" for k, v in h.metadata.items())
        text = _snippet(getattr(h, "text", None))
        lines.append(f"  {rank}. {h.id}  {h.score:.3f}  {meta}" + (f"  {text!r}" if text else ""))
        rows.append(
            f'<tr><td style="{CELL}">{rank}</td><td style="{CELL}"><b>{escape(h.id)}</b></td>'
            f'<td style="{CELL}">{h.score:.3f}</td><td style="{CELL}">{escape(meta)}</td>'
            f'<td style="{CELL}">{escape(text)}</td></tr>'
        )
    head = "".join(f'<th style="{CELL}">{t}</th>' for t in ("#", "id", "score", "metadata", "text"))
    html = (
        f"<div>{escape(lines[0])}</div>"
        f'<table class="gpulab-hits" style="border-collapse:collapse;font-size:12px">'
        f"<tr>{head}</tr>{''.join(rows)}</table>"
    )
    return {"text/plain": "\n".join(lines), "text/html": html}


def _snippet(text: str | None, most: int = 120) -> str:
    """The hit's text on one line, cut to ``most`` characters."""
    if not text:
        return ""
    line = " ".join(text.split())
    return line if len(line) <= most else line[: most - 1] + "\u2026"


def listing(views: list[dict]) -> dict[str, str]:
    if not views:
        return rows_bundle([Row.of("Collections", "none yet: %vectors create NAME --dim N")], "")
    rows = []
    for v in views:
        embed = f", texts through {v['embed']}" if v["embed"] else ""
        shared = v["share_users"] + [f"group {g}" for g in v["share_groups"]]
        with_ = f"; shared with {', '.join(shared)}" if shared else ""
        rows.append(Row.of(v["collection"], f"{v['dim']}-d, {v['metric']}{embed}{with_}"))
    return rows_bundle(rows, "gpulab-collections")


@magics_class
class VectorsMagics(Magics):
    @line_magic
    def vectors(self, line: str):
        """Vector collections: list, create, search, count, share, drop (``%vectors``)."""
        from gpulab.client import Client, Collection
        from gpulab.client.errors import GpuLabError

        try:
            words = shlex.split(line)
            args, opts = _options(words)
        except (ValueError, UsageError) as e:
            print(f"%vectors: {e}\n{USAGE}")
            return None
        if not args:
            print(USAGE)
            return None
        verb, rest = args[0], args[1:]
        if verb not in FLAGS:
            print(f"%vectors: unknown verb {verb!r}\n{USAGE}")
            return None
        try:
            _check_flags(verb, opts)
            dim = _whole(opts, "dim")
            k = _whole(opts, "k", 10)
        except UsageError as e:
            print(f"%vectors {verb}: {e}\n{USAGE}")
            return None
        try:
            if verb == "list":
                show_listing(listing(Client().collections()))
                return None
            if not rest:
                print(f"%vectors {verb}: name the collection\n{USAGE}")
                return None
            name = rest[0]
            if verb == "create":
                c = Collection(
                    name, dim=dim, embed=opts.get("embed"), metric=opts.get("metric", "cosine")
                )
                print(f"{c.owner}/{c.name}: {c.info['dim']}-d, {c.info['metric']}")
            elif verb == "search":
                if len(rest) < 2:
                    print(f"%vectors search: give the text to search for\n{USAGE}")
                    return None
                c = Collection(name)
                hits = c.search(text=" ".join(rest[1:]), k=k)
                show_listing(hits_bundle(f"{c.owner}/{c.name}", " ".join(rest[1:]), hits))
            elif verb == "count":
                c = Collection(name)
                print(f"{c.owner}/{c.name}: {plural(c.count(), 'row')}")
            elif verb == "share":
                users = opts.get("users")
                groups = opts.get("groups")
                info = Collection(name).share(
                    users=users.split(",") if users is not None else None,
                    groups=groups.split(",") if groups is not None else None,
                )
                who = info["share_users"] + [f"group {g}" for g in info["share_groups"]]
                print(f"{info['collection']}: shared with {', '.join(who) or 'no one'}")
                if info.get("warning"):
                    print(f"note: {info['warning']}")
            elif verb == "drop":
                c = Collection(name)
                c.drop()
                print(f"{c.owner}/{c.name}: dropped")
            else:
                print(f"%vectors: unknown verb {verb!r}\n{USAGE}")
        except (GpuLabError, ValueError) as e:
            print(f"%vectors {verb}: {in_flag_words(str(e))}")
        return None
