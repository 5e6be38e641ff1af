"""Unpacking an uploaded model archive, as an attacker would send it.

The archive (tar, optionally gzip/bz2/xz) must hold two regular files,
``model.json`` and the model file its kind names (``model.pt2``; an embedding
model's ``model.st.tar``; a language model's ``hf/config.json``, its Hugging Face
files one level down under ``hf/``, nothing deeper, and its LoRA adapters' files
under ``adapters/<name>/``, each adapter named in the card's ``adapters``). It is
read once, front to back, one member
at a time, and refused as soon as anything is wrong:

- the sizes its headers declare, all members together, may not pass
  ``max_bytes`` (a 300 KB .tar.xz can declare 2 GiB of zeros); this is checked
  before a member's data is decompressed, so a bomb costs almost nothing;
- headers that are no member of their own (GNU long names ``L``/``K``, pax
  ``x``/``g``) are read whole by tarfile before the member they describe, where
  the declared-size cap cannot see them: each may hold at most
  ``MAX_EXTENSION_BYTES`` and they count, with the members, toward
  ``MAX_HEADERS`` (a chain of thousands would also recurse that deep); sparse
  files, whose maps tarfile also reads whole, are refused;
- member names must stay inside the archive (no absolute paths, no ``..``);
- links, devices and FIFOs are refused by name rather than skipped silently;
- each wanted file is created fresh (``O_EXCL | O_NOFOLLOW``) in ``dest``: a
  second copy of a name is refused and nothing can be written through a link.

It is blocking work: the service runs it in an executor so the event loop
keeps answering. On refusal the caller removes ``dest``.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import tarfile
from collections.abc import Callable

from gpulab.backend.deployment_dir import ADAPTERS_DIR, HF_DIR, KIND_FILES, MODEL_FILES

#: More members than an exported model directory could hold.
MAX_MEMBERS = 64
#: Headers of every kind: each member may come with one extended header (tarfile
#: writes a pax header for each file it adds, for its fractional mtime).
MAX_HEADERS = 2 * MAX_MEMBERS
#: A long name or a pax header read whole into memory: far more than any name needs.
MAX_EXTENSION_BYTES = 64 << 10
#: The header types tarfile reads whole before the member they describe.
EXTENSION_TYPES = {
    tarfile.GNUTYPE_LONGNAME: "a GNU long-name header",
    tarfile.GNUTYPE_LONGLINK: "a GNU long-link header",
    tarfile.XHDTYPE: "a pax extended header",
    tarfile.XGLTYPE: "a pax global header",
    tarfile.SOLARIS_XHDTYPE: "a Solaris extended header",
}
#: model.json is a small card.
MAX_CARD_BYTES = 1 << 20
#: An adapter's name, as save_causal_lm allows it (it becomes part of a model id).
ADAPTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
#: What an adapter folder must hold for the replica to load it (PEFT, no pickles).
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
#: A card's input or output name. The lab builds a shell line (Copy curl) from the
#: names, datatypes and shapes of a card anyone may upload, and an admin sees every
#: user's: they hold no quote, space or `$`.
TENSOR_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
#: The Open Inference Protocol v2's tensor datatypes.
OIP_DATATYPES = frozenset(
    {"BOOL", "BYTES", "BF16", "FP16", "FP32", "FP64"}
    | {f"{sign}INT{bits}" for sign in ("", "U") for bits in (8, 16, 32, 64)}
)


class ArchiveRefused(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _guarded_tarinfo() -> type[tarfile.TarInfo]:
    """A TarInfo class for one archive whose header processing refuses, before reading
    them, extension headers over ``MAX_EXTENSION_BYTES``, more than ``MAX_HEADERS``
    headers in all, and sparse files (their maps are read whole too)."""
    headers = 0

    class GuardedTarInfo(tarfile.TarInfo):
        # _proc_member is tarfile's documented hook for subclasses: it runs for every
        # header, members and the extension headers before them (called again,
        # recursively, for the header after an L/K/x/g), before any of its data is read.
        def _proc_member(self, tar):
            nonlocal headers
            headers += 1
            if headers > MAX_HEADERS:
                raise ArchiveRefused(
                    400,
                    f"the archive has more than {MAX_HEADERS} tar headers; "
                    f"upload only the model's files (%deploy packs them for you)",
                )
            if self.type in EXTENSION_TYPES and self.size > MAX_EXTENSION_BYTES:
                raise ArchiveRefused(
                    400,
                    f"the archive holds {EXTENSION_TYPES[self.type]} of {self.size} bytes "
                    f"(at most {MAX_EXTENSION_BYTES >> 10} KiB); pack the model "
                    f"directory with short relative names (%deploy does this for you)",
                )
            if self.type == tarfile.GNUTYPE_SPARSE:
                self._refuse_sparse()
            return super()._proc_member(tar)

        def _refuse_sparse(self, member=None, *args) -> None:
            name = (member or self).name
            raise ArchiveRefused(
                400,
                f"archive member {name!r} is a sparse file; pack the model "
                f"directory without --sparse (%deploy does this for you)",
            )

        # A pax header's GNU.sparse.* records: version 1.0 reads a map of any length.
        _proc_gnusparse_00 = _proc_gnusparse_01 = _proc_gnusparse_10 = _refuse_sparse

    return GuardedTarInfo


def _wanted(member: tarfile.TarInfo) -> str | None:
    """The model file a member is, or None for one to skip; refuses unsafe members."""
    name = member.name
    norm = posixpath.normpath(name)
    if name.startswith("/") or norm == ".." or norm.startswith("../"):
        raise ArchiveRefused(
            400,
            f"archive member {name!r} points outside the archive; "
            f"pack the model directory with relative names "
            f"(%deploy does this for you)",
        )
    base = posixpath.basename(norm)
    folder = posixpath.dirname(norm)
    top, _, adapter = folder.partition("/")
    if folder == HF_DIR and _plain_name(base):
        base = f"{HF_DIR}/{base}"  # a language model's Hugging Face file
    elif top == ADAPTERS_DIR and adapter and "/" not in adapter and _plain_name(base):
        if not ADAPTER_NAME.fullmatch(adapter):
            raise ArchiveRefused(
                400,
                f"archive member {name!r}: adapter name {adapter!r} must be letters, "
                f"digits, '.', '_' or '-' (at most 63); rename the adapter",
            )
        base = f"{ADAPTERS_DIR}/{adapter}/{base}"  # a LoRA adapter's file
    elif base not in MODEL_FILES:
        return None
    if not member.isfile():
        kind = (
            "a symbolic link"
            if member.issym()
            else "a hard link"
            if member.islnk()
            else "a directory"
            if member.isdir()
            else "not a regular file"
        )
        raise ArchiveRefused(
            400, f"archive member {name!r} is {kind}; {base} must be a regular file"
        )
    return base


def _plain_name(name: str) -> bool:
    """A file name a Hugging Face folder holds (config.json, model.safetensors...)."""
    return (
        0 < len(name) <= 128
        and not name.startswith(".")
        and all(c.isalnum() or c in "._-" for c in name)
    )


def unpack_model(
    tar_path: str, dest: str, max_bytes: int, too_large: Callable[[int], str] | None = None
) -> dict:
    """Unpack ``tar_path`` into ``dest`` (model.pt2, model.json); return the card.
    ``too_large(declared)``: the 413's words when the archive declares more than
    ``max_bytes`` (the caller's cap: a model's size, or what is left of its owner's
    quota); ``declared`` is what it declared up to the member that passed the cap."""
    declared = 0
    found: set[str] = set()
    try:
        # Iterating reads one header at a time (getmembers() would read them all first).
        with tarfile.open(tar_path, mode="r:*", tarinfo=_guarded_tarinfo()) as tar:
            for count, member in enumerate(tar, start=1):
                if count > MAX_MEMBERS:
                    raise ArchiveRefused(
                        400,
                        f"the archive has more than {MAX_MEMBERS} "
                        f"members; upload only model.pt2 and model.json",
                    )
                declared += max(0, member.size)
                if declared > max_bytes:
                    raise ArchiveRefused(
                        413,
                        too_large(declared)
                        if too_large
                        else f"the model archive expands to more than {max_bytes / 2**20:g} "
                        f"MiB; export a smaller model or quantize it (%quantize)",
                    )
                base = _wanted(member)
                if base is None:
                    continue  # the next header read skips its data
                if base in found:
                    raise ArchiveRefused(400, f"the archive holds {base} twice; upload one")
                found.add(base)
                if "/" in base:  # hf/<file> or adapters/<name>/<file>
                    os.makedirs(
                        os.path.join(dest, posixpath.dirname(base)), mode=0o755, exist_ok=True
                    )
                _copy(tar, member, os.path.join(dest, base))
    except ArchiveRefused:
        raise
    except (tarfile.TarError, EOFError, OSError, ValueError) as e:
        # ValueError/EOFError/OSError: truncated or corrupt compressed data.
        raise ArchiveRefused(400, f"the model upload is not a readable tar archive: {e}") from None
    except RecursionError:
        # Headers chained past Python's stack (MAX_HEADERS should stop them first).
        raise ArchiveRefused(
            400, "the model upload is not a readable tar archive: its headers nest too deep"
        ) from None
    if "model.json" not in found:
        raise ArchiveRefused(
            400,
            "the model archive lacks model.json; upload "
            "a directory written by gpulab.serving.export_model",
        )
    card = _read_card(os.path.join(dest, "model.json"))
    kind = card.get("kind", "torch-export")
    if kind not in KIND_FILES:
        raise ArchiveRefused(
            400, f"model.json has kind {kind!r}; this service serves {', '.join(KIND_FILES)}"
        )
    if KIND_FILES[kind] not in found:
        raise ArchiveRefused(
            400,
            f"the model archive lacks {KIND_FILES[kind]}; upload "
            f"a directory written by gpulab.serving.export_model",
        )
    _check_adapters(card, kind, found)
    return card


def _check_adapters(card: dict, kind: str, found: set[str]) -> None:
    """Every adapter folder uploaded is one the card names, and each it names is whole."""
    uploaded = {f.split("/")[1] for f in found if f.startswith(f"{ADAPTERS_DIR}/")}
    named = card.get("adapters") or []
    if not isinstance(named, list) or not all(
        isinstance(a, str) and ADAPTER_NAME.fullmatch(a) for a in named
    ):
        raise ArchiveRefused(
            400,
            "model.json's adapters must be a list of adapter names (letters, digits, "
            "'.', '_' or '-'); save the model with gpulab.serving.llm_export.save_causal_lm",
        )
    if (uploaded or named) and kind != "causal-lm":
        raise ArchiveRefused(
            400,
            f"LoRA adapters go with a language model (kind causal-lm), not a {kind!r} "
            f"model; upload the adapters with the causal LM they adapt",
        )
    for adapter in sorted(uploaded - set(named)):
        raise ArchiveRefused(
            400,
            f"the archive holds adapters/{adapter}/ but model.json does not list "
            f"{adapter!r} in its adapters; add it there or leave the folder out",
        )
    for adapter in named:
        for f in ADAPTER_FILES:
            if f"{ADAPTERS_DIR}/{adapter}/{f}" not in found:
                raise ArchiveRefused(
                    400,
                    f"model.json lists the adapter {adapter!r} but the archive lacks "
                    f"adapters/{adapter}/{f}; save the adapter with save_pretrained "
                    f"(safetensors) or leave it out of the card",
                )


def _copy(tar: tarfile.TarFile, member: tarfile.TarInfo, path: str) -> None:
    src = tar.extractfile(member)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    left = member.size
    with src, os.fdopen(fd, "wb") as out:
        # Never more than the header declared, whatever the stream holds.
        while left > 0 and (chunk := src.read(min(1 << 20, left))):
            out.write(chunk)
            left -= len(chunk)


def _read_card(path: str) -> dict:
    try:
        if os.path.getsize(path) > MAX_CARD_BYTES:
            raise ValueError(f"it is over {MAX_CARD_BYTES >> 10} KiB")
        with open(path, encoding="utf-8") as f:
            card = json.load(f)
        if (
            not isinstance(card, dict)
            or not isinstance(card.get("inputs"), list)
            or not isinstance(card.get("max_batch_size"), int)
            or isinstance(card.get("max_batch_size"), bool)
            or card["max_batch_size"] < 1
        ):
            raise ValueError("it needs 'inputs' (a list) and 'max_batch_size' (an integer >= 1)")
    except (ValueError, OSError, RecursionError) as e:
        raise ArchiveRefused(400, f"model.json is not a gpulab model card: {e}") from None
    for field in ("inputs", "outputs"):
        _check_tensors(card.get(field, []), field)
    return card


def _shown(value) -> str:
    """A card's value in an error: a card may hold a megabyte in one."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _check_tensors(specs, field: str) -> None:
    """Each of the card's ``inputs`` (``outputs``) a name, an OIP datatype and a shape."""
    fix = "export the model with gpulab.serving.export_model"
    if not isinstance(specs, list):
        raise ArchiveRefused(400, f"model.json's {field} must be a list; {fix}")
    for i, spec in enumerate(specs):
        where = f"model.json's {field}[{i}]"
        if not isinstance(spec, dict):
            raise ArchiveRefused(400, f"{where} must be an object with name, datatype, shape")
        name, datatype, shape = spec.get("name"), spec.get("datatype"), spec.get("shape")
        if not isinstance(name, str) or not TENSOR_NAME.fullmatch(name):
            raise ArchiveRefused(
                400,
                f"{where}'s name {_shown(name)} must be 1 to 64 letters, digits, '_', '.', ':' "
                f"or '-'; rename it ({fix}'s input_names / output_names)",
            )
        if not isinstance(datatype, str) or datatype not in OIP_DATATYPES:
            raise ArchiveRefused(
                400,
                f"{where}'s datatype {_shown(datatype)} is not an OIP v2 datatype; use one of "
                f"{', '.join(sorted(OIP_DATATYPES))}",
            )
        # type(), not isinstance(): a bool is not a dimension.
        if not isinstance(shape, list) or not all(type(d) is int and d >= -1 for d in shape):
            raise ArchiveRefused(
                400,
                f"{where}'s shape {_shown(shape)} must be a list of integers (-1 for a "
                f"dimension of any size); {fix}",
            )
