"""Draw where the MAP head's latent query looks: its cross-attention over the patches of a real photo.

    python scripts/figure_map_head.py [--data.data_dir DIR] [--steps 300] [--out docs/figures/map_head_attention.png]

With ``--data.data_dir`` (CIFAR-style JPEG folders, ``train/<class>/*.jpg``) a tiny ViT with a MAP head
(``global_pool="map"``) is first trained for ``--steps`` steps on them; without it the model stays untrained.
The photo is the first test JPEG of the folder (``test/<class>/*.jpg``, else ``train/``), or scikit-learn's
sample photo ``china.jpg`` resized to 32x32 when no folder is given. The figure shows, per head, the latent
query's attention over the 8x8 patch grid (``Explanation.pool_attention``) and the rollout read at the latent.
"""

from __future__ import annotations

from io import BytesIO
from pathlib import Path

import numpy as np
import torch
from PIL import Image

import vit
from vit.atomic import write_bytes
from vit.errors import ArgumentParser, fail
from vit.explain import explain_images, render_panel

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.247, 0.243, 0.261)


def load_folder(root: Path, split: str, limit: int | None = None) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """uint8 images ``(N, 3, 32, 32)``, labels and class names of ``root/split/<class>/*.jpg``."""
    classes = sorted(p.name for p in (root / split).iterdir() if p.is_dir())
    images, labels = [], []
    for label, name in enumerate(classes):
        for path in sorted((root / split / name).glob("*.jpg"))[:limit]:
            with Image.open(path) as image:
                images.append(np.asarray(image.convert("RGB").resize((32, 32), Image.BICUBIC)))
            labels.append(label)
    return torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).contiguous(), torch.tensor(labels), classes


def train(model: vit.VisionTransformer, images: torch.Tensor, labels: torch.Tensor, steps: int) -> float:
    """A few AdamW steps on random flips of the images; returns the last batch's loss."""
    generator = torch.Generator().manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.05)
    mean, std = torch.tensor(MEAN)[:, None, None], torch.tensor(STD)[:, None, None]
    model.train()
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        index = torch.randint(0, len(images), (64,), generator=generator)
        x = (images[index].float() / 255 - mean) / std
        flip = torch.rand(64, generator=generator) < 0.5
        x = torch.where(flip[:, None, None, None], x.flip(-1), x)
        loss = torch.nn.functional.cross_entropy(model(x), labels[index])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return float(loss.detach())


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="figure_map_head.py", doc=__doc__, renamed={"--data-dir": "--data.data_dir"})
    parser.add_argument(
        "--data.data_dir", dest="data_dir", type=Path, default=None, help="CIFAR-style JPEG folders (train/, test/)"
    )
    parser.add_argument("--steps", type=int, default=300, help="training steps with --data.data_dir (0: untrained)")
    parser.add_argument("--out", type=Path, default=Path("docs/figures/map_head_attention.png"))
    args = parser.parse_args(argv)
    if args.steps < 0:
        fail(f"--steps must be >= 0, got {args.steps}")
    if args.data_dir is not None and not (args.data_dir / "train").is_dir():
        fail(f"--data.data_dir {args.data_dir} has no train/ folder of class folders: give a CIFAR-style JPEG folder")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = vit.create_model(
        "vit_tiny_map_patch4_32", embed_dim=64, depth=4, num_heads=4, mlp_ratio=2.0, class_token=False
    )
    if args.data_dir is not None:
        images, labels, classes = load_folder(args.data_dir, "train")
        model.reset_classifier(len(classes), global_pool="map")
        loss = train(model, images, labels, args.steps) if args.steps else float("nan")
        split = "test" if (args.data_dir / "test").is_dir() else "train"
        photo, label, _ = load_folder(args.data_dir, split, limit=1)
        photo, label = photo[3:4], label[3:4]  # the first image of the fourth class (cat in CIFAR-10)
        trained = f"a 4-block ViT/4 with a MAP head trained {args.steps} steps (final batch loss {loss:.2f})"
    else:
        from sklearn.datasets import load_sample_image

        china = Image.fromarray(load_sample_image("china.jpg")).resize((32, 32), Image.BICUBIC)
        photo, label, classes = torch.from_numpy(np.asarray(china)).permute(2, 0, 1)[None], None, None
        trained = "an untrained 4-block ViT/4 with a MAP head"
    explanation = explain_images(model, photo, labels=label, class_names=classes, mean=MEAN, std=STD)
    weights = explanation.pool_attention[0, :, 0].reshape(-1, *model.patch_embed.grid_size)  # (heads, 8, 8)
    panels = [
        render_panel(explanation.images[0], weights[h], f"latent -> patches, head {h}", size=128, resample="nearest")
        for h in range(len(weights))
    ]
    panels.append(render_panel(explanation.images[0], explanation.rollout[0], "rollout at the latent", size=128))
    height, width = max(p.shape[0] for p in panels), max(p.shape[1] for p in panels)
    pads = [((0, height - p.shape[0]), (0, width - p.shape[1]), (0, 0)) for p in panels]
    cells = [np.pad(p, pad, constant_values=255) for p, pad in zip(panels, pads, strict=True)]
    cells += [np.full_like(cells[0], 255)] * (-len(cells) % 3)  # rows of three panels
    sheet = np.concatenate([np.concatenate(cells[i : i + 3], axis=1) for i in range(0, len(cells), 3)], axis=0)
    buffer = BytesIO()
    Image.fromarray(sheet).save(buffer, format="PNG")
    write_bytes(args.out, buffer.getvalue())
    print(f"wrote {args.out}: {trained}; {explanation.captions()[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
