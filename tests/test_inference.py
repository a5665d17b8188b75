"""``vit.load`` and ``vit.Predictor``: a checkpoint or an export folder alone gives the model, its preprocessing
(timm's ``pretrained_cfg``) and per-image predictions on file paths, PIL images and uint8 arrays."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

import vit
from vit import ImageClassifier
from vit.callbacks import CheckpointMetadata
from vit.checkpoints import METADATA_KEY, inference_metadata
from vit.errors import CorruptCheckpointError, IncompatibleCheckpointError, InputError, UsageError
from vit.export import export

NAMES = [f"class_{i}" for i in range(7)]
MEAN, STD = (0.4, 0.5, 0.6), (0.2, 0.25, 0.3)


@pytest.fixture(scope="session")
def save_checkpoint(tiny_classifier):
    """``save_checkpoint(path, ema=False) -> module``: a checkpoint of a tiny 7-class model, as ``vit fit`` writes its
    inference entry; EMA weights differ."""

    def save(path: Path, ema: bool = False) -> ImageClassifier:
        module = tiny_classifier(num_classes=7, img_size=None, ema_decay=0.9 if ema else None, seed=0)
        if ema:
            with torch.no_grad():
                for p in module.model_ema.module.parameters():
                    p.add_(0.01 * torch.randn_like(p))
        checkpoint = {"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams)}
        checkpoint[METADATA_KEY] = inference_metadata(module.model, module.hparams, NAMES, MEAN, STD, "cifar")
        torch.save(checkpoint, path)
        return module

    return save


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, save_checkpoint) -> tuple[Path, ImageClassifier]:
    path = tmp_path_factory.mktemp("inference") / "tiny.ckpt"
    return path, save_checkpoint(path)


def test_load_a_checkpoint_and_an_export_folder(checkpoint, tmp_path):
    path, module = checkpoint
    export(path, tmp_path / "exported")
    x = torch.randn(3, 3, 32, 32)
    expected = module.model.eval()(x)
    for source in (path, tmp_path / "exported"):
        model = vit.load(source)
        assert isinstance(model, vit.VisionTransformer) and not model.training
        cfg = model.pretrained_cfg
        assert cfg["input_size"] == (3, 32, 32) and cfg["mean"] == MEAN and cfg["std"] == STD
        assert cfg["interpolation"] == "bilinear" and cfg["crop_pct"] == 1.0 and cfg["label_names"] == NAMES
        torch.testing.assert_close(model(x), expected, rtol=0, atol=0)


def test_load_features_only_is_timms_feature_getter_over_the_loaded_model(checkpoint):
    """``vit.load(..., features_only=True)`` gives what timm's own ``FeatureGetterNet`` gives over the same loaded
    model, with timm's feature ``pretrained_cfg`` (no classifier, the checkpoint's preprocessing kept)."""
    from timm.models._features import FeatureGetterNet

    path, _ = checkpoint
    features = vit.load(path, features_only=True, out_indices=(0, 1), output_fmt="NLC")
    reference = FeatureGetterNet(vit.load(path), out_indices=(0, 1), output_fmt="NLC").eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        for got, expected in zip(features(x), reference(x), strict=True):
            torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert features.feature_info.channels() == reference.feature_info.channels()
    assert "classifier" not in features.pretrained_cfg and features.pretrained_cfg["mean"] == MEAN
    with pytest.raises(UsageError, match="out_indices choose the features of features_only=True"):
        vit.load(path, out_indices=(0,))


def test_a_loaded_model_keeps_the_cfg_keys_of_a_created_one(checkpoint):
    """The checkpoint's description adds to timm's keys of the model (first_conv, classifier), never drops them."""
    cfg = vit.load(checkpoint[0]).pretrained_cfg
    assert cfg["first_conv"] == "patch_embed.proj" and cfg["classifier"] == "head" and cfg["label_names"] == NAMES


def test_ema_weights_are_chosen_when_present(tmp_path, save_checkpoint):
    module = save_checkpoint(tmp_path / "ema.ckpt", ema=True)
    x = torch.randn(2, 3, 32, 32)
    ema, trained = module.model_ema.module.eval()(x), module.model.eval()(x)
    assert (ema - trained).abs().max() > 1e-3
    torch.testing.assert_close(vit.load(tmp_path / "ema.ckpt")(x), ema, rtol=0, atol=0)  # as validation used
    torch.testing.assert_close(vit.load(tmp_path / "ema.ckpt", ema=False)(x), trained, rtol=0, atol=0)
    save_checkpoint(tmp_path / "plain.ckpt")
    with pytest.raises(UsageError, match="no EMA weights"):
        vit.load(tmp_path / "plain.ckpt", ema=True)


def test_predictor_on_paths_pil_images_and_arrays(checkpoint, tmp_path):
    path, module = checkpoint
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, 256, (32, 32, 3), dtype=np.uint8) for _ in range(3)]
    files = []
    for i, array in enumerate(arrays):
        files.append(tmp_path / f"{i}.png")
        Image.fromarray(array).save(files[-1])
    # The reference, by hand: 32 x 32 images need no resize; scale to [0, 1], normalise, softmax.
    x = torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).float() / 255
    x = (x - torch.tensor(MEAN)[:, None, None]) / torch.tensor(STD)[:, None, None]
    with torch.no_grad():
        probs = module.model.eval()(x).softmax(-1)
    predict = vit.Predictor(path, batch_size=2)
    for images in (files, [str(f) for f in files], [Image.open(f) for f in files], arrays):
        results = predict(images)
        assert len(results) == 3
        for result, p in zip(results, probs, strict=True):
            assert result.label == NAMES[int(p.argmax())] and result.index == int(p.argmax())
            assert result.prob == pytest.approx(float(p.max()), abs=1e-6)
            assert [name for name, _ in result.top5] == [NAMES[i] for i in p.topk(5).indices.tolist()]
            assert [q for _, q in result.top5] == pytest.approx(p.topk(5).values.tolist(), abs=1e-6)
    assert predict(arrays[0])[0] == predict([arrays[0]])[0]  # one image alone
    gray = predict(arrays[0][:, :, 0])[0]  # (H, W) uint8: the channel repeated
    assert gray == predict(np.repeat(arrays[0][:, :, :1], 3, axis=2))[0]
    with pytest.raises(UsageError, match="uint8"):
        predict(arrays[0].astype(np.float32))


def test_load_refuses_what_is_not_a_model(tmp_path):
    (tmp_path / "notes.ckpt").write_text("not a checkpoint")
    with pytest.raises(CorruptCheckpointError, match="not a PyTorch checkpoint"):
        vit.load(tmp_path / "notes.ckpt")
    (tmp_path / "folder").mkdir()
    with pytest.raises(InputError, match="not an export folder"):
        vit.load(tmp_path / "folder")


def test_a_lightning_checkpoint_without_its_description_is_refused_by_name(checkpoint, tmp_path):
    """Only a checkpoint that describes its model loads: one without the description is one error naming the entry
    and what to do instead (no guessing the model from hyper-parameters or data that may not be here)."""
    path, _ = checkpoint
    raw = torch.load(path, weights_only=True)
    del raw[METADATA_KEY]
    torch.save(raw, tmp_path / "bare.ckpt")
    with pytest.raises(
        IncompatibleCheckpointError, match=rf"bare\.ckpt does not describe its model .*'{METADATA_KEY}'"
    ):
        vit.load(tmp_path / "bare.ckpt")


def test_describing_a_model_in_a_checkpoint_leaves_the_random_stream_alone(tmp_path, tiny_classifier):
    """A resumed run replays the random stream exactly: writing a checkpoint (which rebuilds the model once to check
    its arguments) and loading one must not draw from it."""
    module = tiny_classifier(num_classes=7, img_size=None)
    before = torch.random.get_rng_state()
    checkpoint = {"state_dict": module.state_dict()}
    CheckpointMetadata().on_save_checkpoint(SimpleNamespace(datamodule=None), module, checkpoint)
    assert checkpoint[METADATA_KEY]["model_args"]["embed_dim"] == 32
    torch.save(checkpoint, tmp_path / "m.ckpt")
    vit.load(tmp_path / "m.ckpt")
    assert torch.equal(torch.random.get_rng_state(), before)


# The VisionTransformer arguments of the release that introduced the checkpoint description (metadata format 1),
# spelled out here: that release's vit.load passes every model_args key to this constructor.
FIRST_RELEASE_ARGS = {
    "img_size", "patch_size", "in_chans", "num_classes", "embed_dim", "depth", "num_heads", "mlp_ratio", "qkv_bias",
    "qk_norm", "class_token", "reg_tokens", "global_pool", "latent_len", "pos_embed", "no_embed_class", "conv_stem",
    "init_values", "fc_norm", "drop_rate", "pos_drop_rate", "patch_drop_rate", "proj_drop_rate", "attn_drop_rate",
    "drop_path_rate", "window_size", "window_type", "window_dilation", "global_attn_indexes", "shift_windows",
    "linear_attention", "linear_feature_map", "fused_attn",
}  # fmt: skip


def test_an_older_release_reads_a_new_checkpoint_that_uses_no_new_argument(checkpoint, tmp_path, tiny_classifier):
    path, module = checkpoint
    args = torch.load(path, weights_only=False)[METADATA_KEY]["model_args"]
    assert set(args) == FIRST_RELEASE_ARGS  # every argument it knows, nothing it would refuse

    dynamic = tiny_classifier(num_classes=7, img_size=None, model_overrides={"dynamic_img_size": True})
    meta = inference_metadata(dynamic.model, dynamic.hparams, NAMES, MEAN, STD, "cifar")
    assert set(meta["model_args"]) == FIRST_RELEASE_ARGS | {"dynamic_img_size"}  # used: written, so refused there
    assert meta["model_args"]["dynamic_img_size"] is True
    torch.save({"state_dict": dynamic.state_dict(), METADATA_KEY: meta}, tmp_path / "dynamic.ckpt")
    loaded = vit.load(tmp_path / "dynamic.ckpt")
    assert loaded.patch_embed.dynamic_img_size and not loaded.patch_embed.dynamic_img_pad
    assert loaded(torch.zeros(1, 3, 40, 40)).shape == (1, 7)  # another size than the 32 it was built for


def test_the_package_docstring_names_every_user_extra():
    """``help(vit)`` says what a plain install brings and what each extra adds (dev and docs are the project's)."""
    import tomllib

    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text(encoding="utf-8"))
    extras = set(pyproject["project"]["optional-dependencies"]) - {"dev", "docs"}
    assert extras >= {"export", "explain"}
    for extra in sorted(extras):
        assert f"the ``{extra}`` extra" in vit.__doc__, extra
