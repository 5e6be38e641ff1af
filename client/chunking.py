"""Long documents cut into overlapping chunks for a collection of texts.

    from gpulab.client import chunk_text
    chunk_text(long_text, chunk_size=1000, chunk_overlap=200)
    # -> [(0, "first chunk..."), (800, "second..."), ...]: (start offset, text)

A chunk is at most ``chunk_size`` characters (an embedding model reads a bounded
number of tokens: MiniLM 256, about 1,000 characters of English). It ends at the last
whitespace inside that window, so words are not cut, unless the window holds none.
The next chunk starts ``chunk_overlap`` characters before the end of the previous one
(at a word's start where one is near), so a sentence cut by a boundary is whole in one
of the two. Standard library only.
"""

from __future__ import annotations


def chunk_text(
    text: str, chunk_size: int = 1000, chunk_overlap: int = 200
) -> list[tuple[int, str]]:
    """``text`` as ``(start, chunk)`` pairs, in order; blank chunks are left out."""
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(
            f"chunk_size must be a whole number of characters, 1 or more, not {chunk_size!r}"
        )
    if not isinstance(chunk_overlap, int) or not 0 <= chunk_overlap < chunk_size:
        raise ValueError(
            f"chunk_overlap must be from 0 to chunk_size - 1 ({chunk_size - 1}), "
            f"not {chunk_overlap!r}"
        )
    out: list[tuple[int, str]] = []
    start, n = 0, len(text)
    while start < n:
        end = min(start + chunk_size, n)
        if end < n:
            end = _word_end(text, start, end)
        piece = text[start:end]
        if piece.strip():
            out.append((start + len(piece) - len(piece.lstrip()), piece.strip()))
        if end >= n:
            break
        start = _word_start(text, max(end - chunk_overlap, start + 1), end)
    return out


def _word_end(text: str, start: int, end: int) -> int:
    """The end of the window ``text[start:end]`` moved back to the last whitespace, so
    a word is not cut; not into its first half (a chunk is never much shorter than
    asked), and not at all where the window holds no whitespace there."""
    for i in range(end, start + (end - start) // 2, -1):
        if text[i].isspace():
            return i
    return end


def _word_start(text: str, at: int, end: int) -> int:
    """``at`` moved forward to the start of the next word, if one starts before ``end``."""
    if at == 0 or text[at - 1].isspace():
        return at
    for i in range(at, end):
        if text[i].isspace():
            return i + 1
    return at
