"""vit.compare (scripts/compare.py) on real offline W&B runs; the W&B sweep's parameters are valid overrides."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import yaml
from PIL import Image

import vit
from vit.compare import main as compare_main

ROOT = Path(__file__).resolve().parents[1]
SWEEPS = sorted((ROOT / "configs" / "sweeps").glob("*.yaml"))


class Result:
    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def compare(capsys):
    """``compare(*args)``: ``vit compare`` in this process, with its exit status and printed output."""

    def run(*args) -> Result:
        capsys.readouterr()
        try:
            code = compare_main([str(a) for a in args])
        except SystemExit as exit_info:  # bad input: one error line, then exit status 2
            code = exit_info.code
        out = capsys.readouterr()
        return Result(code, out.out, out.err)

    return run


# ------------------------------------------------------------------------------------------------- compare
def test_compare_script_bad_input(tmp_path, compare):
    result = compare(tmp_path / "nowhere")
    assert result.returncode == 2 and result.stderr.startswith(f"error: {tmp_path / 'nowhere'} does not exist")
    result = compare(tmp_path)
    assert result.returncode == 2 and "is not a W&B run and holds none" in result.stderr
    (tmp_path / "notes.txt").write_text("hello")
    result = compare(tmp_path / "notes.txt")
    assert result.returncode == 2 and "is not a W&B run: expected a run-*.wandb file" in result.stderr
    run = tmp_path / "wandb" / "offline-run-20260101_000000-abc"
    run.mkdir(parents=True)
    (run / "run-abc.wandb").write_bytes(b"garbage")
    result = compare(tmp_path / "wandb")
    assert result.returncode == 2 and result.stderr.startswith(f"error: cannot read W&B run {run / 'run-abc.wandb'}")
    result = compare()
    assert result.returncode == 2 and "nothing to compare" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_compare_script_online_without_login_is_one_message(tmp_path, monkeypatch, compare):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc: W&B refuses before any connection
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    result = compare("--project", "someone/vit")
    assert result.returncode == 2
    assert result.stderr.startswith("error: cannot read W&B project someone/vit: UsageError: No API key configured")


def _wandb_run(
    folder: Path,
    name: str,
    epochs: range,
    *,
    job_type: str | None = None,
    run_id: str | None = None,
    window_size: int = 0,
    exit_code: int = 0,
    run_folder: bool = True,
    img_per_sec: float | None = None,
    status: str | None = None,
) -> None:
    """One real offline W&B run through Lightning's WandbLogger: config, per-epoch val/acc and train loss.

    As ``vit fit`` does, a fit has no W&B job type; validate/test runs have theirs.
    """
    from lightning.pytorch.loggers import WandbLogger

    if run_folder:  # what `vit fit` writes beside wandb/: the marks of a run folder
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.yaml").write_text("seed_everything: 0\n")
    logger = WandbLogger(name=name, save_dir=str(folder), id=run_id, offline=True, job_type=job_type, project="vit")
    logger.log_hyperparams(
        {"model": {"model": "vit_tiny_window_patch4_32", "model_overrides": {"window_size": window_size}}}
    )
    for epoch in epochs:
        metrics = {"val/acc": 0.1 * epoch + 0.01 * window_size, "epoch": epoch}
        if job_type is None:
            metrics["train/loss_epoch"] = 2.0 - 0.1 * epoch
            metrics["train/img_per_sec"] = 100.0 + epoch
        logger.log_metrics(metrics, step=epoch)
    if img_per_sec is not None:  # as `vit fit` does at the end: the mean over the fit into the summary
        logger.experiment.summary["train/img_per_sec"] = img_per_sec
    if status is not None:  # as vit.callbacks.RunSummary records how the fit ended
        logger.experiment.summary["run/status"] = status
    logger.experiment.finish(exit_code=exit_code)


@pytest.fixture(scope="module")
def offline_runs(tmp_path_factory) -> Path:
    """A ``runs/`` tree of real offline W&B runs: two fits resumed once each (one keeps its W&B id, one its run
    folder), a validate run, a crashed fit, and a fit outside any run folder."""
    root = tmp_path_factory.mktemp("compare") / "runs"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "offline")
        mp.setenv("WANDB_SILENT", "true")
        mp.chdir(root.parent)
        # preempted (exit 143) in epoch 2, resumed with the same W&B id: epoch 2 is logged twice
        _wandb_run(root / "quickstart" / "g", "g", range(3), run_id="g0000001", exit_code=143)
        _wandb_run(root / "quickstart" / "g", "g", range(2, 5), run_id="g0000001")
        # resumed into the same run folder under a new W&B id
        _wandb_run(root / "quickstart" / "w", "w", range(2), window_size=2)
        _wandb_run(root / "quickstart" / "w", "w", range(2, 4), window_size=2, img_per_sec=150.0)
        _wandb_run(root / "quickstart" / "v", "v", range(1), job_type="validate", window_size=2)
        _wandb_run(root / "quickstart" / "c", "c", range(2), exit_code=1, window_size=4)
        # Ctrl-C in epoch 2: a partial last.ckpt; the process exits normally, so W&B says "finished"
        _wandb_run(root / "quickstart" / "i", "i", range(2), window_size=5, status="interrupted")
        _wandb_run(root / "loose", "s", range(3), window_size=3, run_folder=False)
    return root


def _rows(stdout: str) -> dict[str, list[str]]:
    header, _, *rows = stdout.split("\n\n")[0].splitlines()
    return {row.split()[0]: row.split() for row in [header, *rows]}


@pytest.mark.slow
def test_compare_keeps_finished_fit_runs_and_counts_a_resumed_run_once(offline_runs, compare, monkeypatch):
    monkeypatch.chdir(offline_runs.parent)
    result = compare(offline_runs)
    assert result.returncode == 0, result.stderr
    rows = _rows(result.stdout)
    assert rows.pop("run")[:3] == ["run", "attention", "model.model_overrides.window_size"]
    assert sorted(rows) == ["g", "s", "w"]  # validate v, crashed c, interrupted i left out; g and w once each
    assert rows["g"][1:3] == ["global", "0"] and rows["w"][1:3] == ["window", "2"] and rows["s"][1] == "window"
    # best val/acc over both parts of a resumed run: g reached epoch 4 (0.4), w epoch 3 (0.3 + 0.02)
    assert float(rows["g"][3]) == pytest.approx(0.4) and float(rows["w"][3]) == pytest.approx(0.32)
    assert float(rows["g"][4]) == pytest.approx(1.6)  # the final train loss is the resumed part's last
    # img/s: the summary's train/img_per_sec of the last part (W&B keeps the last value unless set: epoch 4)
    assert float(rows["g"][5]) == 104 and float(rows["w"][5]) == 150
    assert "left out 3 runs: 1 failed, 1 interrupted, 1 validate; --all shows them" in result.stderr
    assert "val/acc (best)" in result.stdout.splitlines()[0] and "train/loss (last)" in result.stdout.splitlines()[0]
    (plot,) = (offline_runs / "compare").glob("val_acc-*.png")  # a new file per comparison, named by its time
    assert f"wrote {Path('runs') / 'compare' / plot.name}" in result.stdout
    with Image.open(plot) as image:
        assert image.format == "PNG" and image.size == (700, 450)


@pytest.mark.slow
def test_compare_all_shows_validate_and_crashed_runs(offline_runs, compare, tmp_path):
    result = compare(offline_runs, "--all", "--plot", tmp_path / "all.png")
    assert result.returncode == 0, result.stderr
    rows = _rows(result.stdout)
    assert rows.pop("run")[:4] == ["run", "attention", "job", "state"]
    assert {name: row[2:4] for name, row in rows.items()} == {
        "g": ["fit", "finished"],
        "w": ["fit", "finished"],
        "s": ["fit", "finished"],
        "v": ["validate", "finished"],
        "c": ["fit", "failed"],
        "i": ["fit", "interrupted"],
    }
    assert (tmp_path / "all.png").is_file() and not (offline_runs / "compare" / "all.png").exists()


@pytest.mark.parametrize(
    ("wandb_state", "recorded", "state"),
    [
        ("finished", "interrupted", "interrupted"),  # Ctrl-C / SIGTERM: the process ended normally
        ("finished", "running", "interrupted"),  # never reached its end, nor said how it stopped
        ("crashed", "failed", "failed"),
        ("finished", "finished", "finished"),
        ("finished", None, "finished"),  # a run of another program, or from before the status was recorded
        ("running", "running", "running"),  # still running
    ],
)
def test_a_run_state_is_what_vit_fit_recorded_over_what_wandb_says(wandb_state, recorded, state):
    from vit.compare.runs import recorded_state

    assert recorded_state(wandb_state, {} if recorded is None else {"run/status": recorded}) == state


def test_compare_series_keeps_the_resumed_value_of_a_repeated_epoch(offline_runs):
    from vit.compare import read_offline_runs, series

    runs = {run.name: run for run in read_offline_runs([offline_runs / "quickstart" / "g"])}
    assert list(runs) == ["g"] and runs["g"].parts == 2
    xs, ys = series(runs["g"], "val/acc")
    assert xs == [0, 1, 2, 3, 4] and ys == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4])


def test_compare_series_in_minutes_continues_the_clock_of_a_resumed_run():
    from vit.compare import Run, merge_resumed, series

    # Two parts of one run (same W&B id): the second one's clock starts at 0 again, and the first part's last
    # row is its latest time; the pause between the parts is not counted.
    first = [
        {"_runtime": 60.0, "epoch": 0, "val/acc": 0.2},
        {"_runtime": 90.0, "train/loss_epoch": 1.0},
    ]
    second = [
        {"_runtime": 30.0, "epoch": 1, "val/acc": 0.3},
        {"_runtime": 150.0, "epoch": 2, "val/acc": 0.4},
        {"epoch": 3, "val/acc": 0.5},  # no clock: left out of the time axis
    ]
    parts = [
        Run(name="r", source=f"p{i}", history=h, run_id="r1", kind="fit", start=f"t{i}")
        for i, h in ((0, first), (1, second))
    ]
    (run,) = merge_resumed(parts)
    xs, ys = series(run, "val/acc", "minutes")
    assert xs == pytest.approx([1.0, 2.0, 4.0]) and ys == pytest.approx([0.2, 0.3, 0.4])
    assert series(run, "val/acc")[0] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="x_axis must be one of"):
        series(run, "val/acc", "hours")


@pytest.mark.slow
def test_compare_plots_against_minutes(offline_runs, compare, monkeypatch):
    monkeypatch.chdir(offline_runs.parent)
    result = compare(offline_runs, "--x", "minutes")
    assert result.returncode == 0, result.stderr
    plots = list((offline_runs / "compare").glob("val_acc_minutes-*.png"))
    assert plots and f"wrote {Path('runs') / 'compare' / plots[-1].name}" in result.stdout


def test_each_comparison_writes_a_plot_of_its_own():
    from datetime import datetime

    from vit.compare import default_plot

    first = default_plot("val/acc", when=datetime(2026, 12, 6, 5, 0, 0))
    assert first == Path("runs", "compare", "val_acc-1206-050000.png")
    assert (
        default_plot("val/acc", "minutes", when=datetime(2026, 12, 6, 5, 0, 1)).name
        == "val_acc_minutes-1206-050001.png"
    )


# ------------------------------------------------------------------------------------------------------ sweeps
def sweep_combinations(path: Path) -> list[dict]:
    """The settings a sweep's trials can take: every combination of a grid sweep's values (single ``value`` entries
    included); for a searched sweep each parameter's values and distribution ends (``min``, ``max``), cycled so that
    every one appears in some combination (the full product of a search space is too large to parse each)."""
    sweep = yaml.safe_load(path.read_text())
    names, choices = [], []
    for name, spec in sweep["parameters"].items():
        names.append(name)
        if "values" in spec or "value" in spec:
            choices.append(spec["values"] if "values" in spec else [spec["value"]])
        else:
            choices.append([spec["min"], spec["max"]])
    if sweep.get("method") == "grid":
        return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*choices)]
    longest = max(len(c) for c in choices)
    return [{n: c[i % len(c)] for n, c in zip(names, choices, strict=True)} for i in range(longest)]


def test_there_is_a_window_vs_global_sweep():
    sweep = yaml.safe_load((ROOT / "configs" / "sweeps" / "window_vs_global.yaml").read_text())
    assert sweep["program"] == "scripts/fit.py"
    assert sweep["command"][:3] == ["${env}", "${interpreter}", "${program}"] and sweep["command"][-1] == "${args}"
    assert sweep["metric"] == {"name": "val/acc", "goal": "maximize"}
    window_sizes = {
        combo.get("model.model_overrides.window_size")
        for combo in sweep_combinations(ROOT / "configs" / "sweeps" / "window_vs_global.yaml")
    }
    assert 0 in window_sizes and len(window_sizes - {0}) >= 2  # global against at least two window sizes


@pytest.mark.slow
@pytest.mark.parametrize("path", SWEEPS, ids=[p.stem for p in SWEEPS])
def test_sweep_parameters_are_valid_overrides(path, capsys):
    """Each combination parses with the CLI (as the agent's ``--key=value`` arguments) and builds the model."""
    from wandb.sdk.launch.sweeps.utils import create_sweep_command_args

    from vit.cli import cli_main

    sweep = yaml.safe_load(path.read_text())
    command = sweep["command"]
    base = command[command.index("${program}") + 1 : command.index("${args}")]
    models = set()
    for combo in sweep_combinations(path):
        # The arguments exactly as the W&B agent writes ${args}.
        args = create_sweep_command_args({"args": {name: {"value": value} for name, value in combo.items()}})["args"]
        with pytest.raises(SystemExit) as exit_info:
            cli_main(["fit", *base, *args, "--print_config"])
        assert exit_info.value.code in (0, None), f"{path.name}: {args} is not a valid override"
        config = yaml.safe_load(capsys.readouterr().out)
        for name, value in combo.items():  # the override reached its key
            node = config
            for part in name.split("."):
                node = node[part]
            assert node == value, (name, node, value)
        overrides = {**(config["model"]["model_overrides"] or {}), "img_size": config["data"]["img_size"]}
        models.add((config["model"]["model"], yaml.safe_dump(overrides)))
    for name, overrides in models:  # an override the model does not accept (or a window too large) fails here
        vit.create_model(name, **yaml.safe_load(overrides))


def test_compare_select_and_merge_without_wandb(tmp_path, compare):
    """Selection and merging on hand-made runs: what is left out and why, and which parts join."""
    from vit.compare import Run, merge_resumed, select

    folder = tmp_path / "runs" / "quickstart" / "a"
    (folder / "checkpoints").mkdir(parents=True)
    train = [{"train/loss_epoch": 1.0, "epoch": 0}]
    parts = [
        Run("a", str(folder / "wandb" / "offline-run-1-x"), run_id="x", start="1", history=train, state="failed"),
        Run("a", str(folder / "wandb" / "offline-run-2-y"), run_id="y", start="2", history=train),  # same folder
        Run("b", str(tmp_path / "wandb" / "offline-run-3-y"), run_id="y", start="3", history=train),  # same id
        Run("v", str(folder / "wandb" / "offline-run-4-v"), run_id="v", kind="validate", start="4"),
        Run("p", str(tmp_path / "wandb" / "offline-run-5-p"), run_id="p", start="5"),  # no job type, no training
    ]
    merged = merge_resumed(parts)
    assert [(run.name, run.parts, run.state) for run in merged] == [
        ("b", 3, "finished"),
        ("v", 1, "finished"),
        ("p", 1, "finished"),
    ]
    kept, note = select(merged)
    assert [run.name for run in kept] == ["b"] and note == "left out 2 runs: 1 non-fit, 1 validate; --all shows them"
    assert select(merged, everything=True) == (merged, None)


def test_compare_leaves_out_settings_that_only_name_files():
    from vit.compare import Run
    from vit.compare.report import differing_keys

    base = {"model.lr": 0.001, "data.dataset": "digits", "trainer.max_epochs": 2}
    paths = [
        {"ckpt_path": None, "runs_dir": "runs", "data.data_dir": "data", "checkpoint.dirpath": None},
        {"ckpt_path": "runs/quickstart/" + "x" * 80 + "/checkpoints/last.ckpt", "runs_dir": "/tmp/r",
         "data.data_dir": "/mnt/copy", "checkpoint.dirpath": "elsewhere"},
    ]  # fmt: skip
    runs = [Run("a", "a", config={**base, **paths[0]}), Run("b", "b", config={**base, **paths[1], "model.lr": 0.002})]
    assert differing_keys(runs) == ["model.lr"]


def test_compare_with_only_a_validate_run_is_one_error(offline_runs, compare):
    result = compare(offline_runs / "quickstart" / "v")
    assert result.returncode == 2
    assert result.stderr == "error: no finished fit run to compare (1 run: 1 validate; --all shows them)\n"


def test_compare_reads_the_attention_from_tags_else_the_config():
    from vit.compare.report import attention
    from vit.compare.runs import Run

    def run(tags=(), **config):
        return attention(Run(name="r", source="s", config=config, tags=list(tags)))

    assert run(["linear", "digits"]) == "linear" and run(["sliding"]) == "sliding"
    assert run(**{"model.model": "vit_tiny_linear_patch4_32"}) == "linear"
    assert run(**{"model.model": "vit_tiny_patch4_32", "model.model_overrides.linear_attention": True}) == "linear"
    overrides = {"model.model_overrides.linear_attention": False, "model.model_overrides.window_size": 0}
    assert run(**{"model.model": "vit_tiny_linear_patch4_32", **overrides}) == "global"
    assert run(**{"model.model": "vit_tiny_window_patch4_32"}) == "window"
    assert run(**{"model.model": "no_such_preset"}) is None and run() is None
