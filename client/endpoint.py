"""Calling a deployed model by name from any notebook: ``Endpoint("alice/sentiment")``.

    from gpulab.client import Endpoint
    ep = Endpoint("alice/sentiment")          # or Endpoint("sentiment"): your own
    out = ep.infer(x)                         # numpy in, {output name: numpy} out
    ep.infer({"input": x}, version=2)         # a given version (e.g. a canary)
    Endpoint("minilm").embed(["a text", ...]) # an embedding endpoint: [n, DIM] float32

It speaks OIP v2 over JSON through the hub, with your hub token (the one the
server holds), and finds the endpoint in the catalog (``GET /models``), which
lists what you may call. A wrong name says which endpoints there are.
"""

from __future__ import annotations

import json
import re

import numpy as np

from .errors import BadRequest, NotFound
from .units import plural

#: OIP v2 datatypes of numpy dtypes (what a model's inputs may be).
DATATYPES = {
    "bool": "BOOL",
    "uint8": "UINT8",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "float16": "FP16",
    "float32": "FP32",
    "float64": "FP64",
}
NUMPY = {v: k for k, v in DATATYPES.items()}


class Endpoint:
    """One endpoint of the catalog, called with numpy arrays."""

    def __init__(self, name: str, client=None):
        from .base import Client

        self.client = client if client is not None else Client()
        owner, _, short = name.rpartition("/")
        endpoints = [m for m in self.client.models() if m.get("kind", "endpoint") == "endpoint"]
        found = [m for m in endpoints if m["name"] == short and (not owner or m["owner"] == owner)]
        if not owner:  # your own first, then one shared with you, if only one
            own = [m for m in found if not m["shared"]]
            found = own or found
        if len(found) != 1:
            known = ", ".join(m["endpoint"] for m in endpoints) or "none"
            what = "several endpoints are" if found else "no endpoint is"
            raise NotFound(
                404,
                f"{what} called {name!r} that you may use; give owner/name. "
                f"Endpoints you may call: {known}",
            )
        self.info = found[0]
        self.name = self.info["endpoint"]
        self.url = self.client.endpoint_url(self.info)

    def __repr__(self) -> str:
        return f"Endpoint({self.name!r}, state={self.info['state']!r})"

    @property
    def inputs(self) -> list[dict]:
        return self.info.get("inputs") or []

    @property
    def outputs(self) -> list[dict]:
        return self.info.get("outputs") or []

    def infer(self, inputs, version: int | None = None) -> dict[str, np.ndarray]:
        """Run the model on ``inputs`` (an array, a tuple of arrays in the model's input
        order, or ``{input name: array}``); ``{output name: array}``."""
        if not isinstance(inputs, dict):
            arrays = inputs if isinstance(inputs, (tuple, list)) else (inputs,)
            names = [spec["name"] for spec in self.inputs]
            if len(arrays) != len(names):
                raise ValueError(
                    f"{self.name} takes {plural(len(names), 'input')} ({', '.join(names)}); "
                    f"got {len(arrays)}"
                )
            inputs = dict(zip(names, arrays, strict=True))
        body = {"inputs": [self._tensor(k, v) for k, v in inputs.items()]}
        model = self.name.split("/", 1)[1]
        path = f"v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
        answer = self.client.call_endpoint(self.info["path"], path, json.dumps(body).encode())
        return {
            out["name"]: np.asarray(
                out["data"], dtype=NUMPY.get(out["datatype"], "float32")
            ).reshape(out["shape"])
            for out in answer["outputs"]
        }

    def embed(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
        """Embeddings of ``texts`` from an embedding endpoint (a deployed
        SentenceTransformer): float32 ``[len(texts), DIM]``, rows of unit length.

        Sent ``batch_size`` texts per call; an endpoint deployed with a smaller
        ``--max-batch-size`` says so on the first call, and the calls shrink to it."""
        if [(s["name"], s["datatype"]) for s in self.inputs] != [("text", "BYTES")]:
            raise ValueError(
                f"{self.name} is not an embedding endpoint (it takes "
                f"{', '.join(s['name'] for s in self.inputs) or 'no known inputs'}); "
                "deploy a SentenceTransformer to embed text"
            )
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise ValueError("embed takes a list of strings")
        if not texts:
            dim = (self.outputs[0]["shape"][-1] if self.outputs else 0) or 0
            return np.zeros((0, dim), dtype=np.float32)
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        parts, start = [], 0
        while start < len(texts):
            try:
                parts.append(self.infer({"text": list(texts[start : start + batch_size])}))
            except BadRequest as e:
                # "... exceeds the max batch size 8; split it" (gpulab.serving.server)
                cap = re.search(r"max batch size (\d+)", str(e))
                if cap is None or not 0 < int(cap.group(1)) < batch_size:
                    raise
                batch_size = int(cap.group(1))
                continue
            start += batch_size
        return np.concatenate([p["embedding"] for p in parts]).astype(np.float32, copy=False)

    @staticmethod
    def _tensor(name: str, value) -> dict:
        if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
            # Text goes as OIP v2 BYTES: in JSON, a list of strings.
            return {"name": name, "shape": [len(value)], "datatype": "BYTES", "data": list(value)}
        arr = np.asarray(value.detach().cpu().numpy() if hasattr(value, "detach") else value)
        if arr.dtype.kind == "U":
            return {
                "name": name,
                "shape": list(arr.shape),
                "datatype": "BYTES",
                "data": arr.reshape(-1).tolist(),
            }
        if arr.dtype.name not in DATATYPES:
            raise ValueError(f"input {name!r}: dtype {arr.dtype} has no OIP v2 datatype")
        return {
            "name": name,
            "shape": list(arr.shape),
            "datatype": DATATYPES[arr.dtype.name],
            "data": arr.reshape(-1).tolist(),
        }
