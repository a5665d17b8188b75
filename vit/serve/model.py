""":class:`ServeModel`: the predictor that every server of ``vit serve`` wraps (LitServe here, Ray Serve beside it).

It is :class:`vit.Predictor` (the checkpoint or export folder, the eval transform of training, the temperature of
``vit calibrate``) with what a server adds: image bytes decoded under a pixel limit read from the header before any
decoding (:data:`vit.data.datasets.MAX_IMAGE_PIXELS`), top-k answers, an explanation map per image on request
(:func:`vit.explain.explain`, coloured by :mod:`vit.explain.colors`), and a second backend, ONNX Runtime on the
``model.onnx`` of ``vit export --onnx``. Every bad input is a :class:`~vit.serve.errors.RequestError` with its status.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from ..data.datasets import MAX_IMAGE_PIXELS, ImageTooLargeError, decode_rgb
from .errors import RequestError

Backend = Literal["torch", "onnx"]
FORMATS = {"JPEG": "image/jpeg", "PNG": "image/png", "WEBP": "image/webp"}
"""The image formats accepted (PIL's name -> MIME type); every other is refused with 415 before it is decoded."""
OVERLAY_SIZE = 224
"""Overlays of smaller inputs are drawn at this size (the map is smooth over the upscaled image)."""


def model_name(source: str | Path) -> str:
    """The name of a model in URLs (``/v2/models/{name}``): the run folder of a run's checkpoint, else the folder or
    file stem (``runs/quickstart/<run>/checkpoints/last.ckpt`` -> ``<run>``, ``exported/`` -> ``exported``)."""
    path = Path(source)
    if path.parent.name == "checkpoints" and path.is_file():
        path = path.parent.parent
    name = path.name if path.is_dir() else path.stem
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "model"


class ServeModel:
    """A checkpoint or export folder ready to answer requests.

    Args:
        source: A ``.ckpt`` of ``vit fit`` or a folder of ``vit export`` (with ``model.onnx`` for ``backend="onnx"``).
        backend: ``"torch"``, or ``"onnx"`` for ONNX Runtime on the CPU.
        threads: Intra-op threads of PyTorch or ONNX Runtime; ``None``: leave the library's choice.
        max_image_pixels: Refuse images with more pixels (413), read from their header; ``None``: no limit.
        device: Where PyTorch runs the model.

    Raises:
        UsageError: If ``backend="onnx"`` has no ``model.onnx`` to run or ONNX Runtime is missing.
        VitError: If the checkpoint cannot be read (:class:`vit.Predictor`'s errors).
    """

    def __init__(
        self,
        source: str | Path,
        backend: Backend = "torch",
        threads: int | None = None,
        max_image_pixels: int | None = MAX_IMAGE_PIXELS,
        device: str = "cpu",
    ) -> None:
        from ..inference import Predictor

        if threads:
            torch.set_num_threads(threads)
        self.source = Path(source)
        self.backend = backend
        self.max_image_pixels = max_image_pixels
        self.session = onnx_session(self.source, threads) if backend == "onnx" else None
        self.predictor = Predictor(source, device=device, max_image_pixels=None)  # the limit is decode's
        self.model = self.predictor.model.eval()
        self.name = model_name(source)
        self.class_names: list[str] = self.predictor.class_names
        self.temperature = self.predictor.temperature
        self.input_size = tuple(int(v) for v in self.predictor.cfg["input_size"])

    def info(self) -> dict[str, Any]:
        """The model's description: name, classes, input size, normalisation, temperature, backend, versions."""
        import vit

        cfg = self.predictor.cfg
        return {
            "model": self.name,
            "source": str(self.source),
            "classes": list(self.class_names),
            "num_classes": len(self.class_names),
            "input_size": list(self.input_size),
            "mean": [float(v) for v in cfg["mean"]],
            "std": [float(v) for v in cfg["std"]],
            "eval_transform": self.predictor.meta.get("eval_transform"),
            "temperature": self.temperature,
            "backend": self.backend,
            "max_image_pixels": self.max_image_pixels,
            "formats": sorted(FORMATS.values()),
            "vit_version": vit.__version__,
        }

    # ----------------------------------------------------------------------------------------------- decoding
    def decode(self, data: bytes, content_type: str | None = None) -> np.ndarray:
        """A uint8 ``(H, W, 3)`` RGB array of an encoded JPEG, PNG or WebP image (``content_type`` is not trusted:
        the header decides).

        Raises:
            RequestError: 400 for empty, truncated or non-image data, 413 above the pixel limit, 415 for another
                image format.
        """
        if not data:
            raise RequestError(400, "the image is empty: send the bytes of a JPEG, PNG or WebP file")
        kind = header_format(data, self.max_image_pixels)
        if kind not in FORMATS:
            raise RequestError(415, f"{kind} images are not accepted: send JPEG, PNG or WebP")
        if kind == "JPEG" and data.rfind(b"\xff\xd9") < data.rfind(b"\xff\xda"):
            raise RequestError(400, "the JPEG data is truncated (no end-of-image marker after its last scan)")
        try:
            return decode_rgb(data, "in the request", self.max_image_pixels)
        except ImageTooLargeError as err:
            raise RequestError(413, str(err)) from None
        except OSError as err:
            raise RequestError(400, str(err)) from None

    # --------------------------------------------------------------------------------------------- predicting
    def pixels(self, images: Sequence[np.ndarray]) -> torch.Tensor:
        """uint8 ``(B, C, H, W)`` model-sized images, through the eval transform of training."""
        return torch.stack([self.predictor.transform(image=image)["image"] for image in images])

    @torch.no_grad()
    def logits(self, inputs: torch.Tensor | np.ndarray) -> np.ndarray:
        """Calibrated logits ``z / T`` (float32 ``(B, classes)``) of normalised ``(B, C, H, W)`` float inputs."""
        inputs = torch.as_tensor(inputs, dtype=torch.float32)
        if self.session is not None:
            logits = self.session.run(["logits"], {"images": inputs.numpy()})[0]
            return (logits / self.temperature if self.temperature else logits).astype(np.float32)
        return self.model(inputs.to(self.predictor.device)).float().cpu().numpy()

    def check_inputs(self, inputs: np.ndarray) -> None:
        """Refuse (400) preprocessed inputs that are not ``(N, C, H, W)`` of the model's input size."""
        if inputs.ndim != 4 or tuple(inputs.shape[1:]) != self.input_size or not len(inputs):
            raise RequestError(400, f"the input tensor has shape {list(inputs.shape)}: the model takes "
                                    f"[N, {', '.join(map(str, self.input_size))}], normalised")  # fmt: skip

    def probabilities(self, images: Sequence[np.ndarray]) -> np.ndarray:
        """Class probabilities ``(B, classes)`` of decoded images."""
        from ..normalize import normalize

        cfg = self.predictor.cfg
        return softmax(self.logits(normalize(self.pixels(images), cfg["mean"], cfg["std"])))

    def top(self, probs: np.ndarray, top_k: int) -> list[list[dict[str, Any]]]:
        """The ``top_k`` classes of each row of ``probs``: ``[{"label", "score"}, ...]``, most likely first."""
        k = max(1, min(int(top_k), probs.shape[1]))
        order = np.argsort(-probs, axis=1, kind="stable")[:, :k]
        names = self.class_names
        return [[{"label": names[i], "score": float(p[i])} for i in row] for p, row in zip(probs, order, strict=True)]

    def predict(
        self, images: list[np.ndarray], top_k: int = 5, explain: str | None = None, explorer: bool = False
    ) -> list[dict[str, Any]]:
        """One answer per decoded image: ``{"predictions": [{"label", "score"}, ...top_k]}``, and with ``explain``
        (a method of :data:`vit.explain.METHODS` or ``"default"``) its ``"explanation"`` (see :meth:`explain`).

        Raises:
            RequestError: 400 for an unknown method or one that does not apply to the model.
        """
        if not images:
            return []
        answers = [{"predictions": p} for p in self.top(self.probabilities(images), top_k)]
        if explain:
            for answer, explanation in zip(answers, self.explain(images, explain, explorer), strict=True):
                answer["explanation"] = explanation
        return answers

    # ------------------------------------------------------------------------------------------- explaining
    def method(self, name: str) -> tuple[str, dict[str, dict[str, float]]]:
        """The method ``name`` means and its options: ``"default"`` is the one ``vit explain --tune`` stored for the
        checkpoint, else AttnLRP; a named method takes the options stored for it."""
        from ..explain.choice import StaleChoice, read_choice
        from ..explain.methods import DEFAULT_METHOD, get_method

        try:
            choice = read_choice(self.source) if self.source.is_file() else None
        except StaleChoice:
            choice = None
        if name == "default":
            return (choice.method, choice.method_options()) if choice else (DEFAULT_METHOD, {})
        try:
            resolved = get_method(name, self.model).name
        except ValueError as err:
            raise RequestError(400, f"explain: {err}") from None
        return resolved, choice.method_options([resolved]) if choice else {}

    def explain(self, images: Sequence[np.ndarray], name: str, explorer: bool = False) -> list[dict[str, Any]]:
        """Per image ``{"method", "signed", "grid" (rows x cols floats), "overlay" (a PNG data URL of the map over the
        image, :mod:`vit.explain.colors`' colours)}``, and with ``explorer`` the attention explorer's payload."""
        from ..explain import explain, is_signed
        from ..explain.methods import require_extras

        method, options = self.method(name)
        try:
            require_extras(method)
        except ImportError as err:
            raise RequestError(400, f"explain {method}: {str(err).splitlines()[0]}") from None
        cfg = self.predictor.cfg
        pixels = self.pixels(images)
        result = explain(self.model, pixels, [method], mean=cfg["mean"], std=cfg["std"], statistics=False,
                         block=None, options=options, class_names=self.class_names)  # fmt: skip
        maps, signed = result.maps[method], is_signed(method)
        out = []
        for i in range(len(images)):
            entry = {"method": method, "signed": signed, "grid": maps[i].tolist(),
                     "overlay": overlay_url(pixels[i], maps[i], signed)}  # fmt: skip
            if explorer:
                entry["explorer"] = self.explorer(pixels[i : i + 1], method, maps[i : i + 1])
            out.append(entry)
        return out

    def explorer(self, pixels: torch.Tensor, method: str, grid: torch.Tensor) -> dict[str, Any]:
        """The attention explorer's payload (:func:`vit.explain.explorer_payload`) of one image and its map."""
        from ..explain.render.explorer import explorer_payload

        cfg = self.predictor.cfg
        return explorer_payload(self.model, pixels, mean=cfg["mean"], std=cfg["std"], class_names=self.class_names,
                                names=["image"], maps={method: grid}, title=f"{self.name}: attention")  # fmt: skip


def header_format(data: bytes, max_pixels: int | None) -> str:
    """The image format named by ``data``'s header (PIL's name), read without decoding the pixels.

    Raises:
        RequestError: 400 if no image format is recognised, 413 if the header claims far too many pixels for PIL.
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                return str(image.format)
    except Image.DecompressionBombError as err:
        raise RequestError(413, f"the image is above the limit of {max_pixels or 0:,} pixels ({err})") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError):
        raise RequestError(400, "the data is not an image: send the bytes of a JPEG, PNG or WebP file") from None


def overlay_url(pixels: torch.Tensor, grid: torch.Tensor, signed: bool) -> str:
    """A ``data:image/png;base64,...`` URL of ``grid`` over the uint8 ``(C, H, W)`` image ``pixels``, at least
    :data:`OVERLAY_SIZE` pixels high."""
    from PIL import Image

    from ..explain.render.images import data_uri, to_uint8_image
    from ..explain.render.overlay import overlay_heatmap

    image = to_uint8_image(pixels)
    height, width = image.shape[:2]
    if height < OVERLAY_SIZE:
        scale = OVERLAY_SIZE / height
        size = (round(width * scale), OVERLAY_SIZE)
        image = np.asarray(Image.fromarray(image).resize(size, Image.Resampling.BICUBIC))
    return data_uri(overlay_heatmap(image, grid, signed=signed))


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float64 (the scores of the answers)."""
    from scipy.special import softmax as rows

    return rows(logits.astype(np.float64), axis=1)


def onnx_session(source: Path, threads: int | None) -> Any:
    """An ONNX Runtime CPU session of ``source/model.onnx`` with ``threads`` intra-op threads (default: the cores this
    process may use, :func:`vit.env.available_cores`).

    Raises:
        UsageError: If ``source`` has no ``model.onnx`` or ONNX Runtime is missing.
    """
    from ..env import available_cores
    from ..export import ONNX_FILE
    from .errors import check_onnx_backend

    check_onnx_backend(source)
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads or available_cores()
    options.inter_op_num_threads = 1
    # ONNX Runtime's threads spin for a while after each run by default: on a machine whose cores the server's HTTP
    # process shares, they took them from it (ViT-S/16 at batch 1 on two cores: 22-25 ms of the server's own time per
    # request with spinning, 4.8 ms without; the forward pass itself 3-6 ms slower).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return onnxruntime.InferenceSession(str(source / ONNX_FILE), options, providers=["CPUExecutionProvider"])


__all__ = ["FORMATS", "ServeModel", "model_name"]
