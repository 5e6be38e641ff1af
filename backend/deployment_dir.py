"""Where a deployment's files live, whichever backend runs its replicas.

``<root>/<deployment id>/`` holds ``model/`` (model.json and model.pt2 or model.st.tar, written by
the service from the upload) and ``token``, the secret the replicas demand in
``Authorization: Bearer``. On Kubernetes ``root`` is a claim the replicas'
pods mount too.
"""

from __future__ import annotations

import os
import secrets
import shutil

#: What an uploaded model directory may hold: the card and its kind's model file.
MODEL_FILES = ("model.pt2", "model.json", "model.st.tar")
#: The model file each kind of card needs (gpulab.serving.export, gpulab.serving.embedding:
#: a sentence-transformers directory travels as one tar, so the upload stays flat).
KIND_FILES = {
    "torch-export": "model.pt2",
    "sentence-embedding": "model.st.tar",
    # A language model's Hugging Face folder (gpulab.serving.llm_export), flat under hf/.
    "causal-lm": "hf/config.json",
}
#: The one sub-folder an upload may have: a causal LM's Hugging Face files.
HF_DIR = "hf"
#: A causal LM's LoRA adapters, ``adapters/<name>/`` each (gpulab.serving.llm_export).
ADAPTERS_DIR = "adapters"


class DeploymentDirs:
    """The folders under ``self.root`` (the serving backend's, :mod:`.serving_base`)."""

    root: str

    def path(self, dep_id: str, *parts: str) -> str:
        return os.path.join(self.root, dep_id, *parts)

    def model_dir(self, dep_id: str) -> str:
        return self.path(dep_id, "model")

    def prepare(self, dep_id: str) -> str:
        """Create the directory and the replicas' secret; returns the model directory."""
        os.makedirs(self.model_dir(dep_id), exist_ok=True)
        fd = os.open(self.path(dep_id, "token"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32))
        return self.model_dir(dep_id)

    def token(self, dep_id: str) -> str:
        with open(self.path(dep_id, "token")) as f:
            return f.read().strip()

    def remove(self, dep_id: str) -> None:
        shutil.rmtree(self.path(dep_id), ignore_errors=True)
