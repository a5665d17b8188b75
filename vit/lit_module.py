"""The image-classification training system: a LightningModule that receives a pure ``nn.Module``.

The recipe is DeiT's (Touvron et al., "Training data-efficient image transformers", ICML 2021) and Beyer et al.'s
"Better plain ViT baselines for ImageNet-1k" (2022): AdamW without weight decay on biases, norms, position
embeddings and prefix tokens; linear warm-up then cosine decay per optimiser step; label smoothing; Mixup/CutMix
(timm); optional layer-wise learning-rate decay (BEiT), weight EMA, DeiT's distillation (:mod:`vit.distillation`).
"""

from __future__ import annotations

import math
import warnings
from functools import partial
from typing import Any, Literal

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.trainer.states import TrainerFn
from timm.data import Mixup
from timm.data.mixup import mixup_target
from timm.loss import SoftTargetCrossEntropy
from timm.utils import ModelEmaV3
from torch import nn
from torch.nn import functional as F
from torch.optim.lr_scheduler import LambdaLR
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy

from .callbacks.augment_tail import BasicAugmentTail, check_basic_tail
from .callbacks.metadata import CheckpointMetadata
from .callbacks.patch_dropout import UnmaskedEpochs
from .callbacks.throughput import TrainingThroughput
from .callbacks.time_budget import TimeBudget, budget_seconds, steps_in_epoch
from .checkpoints.metadata import METADATA_KEY, TEMPERATURE_KEY
from .checkpoints.pretrained import load_into
from .checkpoints.state import check_checkpoint_fits
from .distillation import Distillation, check_distillation, make_distiller, student_logits
from .errors import ConfigError
from .evaluation.metrics import accuracy_metrics
from .models import VisionTransformer
from .network import build_network
from .normalize import check_normalized as _check_images
from .optim import OptimizerName, check_resumed_optimizer, fused_adamw, make_optimizer, param_groups
from .schedule import TimePlan, warmup_cosine
from .tta import TestTimeAugment, averaged_logits


class ImageClassifier(LightningModule):
    """Train, evaluate and predict with an image classifier (a :class:`vit.VisionTransformer` by default).

    ``save_hyperparameters`` records every argument, so ``ImageClassifier.load_from_checkpoint(path)`` rebuilds
    the module without further arguments, for a preset name as for a ``class_path`` model written by the CLI.
    A model passed as an ``nn.Module`` object from Python is not recorded: pass it again to ``load_from_checkpoint``.

    Args:
        model: A preset name of :func:`vit.create_model` (``vit.list_models()``), ``timm:NAME`` for a timm model
            trained from scratch (e.g. ``timm:resnet18``, a CNN teacher for ``teacher``; ``model_overrides`` are its
            keyword arguments), or a network: on the command line a :class:`vit.VisionTransformer` (``class_path`` in
            YAML); from Python any ``nn.Module`` with timm's interface (``reset_classifier``, ``no_weight_decay``,
            ``group_matcher``).
        num_classes: Number of classes; the CLI links it from ``data.num_classes``. ``None`` keeps the model's.
            A network whose class count differs gets a new head (``reset_classifier``).
        img_size: Input image size; the CLI links it from ``data.img_size``. For a preset it replaces the
            preset's ``img_size``; a network given as an object, or a ``timm:`` ViT, must already have this size (a
            ``timm:`` CNN takes any). ``None``: the model's.
        model_overrides: Extra :class:`vit.VisionTransformer` arguments applied to the preset, e.g.
            ``{drop_path_rate: 0.1, window_size: 4}``; for ``timm:NAME``, keyword arguments of its timm model.
        pretrained: Weights to start from, when fitting starts: a ``.ckpt`` or run folder of this module, a ``vit
            export`` folder, a timm ``.safetensors``/``.pth``/``.bin`` (:mod:`vit.checkpoints.pretrained`): the head
            of another class count replaced, the position grid resampled; one line says what was kept.
        lr: Peak learning rate; with ``lr_base_batch_size`` the rate for that global batch size.
        lr_base_batch_size: Global batch size ``lr`` is meant for. When set, ``lr`` and ``min_lr`` are scaled
            linearly to the run's global batch (``data.batch_size`` × devices × nodes × ``accumulate_grad_batches``),
            so adding GPUs keeps the recipe (Goyal et al., 2017). ``None`` uses ``lr`` as given.
        weight_decay: AdamW weight decay of the weight matrices; biases, norms, position embeddings and prefix
            tokens get none.
        optimizer: ``"adamw"``, or ``"muon"``: Muon for the blocks' weight matrices at the same learning rate and
            weight decay (its step scaled to AdamW's RMS), AdamW for the rest (:class:`vit.optim.MuonWithAdamW`).
        betas: AdamW betas.
        eps: AdamW epsilon.
        warmup_epochs: Linear warm-up length in epochs (may be fractional); ignored when ``warmup_steps > 0``.
        warmup_steps: Linear warm-up length in optimiser steps.
        min_lr: Learning rate at the end of the cosine decay.
        label_smoothing: Label smoothing of the training targets (also inside Mixup/CutMix targets).
        mixup_alpha: Mixup Beta(α, α) parameter; 0 disables Mixup.
        cutmix_alpha: CutMix Beta(α, α) parameter; 0 disables CutMix.
        mixup_prob: Probability of mixing a batch when Mixup or CutMix is enabled.
        mixup_switch_prob: Probability of CutMix instead of Mixup when both are enabled.
        layer_decay: Layer-wise learning-rate decay (e.g. 0.65-0.75 to fine-tune): block ``i`` of ``L`` gets
            ``lr * layer_decay ** (L - i)``; ``None`` disables it.
        ema_decay: Keep an exponential moving average of the weights with this decay (e.g. 0.9998), used for
            validation, test and prediction; ``None`` disables it.
        ema_warmup: Ramp the EMA decay up from 0 (timm's warm-up), useful for short runs.
        unmasked_epochs: Train the last this many epochs (of ``trainer.max_epochs``) on every patch, with the model's
            PatchDropout (``patch_drop_rate``) switched off: FLIP's unmasked tuning (Li et al., CVPR 2023), so the
            final weights are tuned to the full token grid that evaluation sees. 0 keeps PatchDropout throughout.
        basic_augment_epochs: Train the last this many epochs (counted as ``unmasked_epochs``) with
            ``data.augment basic`` instead of ``strong`` (:class:`~vit.callbacks.BasicAugmentTail`); 0: none.
        schedule: What the warm-up/cosine schedule and the unmasked tail are counted in. ``"steps"``: the length of
            training (``trainer.max_epochs`` or ``max_steps``). ``"time"``: ``trainer.max_time``; the run measures
            what a step and a validation cost, plans how many steps its budget buys (re-planned every few dozen steps,
            the same plan on every rank: :class:`~vit.callbacks.TimeBudget`), reaches ``min_lr`` as the budget ends,
            trains the last ``unmasked_epochs`` epochs' worth of steps on every patch and stops, validated and
            checkpointed. ``max_epochs`` / ``max_steps``, when set, cap the plan. The warm-up stays in steps.
        compile: Compile the network with ``torch.compile`` (parameter names are unchanged).
        test_time_augment: Views whose class probabilities are averaged in ``test`` and ``predict`` (validation
            during a fit always sees the image alone): ``"none"``; ``"flip"``, the image and its mirror image;
            ``"flip_translate"``, those two and each shifted diagonally by ±1/16 of the side (2 px at 32 px,
            reflect-padded as the training crop), six views with equal weights (airbench's mirror-and-translate
            views, which shift by 1 px and average logits). ``test`` then also logs ``test/acc_single_view``, the
            accuracy on the image alone.
        teacher: Frozen teacher to distil from (:mod:`vit.distillation`): a checkpoint or export folder,
            ``timm:NAME`` or ``torchvision:NAME``.
        distillation: ``"hard"`` (the teacher's class) or ``"soft"`` (its probabilities) with a teacher; it trains
            ``head_dist`` (``distilled: true``), else the class head.
        distillation_alpha: Weight of the distillation loss (the label loss: ``1 - alpha``).
        distillation_tau: Temperature of soft distillation.

    Raises:
        ConfigError: For an unknown preset or override, sizes that disagree, or a decay outside its range.
    """

    def __init__(
        self,
        model: str | VisionTransformer = "vit_tiny_patch4_32",
        num_classes: int | None = None,
        img_size: int | None = None,
        model_overrides: dict[str, Any] | None = None,
        pretrained: str | None = None,
        lr: float = 1e-3,
        lr_base_batch_size: int | None = None,
        weight_decay: float = 0.05,
        optimizer: OptimizerName = "adamw",
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        warmup_epochs: float = 0.0,
        warmup_steps: int = 0,
        min_lr: float = 1e-6,
        label_smoothing: float = 0.1,
        mixup_alpha: float = 0.0,
        cutmix_alpha: float = 0.0,
        mixup_prob: float = 1.0,
        mixup_switch_prob: float = 0.5,
        layer_decay: float | None = None,
        ema_decay: float | None = None,
        ema_warmup: bool = False,
        unmasked_epochs: int = 0,
        basic_augment_epochs: int = 0,
        schedule: Literal["steps", "time"] = "steps",
        compile: bool = False,
        test_time_augment: TestTimeAugment = "none",
        teacher: str | None = None,
        distillation: Distillation = "none",
        distillation_alpha: float = 0.5,
        distillation_tau: float = 1.0,
    ) -> None:
        super().__init__()
        with warnings.catch_warnings():  # Lightning warns about module arguments; we drop an object just below
            warnings.filterwarnings("ignore", message="Attribute 'model' is an instance of `nn.Module`")
            self.save_hyperparameters()
        if isinstance(self.hparams.get("model"), nn.Module):
            del self.hparams["model"]  # a Python object, not a hyper-parameter: the weights are in the state dict
        if layer_decay is not None and not 0.0 < layer_decay <= 1.0:
            raise ConfigError(f"model.layer_decay must be in (0, 1], got {layer_decay}")
        if ema_decay is not None and not 0.0 <= ema_decay < 1.0:
            raise ConfigError(f"model.ema_decay must be in [0, 1), got {ema_decay}")

        self.model = build_network(model, num_classes, img_size, model_overrides or {})
        self._patch_drop_rate = getattr(getattr(self.model, "patch_drop", None), "prob", 0.0)  # timm's PatchDropout
        check_basic_tail(basic_augment_epochs, None)  # a negative count; the data is checked with the trainer
        if unmasked_epochs < 0:
            raise ConfigError(f"model.unmasked_epochs must be >= 0, got {unmasked_epochs}")
        if unmasked_epochs and not self._patch_drop_rate:
            raise ConfigError(
                f"model.unmasked_epochs {unmasked_epochs} switches PatchDropout off at the end, but the model "
                "has none: set model.model_overrides.patch_drop_rate (e.g. 0.5) or model.unmasked_epochs 0"
            )
        self.num_classes = int(self.model.num_classes)
        self.distiller = check_distillation(teacher, distillation, distillation_alpha, distillation_tau)  # None
        self.time_plan: TimePlan | None = None  # schedule "time": made in configure_optimizers
        self.temperature: float | None = None  # `vit calibrate`'s, read with a checkpoint (on_load_checkpoint)
        self.model_ema = None
        if ema_decay is not None:
            self.model_ema = ModelEmaV3(self.model, decay=ema_decay, use_warmup=ema_warmup)
            self.model_ema.train()  # like every submodule; Lightning switches the whole system to eval to validate
            self.model_ema.requires_grad_(False)  # averaged, never optimised: DDP must not wait for its gradients
        if compile:
            self.model.compile()  # in place: state-dict keys stay those of the plain module

        self.criterion = nn.CrossEntropyLoss(label_smoothing=label_smoothing)
        self.mixup_criterion = SoftTargetCrossEntropy()
        self.mixup = None
        if (mixup_alpha > 0 or cutmix_alpha > 0) and mixup_prob > 0:
            self.mixup = Mixup(
                mixup_alpha=mixup_alpha,
                cutmix_alpha=cutmix_alpha,
                prob=mixup_prob,
                switch_prob=mixup_switch_prob,
                label_smoothing=label_smoothing,
                num_classes=self.num_classes,
            )
        self.train_metrics = accuracy_metrics(self.num_classes, "train")
        self.val_metrics = accuracy_metrics(self.num_classes, "val")
        self.test_metrics = accuracy_metrics(self.num_classes, "test")
        self.single_view_acc = None
        if test_time_augment != "none":
            self.single_view_acc = MulticlassAccuracy(self.num_classes, average="micro")
        # An input for Lightning's model summary, so it shows input/output sizes and real FLOPs instead of
        # "0 Total Flops" (not with compile: a batch of 1 would be compiled for nothing).
        if isinstance(self.model, VisionTransformer) and not compile:  # (timm's own patch embedding has no in_chans)
            patch_embed = self.model.patch_embed
            self.example_input_array = torch.zeros(1, patch_embed.in_chans, *patch_embed.img_size)

    @property
    def eval_model(self) -> nn.Module:
        """The network used for validation, test and prediction: the EMA weights when enabled."""
        return self.model_ema.module if self.model_ema is not None else self.model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Images ``(B, C, H, W)`` to logits ``(B, num_classes)`` with the trained (non-EMA) weights."""
        return self.model(x)

    def check_trainer(self, trainer: Trainer, datamodule: Any = None) -> None:
        """Refuse a training length this module cannot schedule, or data ``basic_augment_epochs`` cannot switch
        (``datamodule``, else the trainer's), and load the distillation teacher (the CLI calls it before a run writes
        anything).

        Raises:
            ConfigError: For endless training (``max_epochs`` -1 without ``max_steps``: the cosine schedule needs an
                end), ``unmasked_epochs`` or ``basic_augment_epochs`` without ``max_epochs`` to count back from,
                ``schedule="time"`` without ``trainer.max_time``, or ``basic_augment_epochs`` for data that is not
                augmented ``strong`` in batches (:func:`~vit.callbacks.augment_tail.check_basic_tail`).
        """
        if self.hparams.get("teacher") and self.distiller is None:  # a teacher that does not load stops it here
            self.distiller = make_distiller(self.hparams, self.model, self.num_classes)
        data = datamodule if datamodule is not None else getattr(trainer, "datamodule", None)
        check_basic_tail(self.hparams.get("basic_augment_epochs", 0), data)
        max_epochs, max_steps = trainer.max_epochs, trainer.max_steps
        endless = max_epochs in (None, -1)
        if self._time_schedule:
            if budget_seconds(trainer) is None:
                raise ConfigError(
                    "model.schedule time fits the run to trainer.max_time, which is not set: set trainer.max_time "
                    "(DD:HH:MM:SS, e.g. 00:00:57:00) or use model.schedule steps"
                )
            return
        if endless and max_steps == -1:
            raise ConfigError(
                f"the cosine schedule needs a length, but trainer.max_epochs is {max_epochs} and trainer.max_steps "
                "is -1: set either (trainer.max_time alone leaves max_epochs at -1)"
            )
        for name in ("unmasked_epochs", "basic_augment_epochs"):
            if self.hparams.get(name) and endless:
                raise ConfigError(
                    f"model.{name} {self.hparams[name]} counts back from trainer.max_epochs, which is {max_epochs}: "
                    "set trainer.max_epochs"
                )

    def _attached_trainer(self) -> Trainer | None:
        """The trainer running this module, or ``None`` outside one (Lightning's ``trainer`` property raises there)."""
        try:
            return self.trainer
        except RuntimeError:
            return None

    def setup(self, stage: str) -> None:
        """Load the ``pretrained`` weights when fitting starts (a resumed checkpoint overrides them afterwards)."""
        trainer = self._attached_trainer()
        if stage == "fit" and trainer is not None:
            self.check_trainer(trainer)
        if stage == "fit":
            load_into(self)  # once: `vit fit` loads the weights before the run starts (vit.checkpoints.pretrained)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Refuse a checkpoint of another architecture with one message listing its missing, unexpected and
        mis-shaped keys (:func:`~vit.checkpoints.check_checkpoint_fits`), for a resumed run as for
        ``load_from_checkpoint``, and a resumed fit's checkpoint of another optimiser; take the temperature of a
        calibrated checkpoint (``vit calibrate``)."""
        self.temperature = (checkpoint.get(METADATA_KEY) or {}).get(TEMPERATURE_KEY)
        trainer = self._attached_trainer()  # None outside a Trainer (load_from_checkpoint)
        if self.strict_loading:
            check_checkpoint_fits(self, checkpoint, source=trainer.ckpt_path if trainer is not None else None)
        if trainer is not None and trainer.state.fn == TrainerFn.FITTING:  # a resumed fit: the optimiser's state too
            check_resumed_optimizer(checkpoint, self.hparams.get("optimizer", "adamw"), trainer.ckpt_path)

    # ----------------------------------------------------------------------------------------------- training
    def configure_callbacks(self) -> list[Callback]:
        """The callbacks every run of this module has (Lightning adds them to the trainer's): ``train/img_per_sec``
        (:class:`~vit.callbacks.TrainingThroughput`), the checkpoint's description for inference
        (:class:`~vit.callbacks.CheckpointMetadata`), with ``schedule="time"`` the planner
        (:class:`~vit.callbacks.TimeBudget`), with ``unmasked_epochs`` the PatchDropout schedule
        (:class:`~vit.callbacks.UnmaskedEpochs`) and with ``basic_augment_epochs`` the augmentation's
        (:class:`~vit.callbacks.BasicAugmentTail`). A trainer that already has one of the first three (its own, or this
        module's from an earlier ``fit``) keeps it; the PatchDropout schedule is this module's own and always new."""
        trainer = self._attached_trainer()
        present = list(trainer.callbacks) if trainer is not None else []
        wanted = [TrainingThroughput, CheckpointMetadata] + ([TimeBudget] if self._time_schedule else [])
        callbacks: list[Callback] = [cb() for cb in wanted if not any(isinstance(p, cb) for p in present)]
        if self.hparams.unmasked_epochs:
            plan = (lambda: self.time_plan) if self._time_schedule else None
            callbacks.append(UnmaskedEpochs(self.hparams.unmasked_epochs, self._patch_drop_rate, plan=plan))
        if self.hparams.get("basic_augment_epochs"):
            plan = (lambda: self.time_plan) if self._time_schedule else None
            callbacks.append(BasicAugmentTail(self.hparams.basic_augment_epochs, plan, self._steps_per_epoch))
        return callbacks

    @property
    def _time_schedule(self) -> bool:
        return self.hparams.get("schedule", "steps") == "time"

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        # The rate this step uses; under layer decay the largest one (the head's).
        # Python numbers are logged as CPU tensors: Lightning would copy a number to the GPU, a synchronisation.
        lr = max(g["lr"] for g in self.trainer.optimizers[0].param_groups)
        self.log("train/lr", torch.tensor(lr), on_step=True)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        _check_images(x)
        if self.mixup is not None:
            if x.shape[0] % 2 == 0:
                x, target = self.mixup(x, y)
            else:  # timm's Mixup needs pairs; an odd last batch keeps its images, with the same soft targets
                target = mixup_target(y, self.num_classes, smoothing=self.hparams.label_smoothing)
            logits, dist_logits = student_logits(self.model(x))
            loss = self.mixup_criterion(logits, target)
            y = target.argmax(dim=-1)  # accuracy against the dominant label of each mixed image
        else:
            logits, dist_logits = student_logits(self.model(x))
            loss = self.criterion(logits, y)
        if self.distiller is not None:
            loss = self.distiller(x, dist_logits, loss)
            logits = (logits + dist_logits) / 2  # the prediction: both heads' mean (the class head's, without one)
        self.train_metrics.update(logits.detach(), y)
        # The step value is this rank's loss (a sync_dist here would all-reduce, a host sync, every step); the epoch
        # mean is reduced over ranks once, at the epoch's end. The progress bar reads its values on the host at every
        # refresh: the step loss is shown there on the CPU only (on a GPU it goes to the logger, every n steps).
        self.log("train/loss_step", loss, on_step=True, on_epoch=False, prog_bar=loss.device.type == "cpu")
        self.log("train/loss_epoch", loss, on_step=False, on_epoch=True, prog_bar=True, sync_dist=True)
        self._log_metrics(self.train_metrics, on_step=False, prog_bar=True)
        return loss

    def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        super().optimizer_step(*args, **kwargs)
        if self.model_ema is not None:
            # timm counts updates from 1 (the first one copies the weights); global_step is not yet incremented.
            self.model_ema.update(self.model, step=self.global_step + 1)

    # --------------------------------------------------------------------------------------------- evaluation
    def _test_time_logits(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits of the images alone, and the log of the mean class probabilities over ``test_time_augment``'s
        views (:func:`vit.tta.averaged_logits`), each view's logits divided by the checkpoint's ``temperature``."""
        scale = self.temperature or 1.0  # x / 1.0 is x, bit for bit
        return averaged_logits(lambda view: self.eval_model(view) / scale, x, self.hparams.test_time_augment)

    def _evaluate(self, batch: Any, stage: str, metrics: MetricCollection) -> torch.Tensor:
        x, y = batch
        if stage == "test":
            single_view, logits = self._test_time_logits(_check_images(x))
            if self.single_view_acc is not None:
                self.single_view_acc.update(single_view, y)
                self.log("test/acc_single_view", self.single_view_acc, on_epoch=True)
        else:
            logits = self.eval_model(_check_images(x))
        loss = F.cross_entropy(logits, y)
        metrics.update(logits, y)
        self.log(f"{stage}/loss", loss, on_epoch=True, prog_bar=stage == "val", sync_dist=True, batch_size=len(x))
        self._log_metrics(metrics, on_step=False, prog_bar=stage == "val")
        return logits

    def _log_metrics(self, metrics: MetricCollection, on_step: bool, prog_bar: bool) -> None:
        for name, metric in metrics.items(keep_base=False):
            self.log(name, metric, on_step=on_step, on_epoch=True, prog_bar=prog_bar and name.endswith("/acc"))

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "val", self.val_metrics)

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self._evaluate(batch, "test", self.test_metrics)

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        """Class probabilities ``(B, num_classes)`` for a batch of images (or ``(images, labels)`` pairs)."""
        x = batch[0] if isinstance(batch, (list, tuple)) else batch
        return self._test_time_logits(_check_images(x))[1].softmax(dim=-1)

    # ------------------------------------------------------------------------------------------- optimisation
    def global_batch_size(self) -> int:
        """Images per optimiser step over all processes: per-device batch × world size × gradient accumulation."""
        batch_size = getattr(self.trainer.datamodule, "batch_size", None)
        if batch_size is None:
            raise ValueError("lr_base_batch_size needs a data module with a batch_size attribute")
        return batch_size * self.trainer.world_size * self.trainer.accumulate_grad_batches

    def peak_lr(self) -> float:
        """``lr``, scaled linearly to the global batch size when ``lr_base_batch_size`` is set."""
        if self.hparams.lr_base_batch_size is None:
            return self.hparams.lr
        return self.hparams.lr * self.global_batch_size() / self.hparams.lr_base_batch_size

    def param_groups(self, lr: float) -> list[dict[str, Any]]:
        """AdamW parameter groups of the model (:func:`vit.optim.param_groups`) at peak learning rate ``lr``."""
        hp = self.hparams
        return param_groups(self.model, lr, weight_decay=hp.weight_decay, layer_decay=hp.layer_decay)

    def _steps_per_epoch(self) -> float:
        """Optimiser steps per epoch (``inf`` for an unsized loader), the training data loaded first if need be."""
        if self.trainer.train_dataloader is None:  # max_epochs -1: Lightning has not loaded it yet
            self.trainer.fit_loop.setup_data()
        return steps_in_epoch(self.trainer)

    def schedule_steps(self) -> tuple[int, int]:
        """``(warmup_steps, total_steps)`` in optimiser steps, from the trainer's length of training. With
        ``schedule="time"`` and no ``max_epochs`` / ``max_steps`` the total is a first guess (ten times the warm-up)
        until :class:`~vit.callbacks.TimeBudget` has timed a step."""
        trainer = self.trainer
        total = trainer.estimated_stepping_batches  # finite, except for schedule "time": check_trainer ran in setup
        warmup = self.hparams.warmup_steps
        if not warmup and self.hparams.warmup_epochs > 0:
            steps_per_epoch = self._steps_per_epoch()
            if math.isinf(steps_per_epoch):
                raise ConfigError("model.warmup_epochs needs a sized training dataloader; set model.warmup_steps")
            warmup = round(self.hparams.warmup_epochs * steps_per_epoch)
        if math.isinf(total):
            total = max(10 * warmup, 1000)
        total = int(total)
        return min(warmup, total), total

    def configure_optimizers(self) -> dict[str, Any]:
        hp = self.hparams
        lr = self.peak_lr()
        optimizer = make_optimizer(
            self.model,
            hp.optimizer,
            lr,
            weight_decay=hp.weight_decay,
            layer_decay=hp.layer_decay,
            betas=hp.betas,
            eps=hp.eps,
            fused=fused_adamw(self.device, self._trainer),
        )
        warmup, total = self.schedule_steps()
        if self._time_schedule:
            tail = hp.unmasked_epochs * self._steps_per_epoch() if hp.unmasked_epochs else 0
            self.time_plan = factor = TimePlan(
                warmup, total, hp.min_lr / hp.lr, tail_steps=int(tail), tail_cost=1.0 / (1.0 - self._patch_drop_rate)
            )
        else:
            factor = partial(warmup_cosine, warmup_steps=warmup, total_steps=total, min_ratio=hp.min_lr / hp.lr)
        scheduler = LambdaLR(optimizer, factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
