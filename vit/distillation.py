"""Knowledge distillation from a frozen teacher, DeiT's way.

Touvron et al., "Training data-efficient image transformers & distillation through attention" (DeiT, ICML 2021),
Sec. 5. The student's loss mixes the label loss of its class head with a distillation loss of its distillation head
(the class head itself when the model has no distillation token), ``(1 - alpha) · label_loss + alpha · distill``:

* **soft**: ``tau² · KL(softmax(teacher / tau) ‖ softmax(student / tau))``, summed and divided by the number of logits
  (DeiT's ``DistillationLoss``, as written there);
* **hard**: cross-entropy of the student against the teacher's arg-max class (DeiT's best: it beat soft distillation
  on ImageNet, and a CNN teacher lifted a ViT student most).

The teacher sees the same (augmented, mixed) images as the student, under ``torch.no_grad`` and in eval mode; it is
any checkpoint :func:`vit.load` reads, a checkpoint of a CNN that ``vit fit`` trained (``model.model timm:NAME``), or a
timm (``timm:NAME``) or torchvision (``torchvision:NAME``) model with its pretrained weights, which must predict the
student's classes. It is never part of the student's state dict or checkpoints.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from .errors import ConfigError, IncompatibleCheckpointError
from .network import load_network

Distillation = Literal["none", "soft", "hard"]


def distillation_loss(student: torch.Tensor, teacher: torch.Tensor, kind: Distillation, tau: float = 1.0):
    """DeiT's distillation term of student logits ``(B, classes)`` against teacher logits (module docstring)."""
    if kind == "soft":
        kl = F.kl_div(
            F.log_softmax(student / tau, dim=1), F.log_softmax(teacher / tau, dim=1), reduction="sum", log_target=True
        )
        return kl * tau * tau / student.numel()
    return F.cross_entropy(student, teacher.argmax(dim=1))


def load_teacher(spec: str, pretrained: bool = True) -> nn.Module:
    """The teacher named by ``spec``, frozen and in eval mode: a path :func:`vit.load` reads (a ``.ckpt`` of ``vit
    fit`` or an export folder) or a ``.ckpt`` of a ``timm:NAME`` run of ``vit fit``; else ``timm:NAME`` or
    ``torchvision:NAME`` (a bare name: timm's), with pretrained weights.

    Raises:
        ConfigError: Naming ``model.teacher`` when the path or model does not load.
    """
    try:
        if Path(spec).exists():
            teacher = _load_file(spec)
        elif spec.startswith("torchvision:"):
            import torchvision

            weights = "DEFAULT" if pretrained else None
            teacher = torchvision.models.get_model(spec.removeprefix("torchvision:"), weights=weights)
        else:
            import timm

            teacher = timm.create_model(spec.removeprefix("timm:"), pretrained=pretrained)
    except Exception as err:  # noqa: BLE001 - every way a teacher fails to load is one configuration error
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(
            f"model.teacher {spec!r} does not load ({first}): give a checkpoint of `vit fit`, an export folder, "
            "timm:NAME or torchvision:NAME"
        ) from None
    return teacher.eval().requires_grad_(False)


def _load_file(path: str) -> nn.Module:
    """A checkpoint or export folder :func:`vit.load` reads, or a checkpoint of a ``timm:NAME`` run of ``vit fit``."""
    from .checkpoints.loading import load

    try:
        return load(path)
    except IncompatibleCheckpointError as error:
        if Path(path).is_dir():
            raise
        try:
            return load_network(path)
        except IncompatibleCheckpointError:
            raise error from None  # neither: what vit.load says of it


class Distiller:
    """The student's loss with a teacher (module docstring); the teacher is kept out of any module's state dict.

    Args:
        teacher: The frozen teacher (:func:`load_teacher`).
        kind: ``"soft"`` or ``"hard"``.
        alpha: Weight of the distillation term, in ``[0, 1]``.
        tau: Temperature of soft distillation.
        num_classes: The student's class count, which the teacher's logits must have.
    """

    def __init__(self, teacher: nn.Module, kind: Distillation, alpha: float, tau: float, num_classes: int) -> None:
        self.teacher, self.kind, self.alpha, self.tau, self.num_classes = teacher, kind, alpha, tau, num_classes

    def __call__(self, images: torch.Tensor, student: torch.Tensor, label_loss: torch.Tensor) -> torch.Tensor:
        """``(1 - alpha) · label_loss + alpha · distillation_loss(student, teacher(images))``.

        Raises:
            ConfigError: If the teacher predicts another number of classes than the student.
        """
        param = next(self.teacher.parameters(), None)
        if param is not None and param.device != images.device:
            self.teacher.to(images.device)
        with torch.no_grad():
            teacher = self.teacher.eval()(images)
        if teacher.shape[-1] != self.num_classes:
            raise ConfigError(
                f"model.teacher predicts {teacher.shape[-1]} classes, the student {self.num_classes}: give a teacher "
                "trained on the same classes"
            )
        distill = distillation_loss(student, teacher.float(), self.kind, self.tau)
        return (1 - self.alpha) * label_loss + self.alpha * distill


def check_distillation(teacher: str | None, kind: Distillation, alpha: float, tau: float) -> None:
    """Check :class:`~vit.ImageClassifier`'s distillation arguments (the teacher is loaded later, by
    :func:`make_distiller`); returns ``None``, the module's distiller until then.

    Raises:
        ConfigError: For a teacher without a distillation type or the reverse, ``alpha`` outside ``[0, 1]`` or a
            ``tau`` that is not positive.
    """
    if kind not in ("none", "soft", "hard"):
        raise ConfigError(f"model.distillation must be 'none', 'soft' or 'hard', got {kind!r}")
    if (teacher is None) != (kind == "none"):
        raise ConfigError(
            "model.teacher and model.distillation go together: set both (e.g. --model.distillation hard) or neither"
        )
    if not 0.0 <= alpha <= 1.0:
        raise ConfigError(f"model.distillation_alpha must be in [0, 1], got {alpha}")
    if tau <= 0:
        raise ConfigError(f"model.distillation_tau must be positive, got {tau}")


def make_distiller(hparams: Mapping[str, Any], model: nn.Module, num_classes: int) -> Distiller:
    """The :class:`Distiller` of :class:`~vit.ImageClassifier`'s hyper-parameters (``teacher``, ``distillation``,
    ``distillation_alpha``, ``distillation_tau``), its teacher loaded; a model with a distillation token is switched to
    return both heads' logits while training.

    Raises:
        ConfigError: If the arguments are inconsistent (:func:`check_distillation`) or the teacher does not load.
    """
    teacher, kind = hparams["teacher"], hparams["distillation"]
    alpha, tau = hparams["distillation_alpha"], hparams["distillation_tau"]
    check_distillation(teacher, kind, alpha, tau)
    if getattr(model, "dist_token", None) is not None:
        model.set_distilled_training(True)
    return Distiller(load_teacher(teacher), kind, alpha, tau, num_classes)


def student_logits(outputs: torch.Tensor | tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(class logits, distillation logits)`` of a training forward pass: the two heads of a distilled model (the
    pair it returns while training), else the class logits twice."""
    return outputs if isinstance(outputs, tuple) else (outputs, outputs)
