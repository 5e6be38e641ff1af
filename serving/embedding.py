"""Sentence-embedding models (``sentence_transformers.SentenceTransformer``) for serving.

A SentenceTransformer brings its own tokenizer, so it is not traced with
``torch.export``: its model directory (``model.save``) travels as it is, packed
into one plain file, ``model.st.tar``, beside the card ``model.json``. One file,
because the service accepts only known flat file names from an upload and hands
plain files to the replica's account.

The card says ``"kind": "sentence-embedding"``, one input ``text`` (``BYTES``,
shape ``[-1]``: UTF-8 strings) and one output ``embedding`` (``FP32``, shape
``[-1, DIM]``), ``"normalized": true``: every row has unit length, so a dot
product is the cosine similarity. Texts longer than the model's
``max_seq_length`` tokens are truncated, as ``encode`` does.

sentence_transformers is imported only when such a model is loaded, so replicas
of torch.export models never pay for it.
"""

from __future__ import annotations

import os
import shutil
import tarfile
import tempfile

import numpy as np

from .export import CARD_FILE, ExportError, ModelCard, TensorSpec

KIND = "sentence-embedding"
ARCHIVE_FILE = "model.st.tar"
PLATFORM = "sentence_transformers"
INPUT, OUTPUT = "text", "embedding"
#: The most files a saved SentenceTransformer directory holds, with room to spare.
MAX_FILES = 256

_INSTALL = "pip install 'gpulab[embeddings]' (sentence-transformers)"


def is_sentence_transformer(model) -> bool:
    """Whether ``model`` is a SentenceTransformer, without importing the library."""
    return any(
        c.__name__ == "SentenceTransformer" and c.__module__.startswith("sentence_transformers")
        for c in type(model).__mro__
    )


def dimension(model) -> int:
    """The length of the model's embeddings (the method was renamed in 6.x)."""
    get = getattr(model, "get_embedding_dimension", None)
    dim = get() if get is not None else model.get_sentence_embedding_dimension()
    if not dim:
        raise ExportError(
            "the SentenceTransformer does not say its embedding dimension; "
            "add a Pooling module so it has one"
        )
    return int(dim)


def export_embedding(
    model, model_dir: str, *, name: str | None = None, max_batch_size: int = 4096
) -> ModelCard:
    """Write ``model`` (a SentenceTransformer) and its card into ``model_dir``."""
    if not is_sentence_transformer(model):
        raise ExportError(
            f"{type(model).__name__} is not a sentence_transformers.SentenceTransformer"
        )
    card = ModelCard(
        name=name or "embedding",
        inputs=[TensorSpec(INPUT, "BYTES", [-1])],
        outputs=[TensorSpec(OUTPUT, "FP32", [-1, dimension(model)])],
        max_batch_size=max_batch_size,
        platform=PLATFORM,
        kind=KIND,
        normalized=True,
        requires=["sentence-transformers"],
    )
    os.makedirs(model_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpulab-embedding-") as saved:
        model.save(saved)
        # Uncompressed: the weights do not compress, and the upload is gzipped anyway.
        with tarfile.open(os.path.join(model_dir, ARCHIVE_FILE), "w") as tar:
            for root, dirs, files in os.walk(saved):
                dirs.sort()
                for f in sorted(files):
                    path = os.path.join(root, f)
                    tar.add(path, arcname=os.path.relpath(path, saved), recursive=False)
    with open(os.path.join(model_dir, CARD_FILE), "w") as f:
        f.write(card.to_json())
    return card


def _unpack(archive: str, dest: str) -> None:
    """Regular files and folders only, inside ``dest`` (Python 3.11.2 has no tar filters)."""
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
        if len(members) > MAX_FILES:
            raise ValueError(f"{archive} holds {len(members)} members; re-export the model")
        for m in members:
            norm = os.path.normpath(m.name)
            if os.path.isabs(norm) or norm == ".." or norm.startswith("../"):
                raise ValueError(
                    f"{archive}: member {m.name!r} points outside; re-export the model"
                )
            if not (m.isfile() or m.isdir()):
                raise ValueError(f"{archive}: member {m.name!r} is not a file; re-export the model")
        for m in members:
            target = os.path.join(dest, os.path.normpath(m.name))
            if m.isdir():
                os.makedirs(target, exist_ok=True)
                continue
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with tar.extractfile(m) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)


class EmbeddingModel:
    """A loaded embedding model: call it with an array of strings, get ``[FP32 [n, DIM]]``."""

    def __init__(self, card: ModelCard, model):
        self.card = card
        self.model = model

    def encode(self, texts: list[str]) -> np.ndarray:
        """Unit-length embeddings of ``texts``, float32 ``[len(texts), DIM]``."""
        out = self.model.encode(
            list(texts),
            batch_size=max(1, len(texts)),  # the dynamic batcher already formed the batch
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.asarray(out, dtype=np.float32).reshape(len(texts), -1)

    def __call__(self, texts: np.ndarray) -> list[np.ndarray]:
        return [self.encode([str(t) for t in texts.reshape(-1)])]


def load_embedding(model_dir: str, card: ModelCard, device: str | None = None) -> EmbeddingModel:
    """Load the SentenceTransformer of an embedding model directory (``card`` read from it)."""
    archive = os.path.join(model_dir, ARCHIVE_FILE)
    if not os.path.exists(archive):
        raise FileNotFoundError(
            f"{archive} is missing; export the SentenceTransformer with "
            "gpulab.serving.export.export_model(model, None, dir)"
        )
    try:
        import torch
        from sentence_transformers import SentenceTransformer
    except ImportError:
        raise ImportError(f"{model_dir} is a sentence-embedding model; {_INSTALL}") from None
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    # Unpacked to a private folder, loaded into memory, then removed: the replica's
    # model folder is read-only for it.
    with tempfile.TemporaryDirectory(prefix="gpulab-embedding-") as tmp:
        _unpack(archive, tmp)
        # Every file is here: never ask the Hugging Face hub (a replica may not reach it).
        model = SentenceTransformer(tmp, device=device, local_files_only=True)
    model.eval()
    return EmbeddingModel(card, model)
