"""Fine-tuning on a folder of your own: ``vit fit --model.pretrained`` from a checkpoint, a run folder, an export folder
or a timm weights file, into a model with other classes and another image size, end to end through the CLI; and the
one-line errors for a file that is no model or weights of another architecture."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from timm.layers import resample_abs_pos_embed

from vit.cli import cli_main
from vit.export import export

SHAPES = ("circle", "square", "triangle")


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


def draw_shapes(root: Path, per_class: int = 4, side: int = 20) -> Path:
    """``root/train/<shape>/`` and ``root/val/<shape>/``: coloured circles, squares and triangles on grey, as PNGs."""
    import numpy as np
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(0)
    for split, n in (("train", per_class), ("val", per_class // 2)):
        for shape in SHAPES:
            (root / split / shape).mkdir(parents=True)
            for i in range(n):
                image = Image.new("RGB", (side, side), tuple(int(c) for c in rng.integers(0, 90, 3)))
                colour = tuple(int(c) for c in rng.integers(120, 256, 3))
                box = [int(v) for v in (*rng.integers(1, 5, 2), *rng.integers(side - 5, side - 1, 2))]
                draw = ImageDraw.Draw(image)
                if shape == "circle":
                    draw.ellipse(box, fill=colour)
                elif shape == "square":
                    draw.rectangle(box, fill=colour)
                else:
                    draw.polygon([(box[0], box[3]), (box[2], box[3]), ((box[0] + box[2]) // 2, box[1])], fill=colour)
                image.save(root / split / shape / f"{i}.png")
    return root


def fit_args(tmp_path: Path, size: dict, pretrained: Path | str, *extra: str) -> list[str]:
    """A CPU fit of the tests' tiny ViT on the shapes at 24 px (a 6x6 grid of 4 px patches, the source's 8x8) with a
    learning rate of 1e-30: the weights after it are the weights it loaded."""
    return [
        "fit",
        "--seed_everything=0",
        "--trainer.accelerator=cpu",
        "--trainer.devices=1",
        "--trainer.max_steps=2",
        "--trainer.limit_val_batches=1",
        "--trainer.logger=false",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--runs_dir={tmp_path / 'runs'}",
        "--model.model=vit_tiny_patch4_32",
        f"--model.model_overrides={json.dumps(size)}",
        "--model.lr=1e-30",  # Adam's steps of 1e-30 leave every weight that is not 0 as it was
        "--model.min_lr=1e-30",
        f"--model.pretrained={pretrained}",
        "--data.dataset=imagefolder",
        f"--data.data_dir={tmp_path / 'shapes'}",
        "--data.img_size=24",
        "--data.batch_size=4",
        "--data.num_workers=0",
        *extra,
    ]


def make_source(kind: str, tmp_path: Path, trained_checkpoint: Path, tiny_vit) -> tuple[Path, dict]:
    """A file or folder of ``kind`` holding 10-class, 32 px weights, and those weights."""
    if kind == "timm":
        import timm
        from safetensors.torch import save_file

        model = timm.models.vision_transformer.VisionTransformer(**tiny_vit.config())  # 32 px, 10 classes
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        save_file(state, tmp_path / "timm_vit.safetensors")
        return tmp_path / "timm_vit.safetensors", state
    raw = torch.load(trained_checkpoint, weights_only=True)["state_dict"]
    state = {k.removeprefix("model."): v for k, v in raw.items() if k.startswith("model.")}
    if kind == "ckpt":
        return trained_checkpoint, state
    if kind == "run_folder":
        (tmp_path / "run" / "checkpoints").mkdir(parents=True)
        shutil.copy(trained_checkpoint, tmp_path / "run" / "checkpoints" / "last.ckpt")
        return tmp_path / "run", state
    export(trained_checkpoint, tmp_path / "exported")
    return tmp_path / "exported", state


@pytest.mark.parametrize("kind", ["ckpt", "run_folder", "export", "timm"])
def test_fit_on_your_own_folder_from_a_model_you_have(kind, tmp_path, trained_checkpoint, tiny_vit, capsys):
    source, before = make_source(kind, tmp_path, trained_checkpoint, tiny_vit)
    draw_shapes(tmp_path / "shapes")
    cli = cli_main(fit_args(tmp_path, tiny_vit.size, source))
    after = cli.model.model.state_dict()
    blocks = [k for k in after if k.startswith(("blocks.", "patch_embed.", "norm.", "cls_token"))]
    assert len(blocks) > 20
    for key in blocks:  # kept as they were (a bias of 0 moved by 1e-30 per step)
        torch.testing.assert_close(after[key], before[key], rtol=0, atol=1e-25, msg=key)
    assert after["head.weight"].shape == (3, 32) and before["head.weight"].shape == (10, 32)  # a new head
    assert before["pos_embed"].shape == (1, 1 + 8 * 8, 32) and after["pos_embed"].shape == (1, 1 + 6 * 6, 32)
    expected = resample_abs_pos_embed(before["pos_embed"], new_size=[6, 6], num_prefix_tokens=1)  # timm's own
    torch.testing.assert_close(after["pos_embed"], expected)
    assert cli.trainer.global_step == 2 and (cli.run_dir / "checkpoints" / "last.ckpt").is_file()
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("--model.pretrained ")]
    assert len(lines) == 1, lines
    assert f"kept {len(after) - 3} of {len(after)} tensors" in lines[0]  # all but the head's two and pos_embed
    assert "replaced the head (10 classes -> 3 classes" in lines[0] and "pos_embed from 8x8 to 6x6 patches" in lines[0]


def run_folders(tmp_path: Path) -> list[Path]:
    return [p for p in (tmp_path / "runs").rglob("*") if p.is_dir()] if (tmp_path / "runs").exists() else []


@pytest.mark.parametrize(
    ("make", "overrides", "message"),
    [
        (lambda p, ckpt: (p / "notes.txt").write_text("not weights") and p / "notes.txt", {}, "is not a PyTorch"),
        (lambda p, ckpt: (p / "empty").mkdir() or p / "empty", {}, "holding neither model.safetensors"),
        (lambda p, ckpt: torch.save({"weight": torch.ones(2)}, p / "w.pth") or p / "w.pth", {}, "holds no ViT weights"),
        (lambda p, ckpt: ckpt, {"embed_dim": 64}, "holds a ViT of embed_dim 32, depth 2 where the config's model has"),
        (lambda p, ckpt: ckpt, {"patch_size": 2}, "patch_size 4x4 where the config's model has patch_size 2x2"),
    ],
    ids=["text_file", "empty_folder", "not_a_vit", "other_width", "other_patch"],
)
def test_what_is_no_model_for_this_config_is_one_line(make, overrides, message, tmp_path, trained_checkpoint, capsys):
    draw_shapes(tmp_path / "shapes", per_class=2)
    source = make(tmp_path, trained_checkpoint)
    size = {"embed_dim": 32, "depth": 2, "num_heads": 2, **overrides}
    if "embed_dim" in overrides:
        size["depth"] = 3  # two differences named
    with pytest.raises(SystemExit) as exit_info:
        cli_main(fit_args(tmp_path, size, source))
    assert exit_info.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert str(source) in err[0]
    assert run_folders(tmp_path) == []  # nothing written: the run's folder is not made
