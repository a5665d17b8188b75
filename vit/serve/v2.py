"""The Open Inference Protocol (KServe V2, Triton's HTTP protocol) for ``vit serve``: parsing an infer request,
writing its answer, the model's metadata.

One input, either ``FP32 [N, C, H, W]`` images already preprocessed (resized and normalised as ``GET /info`` says) or
``BYTES [N]`` encoded JPEG / PNG / WebP images (base64 strings in JSON, raw bytes in binary data). Two outputs,
``logits`` (calibrated, ``z / T``) and ``probabilities``, ``FP32 [N, classes]``. Triton's extensions:
*binary tensor data* (``Inference-Header-Content-Length``, ``binary_data_size``, ``binary_data``) and
*classification* (an output asked with ``parameters.classification = k`` answers ``BYTES [N, k]``
``"score:index:label"`` strings, best first). numpy only: no torch on the HTTP side.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np

from .errors import RequestError
from .payloads import decode_base64

HEADER = "inference-header-content-length"
OUTPUTS = ("logits", "probabilities")
INPUT_FP32, INPUT_BYTES = "images", "image_bytes"
EXTENSIONS = ["classification", "binary_tensor_data", "model_repository"]
VERSION = "1"


def model_metadata(info: dict[str, Any]) -> dict[str, Any]:
    """``GET /v2/models/{name}``: name, versions, platform, inputs and outputs."""
    classes = len(info["classes"])
    return {
        "name": info["model"],
        "versions": [VERSION],
        "platform": "onnxruntime_onnx" if info["backend"] == "onnx" else "pytorch_libtorch",
        "inputs": [
            {"name": INPUT_FP32, "datatype": "FP32", "shape": [-1, *info["input_size"]]},
            {"name": INPUT_BYTES, "datatype": "BYTES", "shape": [-1]},
        ],
        "outputs": [{"name": name, "datatype": "FP32", "shape": [-1, classes]} for name in OUTPUTS],
    }


def parse_infer(body: bytes, headers: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(worker payload, request)`` of an infer request's body: the JSON part and its one input.

    Raises:
        RequestError: 400 for a malformed request.
    """
    size = headers.get(HEADER)
    try:
        split = int(size) if size is not None else len(body)
        request = json.loads(body[:split])
    except ValueError as err:
        raise RequestError(400, f"the infer request is not JSON ({err})") from None
    if not isinstance(request, dict) or not isinstance(request.get("inputs"), list) or len(request["inputs"]) != 1:
        raise RequestError(400, f"an infer request has one input: {INPUT_FP32} (FP32 [N, C, H, W]) or "
                                f"{INPUT_BYTES} (BYTES [N])")  # fmt: skip
    tensor = request["inputs"][0]
    binary = binary_parts(body[split:], request["inputs"])[0]
    kind, shape = tensor.get("datatype"), tensor.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise RequestError(400, f"input {tensor.get('name')!r}: shape must be a list of sizes, got {shape!r}")
    if kind == "FP32":
        return {"kind": "tensor", "inputs": fp32(tensor, shape, binary)}, request
    if kind == "BYTES":
        return {"kind": "tensor", "images": images(tensor, binary)}, request
    raise RequestError(400, f"input {tensor.get('name')!r}: datatype {kind!r} is not accepted: FP32 or BYTES")


def binary_parts(data: bytes, tensors: list[dict[str, Any]]) -> list[bytes | None]:
    """The binary data of each tensor (``parameters.binary_data_size``), in order, ``None`` for JSON data."""
    parts, start = [], 0
    for tensor in tensors:
        size = (tensor.get("parameters") or {}).get("binary_data_size")
        if size is None:
            parts.append(None)
            continue
        if not isinstance(size, int) or start + size > len(data):
            raise RequestError(400, f"input {tensor.get('name')!r}: binary_data_size {size} past the body's end")
        parts.append(data[start : start + size])
        start += size
    return parts


def fp32(tensor: dict[str, Any], shape: list[int], binary: bytes | None) -> np.ndarray:
    """An FP32 input as an array of its shape."""
    try:
        if binary is not None:
            return np.frombuffer(binary, dtype="<f4").reshape(shape).astype(np.float32)
        return np.asarray(tensor.get("data"), dtype=np.float32).reshape(shape)
    except (ValueError, TypeError) as err:
        raise RequestError(400, f"input {tensor.get('name')!r}: the data does not fill shape {shape} ({err})") from None


def images(tensor: dict[str, Any], binary: bytes | None) -> list[bytes]:
    """The encoded images of a BYTES input: length-prefixed raw bytes, or base64 strings in JSON."""
    if binary is None:
        data = tensor.get("data")
        data = data if isinstance(data, list) else [data]
        flat = [x for row in data for x in (row if isinstance(row, list) else [row])]
        return [decode_base64(text, i) for i, text in enumerate(flat)]
    out, at = [], 0
    while at + 4 <= len(binary):
        (size,) = struct.unpack_from("<I", binary, at)
        out.append(binary[at + 4 : at + 4 + size])
        at += 4 + size
    if at != len(binary):
        raise RequestError(400, f"input {tensor.get('name')!r}: the BYTES data is cut short")
    return out


def infer_response(request: dict[str, Any], logits: np.ndarray, info: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    """The body and headers of the answer: the outputs asked for (both without ``outputs``), classification strings
    where asked, binary data where asked (per output, or ``parameters.binary_data_output``)."""
    from scipy.special import softmax

    probs = softmax(logits.astype(np.float64), axis=1)
    values = {"logits": logits.astype(np.float32), "probabilities": probs.astype(np.float32)}
    wanted = request.get("outputs") or [{"name": name} for name in OUTPUTS]
    binary_default = bool((request.get("parameters") or {}).get("binary_data_output", False))
    outputs, blobs = [], []
    for spec in wanted:
        name, params = spec.get("name"), spec.get("parameters") or {}
        if name not in values:
            raise RequestError(400, f"unknown output {name!r}: the model has {', '.join(OUTPUTS)}")
        k = params.get("classification")
        array = classification(values[name], int(k), info["classes"]) if k else values[name]
        entry: dict[str, Any] = {"name": name, "datatype": "BYTES" if k else "FP32", "shape": list(array.shape)}
        if params.get("binary_data", binary_default):
            blob = serialize_bytes(array) if k else array.tobytes()
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = [str(s) for s in array.ravel()] if k else array.ravel().tolist()
        outputs.append(entry)
    head = {"model_name": info["model"], "model_version": VERSION, "outputs": outputs}
    if "id" in request:
        head["id"] = request["id"]
    text = json.dumps(head).encode()
    if not blobs:
        return text, {"content-type": "application/json"}
    return text + b"".join(blobs), {"content-type": "application/octet-stream", HEADER: str(len(text))}


def classification(values: np.ndarray, k: int, classes: list[str]) -> np.ndarray:
    """Triton's classification extension: the ``k`` largest values per row as ``"value:index:label"`` strings."""
    if k < 1:
        raise RequestError(400, f"classification must be a positive count, got {k}")
    order = np.argsort(-values, axis=1, kind="stable")[:, : min(k, values.shape[1])]
    rows = [[f"{row[i]:f}:{i}:{classes[i]}" for i in top] for row, top in zip(values, order, strict=True)]
    return np.array(rows, dtype=object)


def serialize_bytes(array: np.ndarray) -> bytes:
    """A BYTES tensor in Triton's binary form: each element's length (4 bytes, little-endian), then its bytes."""
    parts = [str(s).encode() for s in array.ravel()]
    return b"".join(struct.pack("<I", len(p)) + p for p in parts)


__all__ = ["infer_response", "model_metadata", "parse_infer"]
