"""Calling a deployed model by name from any notebook: ``Endpoint("alice/sentiment")``.

    from gpulab.client import Endpoint
    ep = Endpoint("alice/sentiment")          # or Endpoint("sentiment"): your own
    out = ep.infer(x)                         # numpy in, {output name: numpy} out
    ep.infer({"input": x}, version=2)         # a given version (e.g. a canary)

It speaks OIP v2 over JSON through the hub, with your hub token (the one the
server holds), and finds the endpoint in the catalog (``GET /models``), which
lists what you may call. A wrong name says which endpoints there are.
"""

from __future__ import annotations

import json

import numpy as np

from .errors import NotFound
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
        found = [
            m
            for m in self.client.models()
            if m["name"] == short and (not owner or m["owner"] == owner)
        ]
        if not owner:  # your own first, then one shared with you, if only one
            own = [m for m in found if not m["shared"]]
            found = own or found
        if len(found) != 1:
            known = ", ".join(m["endpoint"] for m in self.client.models()) or "none"
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

    @staticmethod
    def _tensor(name: str, value) -> dict:
        arr = np.asarray(value.detach().cpu().numpy() if hasattr(value, "detach") else value)
        if arr.dtype.name not in DATATYPES:
            raise ValueError(f"input {name!r}: dtype {arr.dtype} has no OIP v2 datatype")
        return {
            "name": name,
            "shape": list(arr.shape),
            "datatype": DATATYPES[arr.dtype.name],
            "data": arr.reshape(-1).tolist(),
        }
