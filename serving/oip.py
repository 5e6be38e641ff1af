"""Open Inference Protocol v2 (KServe/Triton) REST codec, with the binary-data extension.

A request body is JSON, or — with the ``Inference-Header-Content-Length: N``
header — N bytes of JSON followed by the raw bytes of every input whose
``parameters.binary_data_size`` is set, in input order (row-major, little
endian; ``BYTES`` elements each a 4-byte length and the bytes, and here always
UTF-8 text). Outputs come back binary when the request asks for it per output
(``outputs[i].parameters.binary_data``) or for all (``parameters.binary_data_output``);
tritonclient asks for binary by default.

Every way a request can be wrong raises :class:`BadRequest` with a message for
the caller; nothing here touches the model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from .export import ModelCard

HEADER_LENGTH = "Inference-Header-Content-Length"

OIP_TO_NUMPY = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}


class BadRequest(ValueError):
    """The request is malformed or does not fit the model; the message says how."""


@dataclass
class InferRequest:
    id: str | None
    inputs: list[np.ndarray]  # in the model card's input order
    outputs: list[tuple[str, bool]]  # (name, binary) in the order to answer
    rows: int


def _json_header(body: bytes, header_length: str | None) -> tuple[dict, bytes]:
    if header_length is not None:
        try:
            n = int(header_length)
        except ValueError:
            raise BadRequest(f"{HEADER_LENGTH} must be an integer, got {header_length!r}") from None
        if not 0 < n <= len(body):
            raise BadRequest(f"{HEADER_LENGTH} is {n} but the body has {len(body)} bytes")
        head, rest = body[:n], body[n:]
    else:
        head, rest = body, b""
    try:
        doc = json.loads(head)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"malformed JSON in the request: {exc}") from None
    if not isinstance(doc, dict):
        raise BadRequest('the request must be a JSON object with an "inputs" list')
    return doc, rest


def _expect_shape(spec_shape: list[int], shape: list[int], name: str) -> None:
    if len(shape) != len(spec_shape) or any(
        want != -1 and want != got for want, got in zip(spec_shape, shape, strict=False)
    ):
        raise BadRequest(
            f"input {name!r} has shape {shape}; the model expects {spec_shape} "
            "(-1 is the batch dimension)"
        )


def decode_request(body: bytes, header_length: str | None, card: ModelCard) -> InferRequest:
    doc, binary = _json_header(body, header_length)
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise BadRequest('the request needs an "inputs" list with one entry per model input')
    by_name: dict[str, np.ndarray] = {}
    offset = 0
    specs = {s.name: s for s in card.inputs}
    for raw in raw_inputs:
        if not isinstance(raw, dict):
            raise BadRequest('each entry of "inputs" must be an object')
        name, datatype, shape = raw.get("name"), raw.get("datatype"), raw.get("shape")
        if not isinstance(name, str):
            raise BadRequest('each input needs a "name"')
        if name not in specs:
            raise BadRequest(f"unknown input {name!r}; the model's inputs are {sorted(specs)}")
        if name in by_name:
            raise BadRequest(f"input {name!r} is given twice")
        spec = specs[name]
        if datatype != spec.datatype:
            raise BadRequest(
                f"input {name!r} has datatype {datatype!r}; the model expects {spec.datatype!r}"
            )
        if (
            not isinstance(shape, list)
            or not shape
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
        ):
            raise BadRequest(f'input {name!r} needs a "shape": a list of non-negative integers')
        _expect_shape(spec.shape, shape, name)
        if shape[0] < 1:
            raise BadRequest(f"input {name!r} has an empty batch (shape {shape})")
        count = int(np.prod(shape))
        params = raw.get("parameters") or {}
        if not isinstance(params, dict):
            raise BadRequest(f'input {name!r}: "parameters" must be an object')
        size = params.get("binary_data_size")
        if spec.datatype == "BYTES":
            array, offset = _text_input(name, raw, shape, count, size, binary, offset)
            by_name[name] = array
            continue
        dtype = OIP_TO_NUMPY[spec.datatype]
        if size is not None:
            if not isinstance(size, int) or size != count * dtype.itemsize:
                raise BadRequest(
                    f"input {name!r}: binary_data_size is {size!r}, but shape {shape} "
                    f"of {datatype} needs {count * dtype.itemsize} bytes"
                )
            if offset + size > len(binary):
                raise BadRequest(f"input {name!r}: the body ends before its {size} binary bytes")
            array = np.frombuffer(binary, dtype=dtype, count=count, offset=offset).reshape(shape)
            offset += size
        else:
            if "data" not in raw:
                raise BadRequest(f'input {name!r} has neither "data" nor binary_data_size')
            try:
                array = np.asarray(raw["data"], dtype=dtype)
            except (TypeError, ValueError, OverflowError) as exc:
                raise BadRequest(f"input {name!r}: data is not {datatype}: {exc}") from None
            if array.size != count:
                raise BadRequest(
                    f"input {name!r}: {array.size} values for shape {shape} (needs {count})"
                )
            array = array.reshape(shape)
        by_name[name] = array
    if offset != len(binary):
        raise BadRequest(f"{len(binary) - offset} bytes of binary data no input claims")
    missing = [s.name for s in card.inputs if s.name not in by_name]
    if missing:
        raise BadRequest(
            f"missing {'input' if len(missing) == 1 else 'inputs'} {missing}; "
            f"the model needs {[s.name for s in card.inputs]}"
        )
    inputs = [by_name[s.name] for s in card.inputs]
    rows = {a.shape[0] for a in inputs}
    if len(rows) != 1:
        raise BadRequest(f"inputs disagree on the batch size (dim 0): {sorted(rows)}")

    return InferRequest(
        id=_request_id(doc), inputs=inputs, outputs=_requested_outputs(doc, card), rows=rows.pop()
    )


def _text_input(name, raw, shape, count, size, binary: bytes, offset: int):
    """A BYTES input as an object array of str, and the binary offset after it.

    The only BYTES inputs served are texts, so every element must be UTF-8. In JSON,
    ``data`` is a list of strings; in binary, each element is a 4-byte little-endian
    length and that many bytes (tritonclient's ``serialize_byte_tensor``)."""
    if size is not None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise BadRequest(f"input {name!r}: binary_data_size must be a non-negative integer")
        if offset + size > len(binary):
            raise BadRequest(f"input {name!r}: the body ends before its {size} binary bytes")
        items, at, end = [], offset, offset + size
        while at < end:
            if end - at < 4:
                raise BadRequest(f"input {name!r}: element {len(items)} lacks its 4-byte length")
            n = int.from_bytes(binary[at : at + 4], "little")
            if at + 4 + n > end:
                raise BadRequest(f"input {name!r}: element {len(items)} runs past its data")
            items.append(binary[at + 4 : at + 4 + n])
            at += 4 + n
        texts = []
        for i, item in enumerate(items):
            try:
                texts.append(item.decode("utf-8"))
            except UnicodeDecodeError:
                raise BadRequest(f"input {name!r}: element {i} is not UTF-8 text") from None
        offset = end
    else:
        texts = raw.get("data")
        if not isinstance(texts, list):
            raise BadRequest(f'input {name!r} needs "data": a list of strings')
        bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
        if bad is not None:
            raise BadRequest(
                f"input {name!r}: element {bad} is {type(texts[bad]).__name__}, not a string"
            )
        for i, t in enumerate(texts):
            try:
                t.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate escape (\ud800) in the JSON
                raise BadRequest(f"input {name!r}: element {i} is not UTF-8 text") from None
    if len(texts) != count:
        raise BadRequest(f"input {name!r}: shape {shape} needs {count} strings, got {len(texts)}")
    array = np.empty(count, dtype=object)
    array[:] = texts
    return array.reshape(shape), offset


def _request_id(doc: dict) -> str | None:
    rid = doc.get("id")
    if rid is not None and not isinstance(rid, str):
        raise BadRequest('"id" must be a string')
    return rid


def _requested_outputs(doc: dict, card: ModelCard) -> list[tuple[str, bool]]:
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise BadRequest('"parameters" must be an object')
    default_binary = bool(params.get("binary_data_output", False))
    raw_outputs = doc.get("outputs")
    known = [s.name for s in card.outputs]
    if raw_outputs is None:
        return [(n, default_binary) for n in known]
    if not isinstance(raw_outputs, list):
        raise BadRequest('"outputs" must be a list')
    chosen = []
    for raw in raw_outputs:
        name = raw.get("name") if isinstance(raw, dict) else None
        if name not in known:
            raise BadRequest(f"unknown output {name!r}; the model's outputs are {known}")
        oparams = raw.get("parameters") or {}
        if not isinstance(oparams, dict):
            raise BadRequest(f'output {name!r}: "parameters" must be an object')
        chosen.append((name, bool(oparams.get("binary_data", default_binary))))
    return chosen


def encode_response(
    card: ModelCard, request: InferRequest, outputs: list[np.ndarray]
) -> tuple[bytes, dict[str, str]]:
    """The response body and headers; binary outputs follow the JSON header."""
    by_name = {s.name: (s, a) for s, a in zip(card.outputs, outputs, strict=False)}
    tensors, blobs = [], []
    for name, binary in request.outputs:
        spec, array = by_name[name]
        array = np.ascontiguousarray(array, dtype=OIP_TO_NUMPY[spec.datatype])
        entry = {"name": name, "datatype": spec.datatype, "shape": list(array.shape)}
        if binary:
            blob = array.tobytes()
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = array.ravel().tolist()
        tensors.append(entry)
    doc = {"model_name": card.name, "model_version": card.version, "outputs": tensors}
    if request.id is not None:
        doc["id"] = request.id
    head = json.dumps(doc, separators=(",", ":")).encode()
    if not blobs:
        return head, {"Content-Type": "application/json"}
    return b"".join([head, *blobs]), {
        "Content-Type": "application/octet-stream",
        HEADER_LENGTH: str(len(head)),
    }


def model_metadata(card: ModelCard) -> dict:
    return {
        "name": card.name,
        "versions": [card.version],
        "platform": card.platform,
        "inputs": [{"name": s.name, "datatype": s.datatype, "shape": s.shape} for s in card.inputs],
        "outputs": [
            {"name": s.name, "datatype": s.datatype, "shape": s.shape} for s in card.outputs
        ],
    }
