"""``POST /predict`` on the HTTP side: the request's images and options as a worker payload, the answer as JSON.

Three bodies carry images: raw bytes (``Content-Type: image/jpeg``, ``image/png``, ``image/webp`` or
``application/octet-stream``), ``multipart/form-data`` with files under ``file`` or ``files``, and JSON
``{"images": ["<base64>", ...]}`` or ``{"image": "<base64>"}`` (a ``data:`` URL prefix is accepted). Options come from
the query string or the form / JSON fields: ``top_k``, ``explain`` (a method or ``default``), ``explorer``.
Standard library and Starlette only: no torch on the HTTP side.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from ..explain.command import METHOD_ALIASES, METHOD_NAMES
from .errors import RequestError

RAW_TYPES = ("image/jpeg", "image/png", "image/webp", "application/octet-stream")
FILE_FIELDS = ("file", "files")
MAX_IMAGES = 256
"""Images in one request at most."""
TRUE = ("1", "true", "yes", "on")


async def read_predict(request: Any) -> dict[str, Any]:
    """The worker payload of a ``POST /predict`` request (a Starlette ``Request``).

    Raises:
        RequestError: 400 for a body without images or bad options, 415 for another content type.
    """
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    fields: dict[str, Any] = dict(request.query_params)
    if content_type in RAW_TYPES:
        images = [await request.body()]
    elif content_type == "multipart/form-data":
        form = await request.form(max_files=MAX_IMAGES, max_fields=64)
        images = [await item.read() for name in FILE_FIELDS for item in form.getlist(name) if hasattr(item, "read")]
        fields.update({k: v for k, v in form.items() if isinstance(v, str) and k not in FILE_FIELDS})
        if not images:
            raise RequestError(400, "the form has no file: send the images as files in the field 'file' or 'files'")
    elif content_type == "application/json":
        body = json_body(await request.body())
        images = [decode_base64(text, i) for i, text in enumerate(json_images(body))]
        fields.update({k: v for k, v in body.items() if k in ("top_k", "explain", "explorer")})
    else:
        curl = " (curl --data-binary sends that: add -H 'Content-Type: image/jpeg')"
        hint = curl if "urlencoded" in content_type else ""
        raise RequestError(415, f"Content-Type {content_type or '(none)'} is not accepted{hint}: send image/jpeg, "
                                "image/png or image/webp bytes, multipart/form-data files, or JSON with base64 "
                                "images")  # fmt: skip
    if len(images) > MAX_IMAGES:
        raise RequestError(413, f"{len(images)} images in one request: send at most {MAX_IMAGES}")
    return {"kind": "predict", "images": images, **options(fields)}


def options(fields: dict[str, Any]) -> dict[str, Any]:
    """``top_k``, ``explain`` and ``explorer`` of a request, checked.

    Raises:
        RequestError: 400 for a ``top_k`` that is not a positive integer or an unknown method.
    """
    try:
        top_k = int(fields.get("top_k", 5))
        if top_k < 1:
            raise ValueError
    except (TypeError, ValueError):
        raise RequestError(400, f"top_k must be a positive integer, got {fields.get('top_k')!r}") from None
    explain = fields.get("explain") or None
    if explain is not None:
        explain = METHOD_ALIASES.get(str(explain), str(explain))
        if explain not in (*METHOD_NAMES, "default"):
            raise RequestError(400, f"explain: unknown method {explain!r}: choose default or one of "
                                    f"{', '.join(METHOD_NAMES)}")  # fmt: skip
    explorer = str(fields.get("explorer", "")).lower() in TRUE
    return {"top_k": top_k, "explain": explain, "explorer": explorer}


def json_body(data: bytes) -> dict[str, Any]:
    """The JSON object of a body.

    Raises:
        RequestError: 400 if it is not a JSON object.
    """
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError) as err:
        raise RequestError(400, f"the body is not JSON ({err})") from None
    if not isinstance(body, dict):
        raise RequestError(400, 'the JSON body must be an object: {"images": ["<base64>", ...]}')
    return body


def json_images(body: dict[str, Any]) -> list[Any]:
    """The base64 strings of a JSON body (``images`` or ``image``)."""
    images = body.get("images", [body["image"]] if "image" in body else None)
    if not isinstance(images, list) or not images:
        raise RequestError(400, 'the JSON body has no images: send {"images": ["<base64>", ...]} or {"image": ...}')
    return images


def decode_base64(text: Any, index: int) -> bytes:
    """The bytes of a base64 image (a ``data:...;base64,`` prefix is dropped).

    Raises:
        RequestError: 400 if it is not base64 text.
    """
    if not isinstance(text, str):
        raise RequestError(400, f"image {index} is not a base64 string")
    if text.startswith("data:"):
        text = text.partition(",")[2]
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(400, f"image {index} is not valid base64") from None


def predict_answer(payload: dict[str, Any], answer: dict[str, Any]) -> tuple[int, Any]:
    """The HTTP status and JSON of a worker's answer to ``payload``: one image's predictions, a list per image, or
    with ``explain`` an object per image; an error alone is its status, an error among several images its slot."""
    if "error" in answer:
        return int(answer.get("status", 500)), {"error": answer["error"]}
    results = answer["results"]
    if len(results) == 1 and "error" in results[0]:
        return int(results[0].get("status", 500)), {"error": results[0]["error"]}
    if payload.get("explain"):
        return 200, results
    items = [r if "error" in r else r["predictions"] for r in results]
    return 200, items[0] if len(items) == 1 else items


__all__ = ["options", "predict_answer", "read_predict"]
