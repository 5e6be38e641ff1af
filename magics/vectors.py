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

import shlex
from html import escape

from IPython.core.magic import Magics, line_magic, magics_class

from gpulab.client.units import plural

from .rich import CELL, Row, rows_bundle, show_listing

USAGE = (
    "usage: %vectors list | create NAME (--dim N | --embed ENDPOINT) [--metric cosine|l2|ip]"
    " | search NAME TEXT [-k K] | count NAME | share NAME [--users A,B] [--groups G] | drop NAME"
)


def _options(words: list[str]) -> tuple[list[str], dict[str, str]]:
    """Positional words and ``--flag value`` pairs (``-k`` too)."""
    args, opts, i = [], {}, 0
    while i < len(words):
        w = words[i]
        if w.startswith("-") and i + 1 < len(words):
            opts[w.lstrip("-")] = words[i + 1]
            i += 2
        else:
            args.append(w)
            i += 1
    return args, opts


def hits_bundle(where: str, query: str, hits) -> dict[str, str]:
    """The hits as a table (rank, id, score, metadata) and as lines."""
    lines = [f"{where}: {plural(len(hits), 'hit')} for {query!r}"]
    rows = []
    for rank, h in enumerate(hits, 1):
        meta = ", ".join(f"{k}={v}" for k, v in h.metadata.items())
        lines.append(f"  {rank}. {h.id}  {h.score:.3f}  {meta}")
        rows.append(
            f'<tr><td style="{CELL}">{rank}</td><td style="{CELL}"><b>{escape(h.id)}</b></td>'
            f'<td style="{CELL}">{h.score:.3f}</td><td style="{CELL}">{escape(meta)}</td></tr>'
        )
    head = "".join(f'<th style="{CELL}">{t}</th>' for t in ("#", "id", "score", "metadata"))
    html = (
        f"<div>{escape(lines[0])}</div>"
        f'<table class="gpulab-hits" style="border-collapse:collapse;font-size:12px">'
        f"<tr>{head}</tr>{''.join(rows)}</table>"
    )
    return {"text/plain": "\n".join(lines), "text/html": html}


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
        except ValueError as e:
            print(f"%vectors: {e}\n{USAGE}")
            return None
        args, opts = _options(words)
        if not args:
            print(USAGE)
            return None
        verb, rest = args[0], args[1:]
        try:
            if verb == "list":
                show_listing(listing(Client().collections()))
                return None
            if not rest:
                print(f"%vectors {verb}: name the collection\n{USAGE}")
                return None
            name = rest[0]
            if verb == "create":
                dim = int(opts["dim"]) if "dim" in opts else None
                c = Collection(
                    name, dim=dim, embed=opts.get("embed"), metric=opts.get("metric", "cosine")
                )
                print(f"{c.owner}/{c.name}: {c.info['dim']}-d, {c.info['metric']}")
            elif verb == "search":
                if len(rest) < 2:
                    print(f"%vectors search: give the text to search for\n{USAGE}")
                    return None
                c = Collection(name)
                hits = c.search(text=" ".join(rest[1:]), k=int(opts.get("k", 10)))
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
            elif verb == "drop":
                c = Collection(name)
                c.drop()
                print(f"{c.owner}/{c.name}: dropped")
            else:
                print(f"%vectors: unknown verb {verb!r}\n{USAGE}")
        except (GpuLabError, ValueError) as e:
            print(f"%vectors {verb}: {e}")
        return None
