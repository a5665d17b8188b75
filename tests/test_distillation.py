"""DeiT's distillation: the token and its head against timm's VisionTransformerDistilled, the hard and soft losses
against their formulas written out, the teacher frozen and out of the checkpoint, a fit with a teacher, and the
explanation methods (LRP covers the two heads; rollout and attribution refuse in one line)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from timm.models.deit import VisionTransformerDistilled

import vit
from vit.distillation import Distiller, distillation_loss, load_teacher, make_distiller
from vit.errors import ConfigError
from vit.explain import attention_attribution, lrp, rollout_map

SMALL = dict(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=4, num_classes=5)


def test_distilled_model_is_timms_distilled_deit():
    torch.manual_seed(0)
    theirs = VisionTransformerDistilled(**SMALL).eval()
    ours = vit.VisionTransformer(**SMALL, distilled=True).eval()
    assert sorted(ours.state_dict()) == sorted(theirs.state_dict())  # the same names
    ours.load_state_dict(theirs.state_dict(), strict=True)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours.forward_head(ours.forward_features(x), pre_logits=True),
                                   theirs.forward_head(theirs.forward_features(x), pre_logits=True))  # fmt: skip
    for model in (ours, theirs):
        model.set_distilled_training(True)
        model.train()
    pairs = [ours(x), theirs(x)]
    assert all(isinstance(p, tuple) and len(p) == 2 for p in pairs)
    for a, b in zip(*pairs, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert ours.num_prefix_tokens == 2 and "dist_token" in ours.no_weight_decay()


def test_distilled_model_with_average_pooling_and_registers():
    torch.manual_seed(0)
    model = vit.VisionTransformer(**SMALL, distilled=True, class_token=False, global_pool="avg", reg_tokens=1).eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        tokens = model.forward_features(x)  # dist token first, then the register, then 16 patches
        assert tokens.shape == (2, 18, 32)
        pooled, dist = model.fc_norm(tokens[:, 2:].mean(1)), model.fc_norm(tokens[:, 0])
        torch.testing.assert_close(model(x), (model.head(pooled) + model.head_dist(dist)) / 2)
    model.reset_classifier(3)
    assert model.head_dist.out_features == 3 and model(x).shape == (2, 3)


def test_soft_and_hard_losses_are_deits():
    torch.manual_seed(0)
    student, teacher = torch.randn(4, 5), torch.randn(4, 5) * 3
    tau = 2.0
    p_t = (teacher / tau).softmax(1)
    kl = (p_t * (p_t.log() - (student / tau).log_softmax(1))).sum()
    torch.testing.assert_close(distillation_loss(student, teacher, "soft", tau), kl * tau**2 / 20)
    hard = -(student.log_softmax(1)[torch.arange(4), teacher.argmax(1)]).mean()
    torch.testing.assert_close(distillation_loss(student, teacher, "hard"), hard)


class _Fixed(torch.nn.Module):
    """A teacher that always predicts class ``c`` (with a parameter, so freezing shows)."""

    def __init__(self, c: int, classes: int = 5) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(classes))
        self.c = c

    def forward(self, x):
        return F.one_hot(torch.full((x.shape[0],), self.c), self.w.numel()).float() * 10 + self.w


def test_distiller_mixes_label_and_teacher_losses_and_checks_the_classes():
    distiller = Distiller(_Fixed(2).eval().requires_grad_(False), "hard", alpha=0.25, tau=1.0, num_classes=5)
    student = torch.randn(3, 5, requires_grad=True)
    loss = distiller(torch.randn(3, 3, 8, 8), student, torch.tensor(4.0))
    expected = 0.75 * 4.0 + 0.25 * F.cross_entropy(student, torch.full((3,), 2))
    torch.testing.assert_close(loss, expected)
    loss.backward()
    assert distiller.teacher.w.grad is None
    wrong = Distiller(_Fixed(0, classes=7), "hard", 0.5, 1.0, num_classes=5)
    with pytest.raises(ConfigError, match="model.teacher predicts 7 classes, the student 5"):
        wrong(torch.randn(1, 3, 8, 8), student, torch.tensor(0.0))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(teacher="timm:resnet18"), "model.teacher and model.distillation go together"),
        (dict(distillation="hard"), "model.teacher and model.distillation go together"),
        (dict(teacher="x", distillation="hard", distillation_alpha=1.5), r"distillation_alpha must be in \[0, 1\]"),
        (dict(teacher="x", distillation="soft", distillation_tau=0.0), "distillation_tau must be positive"),
    ],
)
def test_inconsistent_distillation_arguments_are_refused_in_one_line(tiny_classifier, kwargs, message):
    with pytest.raises(ConfigError, match=message) as error:
        tiny_classifier(**kwargs)
    assert "\n" not in str(error.value)


def test_teachers_load_frozen_from_a_checkpoint_or_timm(trained_checkpoint):
    teacher = load_teacher(str(trained_checkpoint))
    assert not teacher.training and not any(p.requires_grad for p in teacher.parameters())
    reference = vit.load(trained_checkpoint)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(teacher(x), reference(x))
    timm_teacher = load_teacher("timm:resnet18", pretrained=False)
    assert not timm_teacher.training and type(timm_teacher).__name__ == "ResNet"
    with pytest.raises(ConfigError, match="model.teacher 'no_such_model_anywhere' does not load"):
        load_teacher("no_such_model_anywhere")


def test_a_fit_with_a_teacher_trains_the_distillation_head(tmp_path, tiny_classifier, cpu_trainer, digits):
    torch.manual_seed(0)
    module = tiny_classifier(model_overrides={"distilled": True}, teacher=str(tmp_path), distillation="hard")
    # the teacher is given here, so fitting does not load one from the path
    module.distiller = Distiller(_Fixed(3, classes=10).requires_grad_(False), "hard", 1.0, 1.0, num_classes=10)
    module.model.set_distilled_training(True)
    trainer = cpu_trainer(max_epochs=1, limit_train_batches=4, limit_val_batches=0)
    before = {k: v.clone() for k, v in module.model.state_dict().items()}
    trainer.fit(module, digits())
    after = module.model.state_dict()
    # alpha 1: only the teacher's class 3 is learned, through the distillation head; the class head gets no gradient
    # (its bias, which takes no weight decay, stays as it was; the distillation head's moves towards class 3)
    assert torch.equal(before["head.bias"], after["head.bias"])
    moved = after["head_dist.bias"] - before["head_dist.bias"]
    assert moved.argmax() == 3 and moved[3] > 0
    assert not any(k.startswith("distiller") or "teacher" in k for k in module.state_dict())
    module.eval()
    with torch.no_grad():
        logits = module.model(torch.randn(2, 3, 32, 32))
    assert logits.shape == (2, 10)  # eval: one tensor, the mean of the two heads


def test_a_timm_cnn_trained_by_fit_loads_as_a_teacher(tmp_path, cpu_trainer, digits):
    """``model.model timm:NAME`` trains timm's untrained network; its checkpoint is a teacher with the same outputs."""
    import timm

    from vit import ImageClassifier

    torch.manual_seed(0)
    module = ImageClassifier("timm:resnet18", num_classes=10, img_size=32, lr=3e-3)
    reference = timm.create_model("resnet18", num_classes=10)
    assert type(module.model) is type(reference) and module.model.state_dict().keys() == reference.state_dict().keys()
    assert module.model.fc.out_features == 10
    cpu_trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=0).fit(module, digits())
    path = tmp_path / "cnn.ckpt"
    module.trainer.save_checkpoint(path)
    teacher = load_teacher(str(path))
    assert not teacher.training and not any(p.requires_grad for p in teacher.parameters())
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(teacher(x), module.model.eval()(x))
    for bad, message in (("timm:no_such_net", "timm has no model 'no_such_net'"),
                         ("timm:resnet18", "model_overrides for timm:resnet18: .*no_such_argument")):  # fmt: skip
        with pytest.raises(ConfigError, match=message) as error:
            ImageClassifier(bad, num_classes=10, model_overrides={"no_such_argument": 1})
        assert "\n" not in str(error.value)
    with pytest.raises(ConfigError, match=r"built for img_size \(224, 224\) but data.img_size is 32"):
        ImageClassifier("timm:vit_tiny_patch16_224", num_classes=10, img_size=32)  # a timm ViT: its size is its own
    small = ImageClassifier("timm:vit_tiny_patch16_224", num_classes=10, img_size=32,
                            model_overrides={"img_size": 32, "patch_size": 4})  # fmt: skip
    assert small.model.patch_embed.grid_size == (8, 8) and small.model.num_classes == 10


def test_make_distiller_switches_a_distilled_model_to_two_outputs(trained_checkpoint):
    model = vit.VisionTransformer(**SMALL, distilled=True)
    hparams = dict(teacher=str(trained_checkpoint), distillation="soft", distillation_alpha=0.5, distillation_tau=2.0)
    distiller = make_distiller(hparams, model, 10)
    assert model.distilled_training and distiller.kind == "soft" and math.isclose(distiller.tau, 2.0)


def test_explanations_of_a_distilled_model():
    torch.manual_seed(0)
    model = vit.VisionTransformer(**SMALL, distilled=True).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or name in ("cls_token", "dist_token", "pos_embed"):
                p.zero_()
    images = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    result = lrp(model, images, variant="cp")  # both heads: the relevance sums to the averaged logit
    logit = result.logits.gather(1, result.target[:, None])[:, 0]
    torch.testing.assert_close(result.pixels.sum((1, 2)), logit, rtol=1e-9, atol=1e-10)
    for method in (rollout_map, attention_attribution):
        with pytest.raises(ValueError, match="averages two .* explain it with lrp") as error:
            method(model, images)
        assert "\n" not in str(error.value)


def test_a_temperature_divides_both_heads_of_a_distilled_model():
    from vit.checkpoints.loading import apply_temperature

    torch.manual_seed(0)
    model = vit.VisionTransformer(**SMALL, distilled=True).eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        before = model(x)
        apply_temperature(model, {"temperature": 2.0})
        torch.testing.assert_close(model(x), before / 2)


def test_explain_offers_lrp_for_a_distilled_model_and_refuses_the_attention_methods_in_one_line():
    from vit.explain import explain
    from vit.explain.methods import applicable_methods, get_method

    model = vit.VisionTransformer(**SMALL, distilled=True).eval()
    assert {"attnlrp", "cp_lrp"} <= set(applicable_methods(model))
    assert not {"rollout", "attribution", "attention"} & set(applicable_methods(model))
    with pytest.raises(ValueError, match="method 'rollout' does not apply to this model .*distillation head") as err:
        get_method("rollout", model)
    assert "\n" not in str(err.value)
    images = torch.randint(0, 256, (2, 3, 16, 16), dtype=torch.uint8)
    explanation = explain(model, images, ["attnlrp"], mean=(0.5,) * 3, std=(0.25,) * 3, labels=[1, 2], heads=True)
    assert explanation.probs.shape == (2, 5) and explanation.maps["attnlrp"].shape[0] == 2
