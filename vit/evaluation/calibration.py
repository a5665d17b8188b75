"""Temperature scaling (Guo et al., "On Calibration of Modern Neural Networks", ICML 2017): one scalar ``T > 0``
divides the logits, ``p = softmax(z / T)``, fitted on held-out images by minimising the negative log-likelihood with
L-BFGS. The predicted class never changes; only the confidence does (``T > 1`` softens an over-confident model).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

from ..checkpoints.metadata import TEMPERATURE_KEY


def fit_temperature(logits: torch.Tensor, labels: torch.Tensor, max_iter: int = 100) -> float:
    """The temperature that minimises the mean NLL of ``softmax(logits / T)`` on ``labels``.

    Optimised over ``log T`` (so ``T`` stays positive) by :class:`torch.optim.LBFGS` with a strong-Wolfe line search,
    in float64, starting at ``T = 1``.

    Args:
        logits: ``(N, num_classes)`` logits of held-out images (never those the calibration is reported on).
        labels: ``(N,)`` their classes.
        max_iter: L-BFGS iterations.

    Raises:
        ValueError: For no images, or logits and labels of different lengths.
    """
    if logits.ndim != 2 or len(logits) != len(labels) or len(labels) == 0:
        raise ValueError(f"fit_temperature needs (N, C) logits and N labels, N > 0: got {tuple(logits.shape)}, "
                         f"{tuple(labels.shape)}")  # fmt: skip
    logits, labels = logits.detach().double(), labels.detach().long()
    log_t = torch.zeros((), dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([log_t], lr=1.0, max_iter=max_iter, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = F.cross_entropy(logits / log_t.exp(), labels)
        loss.backward()
        return loss

    optimizer.step(closure)
    return float(log_t.detach().exp())


def calibration_summary(logits: torch.Tensor, labels: torch.Tensor, temperature: float, n_bins: int) -> dict[str, Any]:
    """NLL, Brier, ECE and MCE of ``logits`` before and after dividing them by ``temperature``.

    Returns:
        ``{"before": {...}, "after": {...}}``, each with ``nll``, ``brier``, ``ece``, ``mce``, ``accuracy`` and
        ``reliability`` (:meth:`vit.evaluation.ClassificationMetrics.compute`'s).
    """
    from .metrics import ClassificationMetrics

    out = {}
    for name, scale in (("before", 1.0), ("after", temperature)):
        metrics = ClassificationMetrics(logits.shape[1], n_bins)
        metrics.update(logits / scale, labels)
        full = metrics.compute()
        out[name] = {key: full[key] for key in ("accuracy", "nll", "brier", "ece", "mce", "reliability")}
    return out


__all__ = ["TEMPERATURE_KEY", "calibration_summary", "fit_temperature"]


def calibrate_checkpoint(
    checkpoint: str | Path,
    out: str | Path,
    *,
    report_dir: str | Path | None = None,
    data_dir: str | None = None,
    batch_size: int = 256,
    progress: bool = True,
    command: str = "vit calibrate",
) -> dict[str, Any]:
    """Fit a checkpoint's temperature and write it into a new checkpoint file, with the report of what it changed.

    The checkpoint's run evaluates on its validation split (``vit test`` too: these data sets have no third split),
    so the split is cut in two interleaved halves: the even-numbered images fit the temperature, the odd-numbered
    ones report NLL, Brier, ECE and MCE before and after it. No number reported comes from an image that fitted it.

    Args:
        checkpoint: A checkpoint of ``vit fit`` (never changed).
        out: The new checkpoint: a copy of ``checkpoint`` whose inference description holds the temperature
            (:data:`~vit.checkpoints.metadata.TEMPERATURE_KEY`). It must not exist.
        report_dir: Where ``evaluation.json`` (run header, temperature, before / after) and ``reliability.png`` go;
            default a new ``calibrate-<time>`` folder in the checkpoint's run.
        data_dir: The run's data set folder when it is not where the run read it.
        batch_size: Images per forward pass.
        progress: Show the forward passes' progress.
        command: The command line, for the report's header.

    Returns:
        The report written to ``evaluation.json``.

    Raises:
        CheckpointError: For a file that is not a checkpoint of ``vit fit``.
        DataError: When the run's data set is not usable here.
    """
    from ..checkpoints import data_settings, load_checkpoint, read_checkpoint, rebuild_datamodule
    from ..checkpoints.metadata import METADATA_KEY
    from ..errors import DataError

    checkpoint, out = Path(checkpoint), Path(out)
    raw = read_checkpoint(checkpoint)
    loaded = load_checkpoint(checkpoint)  # the raw weights (no temperature applied), EMA's when the run kept one
    settings = data_settings(raw)
    datamodule = rebuild_datamodule(settings, num_workers=0, **({"data_dir": data_dir} if data_dir else {}))
    if datamodule is None:
        raise DataError(
            f"the data set of {checkpoint} (data.dataset {settings.get('dataset')!r}, data_dir "
            f"{settings.get('data_dir')!r}) is not usable here: pass --data.data_dir with its folder"
        )
    datamodule.setup("validate")
    logits, labels = split_logits(loaded.model, datamodule, batch_size, progress)
    fit, held_out = slice(0, None, 2), slice(1, None, 2)
    temperature = fit_temperature(logits[fit], labels[fit])
    n_bins = 15
    report = {
        "temperature": temperature,
        "fitted_on": {"split": "val", "images": "even-numbered", "count": len(labels[fit])},
        "reported_on": {"split": "val", "images": "odd-numbered", "count": len(labels[held_out])},
        "fit_nll": {
            "before": float(F.cross_entropy(logits[fit].double(), labels[fit])),
            "after": float(F.cross_entropy(logits[fit].double() / temperature, labels[fit])),
        },
        **calibration_summary(logits[held_out], labels[held_out], temperature, n_bins),
    }
    raw[METADATA_KEY] = {**raw[METADATA_KEY], TEMPERATURE_KEY: temperature}
    _save_new(raw, out)
    return _write_report(checkpoint, out, report, report_dir, command)


@torch.no_grad()
def split_logits(
    model: torch.nn.Module, datamodule: Any, batch_size: int, progress: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's logits (one view) and the labels of the data module's validation split, in its fixed order."""
    from tqdm import tqdm

    loader = datamodule.val_dataloader()
    logits, labels = [], []
    images_seen = 0
    total = len(loader.dataset) if hasattr(loader, "dataset") and hasattr(loader.dataset, "__len__") else None
    with tqdm(desc="logits of the val split", total=total, unit="img", disable=not progress, leave=False) as bar:
        for batch in loader:
            images, target = batch[0], batch[1]
            for start in range(0, len(images), batch_size):
                logits.append(model(datamodule.normalize(images[start : start + batch_size])).float())
            labels.append(target.long())
            images_seen += len(images)
            bar.update(len(images))
    if not images_seen:
        raise ValueError("the validation split is empty")
    return torch.cat(logits), torch.cat(labels)


def _save_new(checkpoint: dict[str, Any], out: Path) -> None:
    from ..atomic import atomic_write
    from ..errors import UsageError

    if out.exists():  # checked by the command before the work too; a file that appeared since is not overwritten
        raise UsageError(f"{out} exists: pass --out with a new file name (calibrate never overwrites a file)")
    with atomic_write(out) as f:
        torch.save(checkpoint, f)


def _write_report(
    checkpoint: Path, out: Path, report: dict[str, Any], report_dir: str | Path | None, command: str
) -> dict[str, Any]:
    import datetime
    import json

    from ..atomic import write_bytes, write_text
    from ..env import run_header
    from ..explain.render.images import png_bytes
    from ..runs import claim_folder
    from .figures import reliability_pair_figure

    if report_dir is None:
        run = checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else checkpoint.parent
        folder = claim_folder(run / f"calibrate-{datetime.datetime.now():%m%d-%H%M%S}")
    else:
        folder = Path(report_dir)
    header = run_header(command)
    result = {**header, "checkpoint": str(checkpoint), "calibrated_checkpoint": str(out), "calibration": report}
    write_text(folder / "evaluation.json", json.dumps(result, indent=2) + "\n")
    figure = reliability_pair_figure(report["before"], report["after"], report["temperature"])
    write_bytes(folder / "reliability.png", png_bytes(figure))
    return {**result, "folder": str(folder)}
