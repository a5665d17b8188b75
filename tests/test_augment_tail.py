"""``model.basic_augment_epochs``: the last epochs train with the basic augmentation instead of the strong one."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vit.callbacks import BasicAugmentTail
from vit.callbacks.augment_tail import check_basic_tail
from vit.data.batch_augment import BatchAugment
from vit.errors import ConfigError
from vit.schedule import TimePlan


def test_a_fit_augments_its_last_epoch_basic(monkeypatch, tiny_classifier, digits, cpu_trainer):
    seen: list[str] = []  # the mode of every call that really augments a batch
    call = BatchAugment.__call__

    def recording(self, images, generator):
        seen.append(self.augment)
        return call(self, images, generator)

    monkeypatch.setattr(BatchAugment, "__call__", recording)
    data = digits(augment="strong")
    module = tiny_classifier(basic_augment_epochs=1)
    trainer = cpu_trainer(max_epochs=3, limit_train_batches=4, limit_val_batches=0)
    trainer.fit(module, datamodule=data)

    assert seen == ["strong"] * 8 + ["basic"] * 4  # epochs 0-1 strong, epoch 2 basic: 4 batches each
    assert trainer.train_dataloader.augment.augment == "basic"


def test_a_fit_augmented_basic_stays_basic_with_the_tail(monkeypatch, tiny_classifier, digits, cpu_trainer):
    # A recipe with the tail, run with data.augment basic: every batch basic, never switched to strong before the tail.
    seen: list[str] = []
    call = BatchAugment.__call__
    monkeypatch.setattr(BatchAugment, "__call__", lambda self, *args: seen.append(self.augment) or call(self, *args))
    trainer = cpu_trainer(max_epochs=3, limit_train_batches=4, limit_val_batches=0)
    trainer.fit(tiny_classifier(basic_augment_epochs=1), datamodule=digits(augment="basic"))
    assert seen == ["basic"] * 12


def test_the_basic_batches_are_the_basic_augmentation():
    # What the tail switches to is the basic augmentation itself: the same generator gives the same batch.
    images = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8)
    strong = BatchAugment("cifar", 32, "strong")
    strong.augment = "basic"
    expected = BatchAugment("cifar", 32, "basic")(images, torch.Generator().manual_seed(3))
    assert torch.equal(strong(images, torch.Generator().manual_seed(3)), expected)


def _trainer(step: int, augment: BatchAugment) -> SimpleNamespace:
    return SimpleNamespace(
        global_step=step, current_epoch=0, max_epochs=-1, train_dataloader=SimpleNamespace(augment=augment)
    )


def test_with_a_time_plan_the_tail_begins_where_the_plan_puts_it_and_stays():
    augment = BatchAugment("cifar", 32, "strong")
    plan = TimePlan(warmup_steps=5, total_steps=100, min_ratio=0.01)  # the first guess of the length
    tail = BasicAugmentTail(2, plan=lambda: plan, steps_per_epoch=lambda: 10.0)  # the last 20 steps
    tail.on_train_batch_start(_trainer(90, augment), None)
    assert augment.augment == "strong"  # a guess does not start the tail: a measured plan may be far longer
    plan.planned = True
    for step, expected in ((0, "strong"), (79, "strong"), (80, "basic")):
        tail.on_train_batch_start(_trainer(step, augment), None)
        assert augment.augment == expected, step
    plan.total_steps = 200  # re-planned later: the tail has begun and stays
    tail.on_train_epoch_start(_trainer(81, augment), None)
    assert augment.augment == "basic" and tail.state_dict() == {"start": 80}

    resumed, fresh = BasicAugmentTail(2, plan=lambda: plan, steps_per_epoch=lambda: 10.0), BatchAugment("cifar", 32)
    fresh.augment = "strong"
    resumed.load_state_dict({"start": 80})
    resumed.on_train_start(_trainer(81, fresh), None)
    assert fresh.augment == "basic"


def test_without_a_plan_the_last_epochs_of_max_epochs_are_basic():
    augment = BatchAugment("cifar", 32, "strong")
    tail = BasicAugmentTail(2)
    for epoch, expected in ((0, "strong"), (7, "strong"), (8, "basic"), (9, "basic")):
        trainer = SimpleNamespace(global_step=0, current_epoch=epoch, max_epochs=10,
                                  train_dataloader=SimpleNamespace(augment=augment))  # fmt: skip
        tail.on_train_epoch_start(trainer, None)
        assert augment.augment == expected, epoch


@pytest.mark.parametrize(
    "overrides, culprit",
    [
        ({"augment": "none"}, r"data.augment is none: set data.augment strong, or"),
        ({"augment": "strong", "decode_once": False}, r"not decoded once: set data.decode_once true \(images up"),
    ],
)
def test_data_the_tail_cannot_switch_is_refused(overrides, culprit, digits):
    with pytest.raises(ConfigError, match=f"basic_augment_epochs 2 switches .* but (these images are )?{culprit}"):
        check_basic_tail(2, digits(**overrides))
    with pytest.raises(ConfigError, match="must be >= 0"):
        check_basic_tail(-1, None)
    check_basic_tail(2, digits(augment="strong"))  # strong and decoded once: accepted
    check_basic_tail(2, digits(augment="basic", decode_once=False))  # basic throughout: nothing to switch, accepted
    check_basic_tail(0, digits(**overrides))  # off: nothing to check
