"""``vit export --ckpt_path CKPT --out DIR [--onnx] [--ema]``: a checkpoint as a timm / Hugging Face Hub folder.

``CKPT`` is a ``.ckpt`` of ``vit fit``, a run folder, or ``last`` / ``best`` of the newest run of ``--config``
(:mod:`vit.checkpoints.naming`): ``vit export --config quickstart --ckpt_path last --out my_vit``.

``DIR/model.safetensors`` holds the network's weights (timm's parameter names) and ``DIR/config.json`` timm's Hub
config: ``architecture``, ``num_classes``, ``num_features``, ``global_pool``, ``model_args`` and ``pretrained_cfg``
(input size, mean, std, interpolation, crop, ``label_names``). A model timm can express (global attention in every
block, a learned or no position table, the patchify stem) names a timm architecture, so
``timm.create_model("local-dir:DIR", pretrained=True)`` builds the same network; window, sliding and linear models
name this package's preset in timm's registry (``vit_pkg_...``), which timm opens the same way once
``vit.models.register_timm_models()`` has run. :func:`vit.load` opens both; both carry the full description under
``vit``. The folder can be uploaded to the Hub as it is.

``--onnx`` adds ``DIR/model.onnx`` (input ``images`` ``(batch, C, H, W)``, output ``logits``, dynamic batch axis),
exported through the explicit attention paths (the sliding window's CPU kernel is a custom operator ONNX cannot
hold) and checked with ONNX Runtime on the CPU against PyTorch before anything is kept. ``--ema`` exports the EMA
weights of a run trained with ``model.ema_decay``.

The folder is written under a temporary name beside ``DIR`` and renamed at the end: a failure leaves nothing. The
folder and its files get the permissions ``cp`` would give them under the user's umask.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import logging
import shutil
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .atomic import default_mode, write_bytes, write_text
from .checkpoints.naming import add_checkpoint_arguments, find_checkpoint
from .errors import ArgumentParser, UsageError

if TYPE_CHECKING:
    from torch import nn

    from .checkpoints import Loaded

ONNX_FILE = "model.onnx"
ONNX_TOLERANCE = 1e-4
"""Largest |logit difference| between ONNX Runtime and PyTorch accepted by the export's own check."""
TIMM_ARGS = (
    "img_size", "patch_size", "in_chans", "num_classes", "embed_dim", "depth", "num_heads", "mlp_ratio", "qkv_bias",
    "qk_norm", "class_token", "reg_tokens", "global_pool", "pos_embed", "no_embed_class", "init_values", "fc_norm",
)  # fmt: skip
"""Our arguments that mean the same in timm's ``VisionTransformer`` (with the same parameter names)."""
TIMM_ARCHITECTURES = {192: "vit_tiny_patch16_224", 384: "vit_small_patch16_224", 768: "vit_base_patch16_224"}


def timm_model_args(args: dict[str, Any]) -> dict[str, Any] | None:
    """timm ``VisionTransformer`` arguments that build the same network as ours, or ``None`` when timm has no such
    model (window, sliding or linear attention blocks, sin-cos positions, a convolutional stem, attention or sequence
    pooling, locality self-attention, shifted patch tokens, a distillation token)."""
    depth = args["depth"]
    local = bool(args["window_size"]) or bool(args.get("linear_attention"))
    if local and len(set(args["global_attn_indexes"])) < depth:
        return None
    if (
        args["pos_embed"] not in ("learn", "none")
        or args.get("conv_stem")
        or any(args.get(key) for key in ("locality_attention", "shifted_patches", "distilled"))
        or args["global_pool"] not in ("token", "avg")
    ):
        return None
    out = {key: args[key] for key in TIMM_ARGS}
    out["img_size"] = list(args["img_size"])
    out["reg_tokens"] = int(args["reg_tokens"])
    return out


def hub_config(loaded: Loaded) -> dict[str, Any]:
    """timm's Hub ``config.json`` for ``loaded``, with our full description under ``vit``."""
    from .models.presets import list_models
    from .models.timm_registry import timm_name

    meta = dict(loaded.meta)
    meta["ema"] = loaded.ema
    model = loaded.model
    timm_args = timm_model_args(meta["model_args"])
    cfg = {k: v for k, v in model.pretrained_cfg.items() if k != "eval_transform"}
    cfg["input_size"] = list(cfg["input_size"])
    cfg["mean"], cfg["std"] = list(cfg["mean"]), list(cfg["std"])
    cfg["first_conv"], cfg["classifier"] = "patch_embed.proj", "head"
    if timm_args is not None:
        architecture = TIMM_ARCHITECTURES.get(timm_args["embed_dim"], "vit_base_patch16_224")
        cfg["architecture"] = architecture
        cfg["tag"] = "vit"
    else:  # this package's model, by its name in timm's registry (vit.models.register_timm_models)
        preset = meta.get("model_name") if meta.get("model_name") in list_models() else "vit_tiny_patch4_32"
        architecture = timm_name(preset)  # any preset's entrypoint builds it: model_args give every argument
        cfg["architecture"] = architecture
    return {
        "architecture": architecture,
        "num_classes": int(model.num_classes),
        "num_features": int(model.num_features),
        "global_pool": model.global_pool,
        "model_args": timm_args if timm_args is not None else meta["model_args"],
        "pretrained_cfg": cfg,
        "vit": meta,
    }


def explicit_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with every attention on its explicit path (``fused_attn=False``): plain matrix products
    and a softmax that every exporter follows, the sliding window's tiled path instead of its CPU kernel."""
    model = copy.deepcopy(model).eval()
    for module in model.modules():
        if hasattr(module, "fused_attn"):
            module.fused_attn = False
    return model


def export_onnx(model: nn.Module, path: Path, batch_sizes: Sequence[int] = (1, 3, 7)) -> float:
    """Write ``model`` to ``path`` as ONNX with a dynamic batch axis and return the largest |Δlogit| of ONNX Runtime
    (CPU) against PyTorch over ``batch_sizes``.

    Raises:
        UsageError: If the ``export`` extra is missing, or ONNX Runtime's logits differ by more than
            :data:`ONNX_TOLERANCE`.
    """
    import torch

    try:
        import onnxruntime
    except ImportError:
        raise UsageError("--onnx needs onnx and onnxruntime: pip install 'vit[export]'") from None
    explicit = explicit_copy(model)
    channels, height, width = model.pretrained_cfg["input_size"]
    example = torch.randn(2, channels, height, width)
    large = sum(p.numel() * p.element_size() for p in model.parameters()) > 1_800_000_000
    # torch.export's exporter: it follows the tiled path's writes into slices of one output tensor, which the
    # TorchScript tracer gets wrong (measured |Δlogit| 3e-3 on a sliding model); its progress lines are dropped.
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        try:
            torch.onnx.export(
                explicit,
                (example,),
                str(path),
                input_names=["images"],
                output_names=["logits"],
                dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=65536)},),
                dynamo=True,
                verbose=False,
                external_data=large,  # one file unless protobuf's 2 GB limit needs the weights beside it
            )
        finally:
            logging.disable(logging.NOTSET)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    generator = torch.Generator().manual_seed(0)
    worst = 0.0
    for batch in batch_sizes:
        x = torch.randn(batch, channels, height, width, generator=generator)
        with torch.no_grad():
            expected = model(x)
        got = torch.from_numpy(session.run(["logits"], {"images": x.numpy()})[0])
        worst = max(worst, float((got - expected).abs().max()))
    if worst > ONNX_TOLERANCE:
        raise UsageError(f"ONNX Runtime's logits differ from PyTorch's by {worst:.2e} (> {ONNX_TOLERANCE:g})")
    return worst


def export(ckpt_path: str | Path, out: str | Path, onnx: bool = False, ema: bool = False) -> dict[str, Any]:
    """Write the export folder ``out`` of checkpoint ``ckpt_path`` (see the module docstring) and return its
    ``config.json`` content (plus ``onnx_max_abs_diff`` with ``onnx``).

    Raises:
        CheckpointError: If the checkpoint is a folder, missing, or not one of ``vit fit`` that describes its model.
        UsageError: If ``out`` is a file or a folder that is not empty, ``ema`` asks for absent EMA weights, or the
            ONNX check fails. Nothing is left behind.
    """
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--out {out} exists and is not an empty folder: give a new folder name")
    ckpt = Path(find_checkpoint(ckpt_path))  # a run folder: its last.ckpt; answered before torch loads
    from safetensors.torch import save

    from .checkpoints.loading import CONFIG_FILE, WEIGHTS_FILE, load_checkpoint

    loaded = load_checkpoint(ckpt, ema=bool(ema))
    config = hub_config(loaded)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    try:
        weights = {k: v.detach().contiguous() for k, v in loaded.model.state_dict().items()}
        write_bytes(tmp / WEIGHTS_FILE, save(weights, metadata={"format": "pt"}))
        write_text(tmp / CONFIG_FILE, json.dumps(config, indent=2) + "\n")
        if onnx:
            config["onnx_max_abs_diff"] = export_onnx(loaded.model, tmp / ONNX_FILE)
            for path in tmp.iterdir():  # what ONNX wrote itself: the permissions of `cp` under the umask
                path.chmod(default_mode())
        tmp.chmod(default_mode(folder=True))  # mkdtemp's 0700: the folder's permissions of `mkdir`
        if out.exists():
            out.rmdir()  # empty (checked above): the rename takes its place
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return config


def build_parser(prog: str = "vit export") -> argparse.ArgumentParser:
    """The options of ``vit export``."""
    parser = ArgumentParser(prog=prog, doc=__doc__)
    add_checkpoint_arguments(parser)
    parser.add_argument("--out", required=True, help="the folder to write (new, or empty)")
    parser.add_argument("--onnx", action="store_true", help="also write model.onnx, checked with ONNX Runtime")
    parser.add_argument("--ema", action="store_true", help="export the EMA weights (runs with model.ema_decay)")
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "vit export") -> int:
    """Run ``vit export`` on ``argv`` (default ``sys.argv[1:]``); returns 0.

    Raises:
        VitError: For bad input (the ``vit`` entry point prints one ``error:`` line and exits 2).
    """
    args = build_parser(prog).parse_args(argv)
    ckpt_path = find_checkpoint(args.ckpt_path, config=args.config, runs_dir=args.runs_dir)
    config = export(ckpt_path=ckpt_path, out=args.out, onnx=args.onnx, ema=args.ema)
    from .checkpoints.loading import CONFIG_FILE, WEIGHTS_FILE
    from .models.timm_registry import DEFAULT_PREFIX

    files = [WEIGHTS_FILE, CONFIG_FILE] + ([ONNX_FILE] if args.onnx else [])
    opener = f'vit.load("{args.out}") or timm.create_model("local-dir:{args.out}", pretrained=True)'
    if config["architecture"].startswith(DEFAULT_PREFIX):
        opener += " after vit.models.register_timm_models()"
    print(f"exported {ckpt_path} to {args.out}/ ({', '.join(files)}); open it with {opener}")
    if args.onnx:
        print(f"ONNX Runtime vs PyTorch at batch 1, 3, 7: max |dlogit| {config['onnx_max_abs_diff']:.2e}")
    return 0


if __name__ == "__main__":
    from .main import console

    console(["export"])
