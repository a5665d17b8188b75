"""The GPU check's runner (vit/bench/gpu_check/): its limit arithmetic, what it skips, the JSON and summary that every
step leaves however it ends, the module check, and its plan. The steps here are tiny ``python -c`` commands."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import vit.bench.gpu_check as gpu_check
from vit.bench.gpu_check.plan import BENCH_LIMITS, BUDGETS_S, DRY, GPU, LIMITS, needed_modules, plan_steps, wheels_step
from vit.bench.gpu_check.runner import Check, Settings, Step, chosen_steps, read_settings, run_command, step_limit
from vit.errors import UsageError

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def step(name: str, code: str = "pass", max_s: int = 60, reserve_s: int = 0, **kwargs) -> Step:
    return Step(name, max_s, reserve_s, (PY, "-c", code), **kwargs)


class FakeClock:
    """Seconds that move only when a test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def check(tmp_path: Path, clock=None, **settings) -> Check:
    options = {"min_limit_s": 2, "kill_after_s": 1}
    return Check(Settings(out=tmp_path / "out", python=PY, **settings), {}, clock=clock or FakeClock(), **options)


def read(path: Path) -> dict:
    return json.loads(path.read_text())


# ------------------------------------------------------------------------------------------------ limit arithmetic
@pytest.mark.parametrize(
    ("max_s", "reserve_s", "budget", "elapsed", "scale", "only", "expected"),
    [
        (280, 250, 570, 0, 1, False, (280, 320)),  # its own limit: 570 - 250 leaves more
        (280, 250, 570, 70, 1, False, (250, 250)),  # 570 - 70 - 250: the reserve wins
        (280, 250, 570, 70, 1, True, (280, 500)),  # ONLY: nothing kept back for the others
        (280, 250, 570, 330, 1, False, (-10, -10)),  # nothing left: skip
        (280, 250, 1710, 70, 3, False, (840, 890)),  # a dry run: limit and reserve three times longer
        (60, 40, 100, 50.9, 1, False, (9, 9)),  # whole seconds, rounded down
    ],
)
def test_step_limit(max_s, reserve_s, budget, elapsed, scale, only, expected):
    limit = step_limit(step("s", max_s=max_s, reserve_s=reserve_s), budget_s=budget, elapsed_s=elapsed, scale=scale,
                       only=only)  # fmt: skip
    assert limit == expected
    # the same rule written out: min(max, budget - elapsed - reserve), the reserve dropped under ONLY
    left = int(budget - elapsed - (0 if only else reserve_s * scale))
    assert limit == (min(max_s * scale, left), left)


def test_settings_from_the_environment(tmp_path):
    assert read_settings(tmp_path, {}) == Settings(out=tmp_path, python=PY)
    dry = read_settings(tmp_path, {"DRY_RUN": "1", "ONLY": " speedrun  vit_small ", "PYTHON": "/x/python"})
    assert (dry.budget_s, dry.scale, dry.only, dry.python) == (1710, 3, {"speedrun", "vit_small"}, "/x/python")
    own = read_settings(tmp_path, {"BUDGET_S": "100", "CIFAR_TAR": "c.tgz", "WHEELS": "w", "SPEEDRUN_TIME": "t"})
    assert (own.budget_s, own.cifar_tar, own.wheels, own.speedrun_time) == (100, Path("c.tgz"), Path("w"), "t")
    with pytest.raises(UsageError, match="BUDGET_S='9.5'"):
        read_settings(tmp_path, {"BUDGET_S": "9.5"})
    with pytest.raises(UsageError, match="DRY_RUN='yes'"):
        read_settings(tmp_path, {"DRY_RUN": "yes"})


def test_only_keeps_the_steps_named_and_what_they_require():
    steps = [step("env"), step("data"), step("fit", requires=("data",)), step("bench"), step("last")]
    names = [s.name for s in chosen_steps(steps, {"fit"}, always=("env",))]
    assert names == ["env", "data", "fit"]
    assert chosen_steps(steps, set()) == steps
    with pytest.raises(UsageError, match="no step named nope, zzz; the steps are: env data fit bench last"):
        chosen_steps(steps, {"zzz", "nope", "fit"})


# ------------------------------------------------------------------------------------------------ running steps
@pytest.mark.slow  # subprocesses
def test_a_step_that_succeeds_fails_or_times_out_leaves_its_json_and_summary(tmp_path):
    clock = FakeClock()
    run = check(tmp_path, clock=clock)
    out = run.settings.out
    writes = f"import json; json.dump({{'own': 1}}, open({str(out / 'own.json')!r}, 'w')); print('RESULT  own: 1')"
    assert run.run(step("own", writes)) == "ok"
    assert run.run(step("fails", "import sys; print('FAIL  a check'); sys.exit(3)")) == "failed"
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('RESULT  half', flush=True)"
    stubborn += "; time.sleep(60)"
    assert run.run(step("stubborn", stubborn, max_s=2)) == "timed out"  # SIGTERM ignored: SIGKILL a second later
    assert run.run(step("sleeps", "import time; time.sleep(60)", max_s=2)) == "timed out"  # stops at SIGTERM

    assert read(out / "own.json") == {"own": 1}  # the step's own JSON is left as it wrote it
    fails, stubborn, sleeps = (read(out / f"{name}.json") for name in ("fails", "stubborn", "sleeps"))
    assert (fails["status"], fails["exit"], fails["log"]) == ("failed", 3, "fails.log")
    assert (stubborn["status"], stubborn["exit"], stubborn["limit_s"]) == ("timed out", 137, 2)
    assert (sleeps["status"], sleeps["exit"]) == ("timed out", 124)
    report = read(out / "check.json")
    assert [(s["step"], s["status"]) for s in report["steps"]] == [
        ("own", "ok"), ("fails", "failed"), ("stubborn", "timed out"), ("sleeps", "timed out")
    ]  # fmt: skip
    summary = (out / "summary.txt").read_text().splitlines()
    assert summary == [
        "own: ok, 0s, done at 0s",
        "RESULT  own: 1",
        "fails: FAILED rc=3 (see fails.log), 0s, done at 0s",
        "FAIL  a check",
        "stubborn: TIMED OUT after 2s (partial JSON kept), 0s, done at 0s",
        "RESULT  half",
        "sleeps: TIMED OUT after 2s (partial JSON kept), 0s, done at 0s",
    ]


@pytest.mark.slow  # subprocesses
def test_run_command_stops_the_whole_process_group(tmp_path):
    """A step's children (loader workers) stop with it: the grandchild's file is never written."""
    marker = tmp_path / "late"
    late = f"import time; time.sleep(3); open({str(marker)!r}, 'w')"
    code = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {late!r}]); time.sleep(60)"
    assert run_command([PY, "-c", code], 1, tmp_path / "log", {}, kill_after_s=1) == (124, True)
    subprocess.run([PY, "-c", "import time; time.sleep(3)"])
    assert not marker.exists()
    assert run_command(["/no/such/program"], 5, tmp_path / "log", {}) == (127, False)
    assert "/no/such/program" in (tmp_path / "log").read_text()


def test_steps_are_skipped_when_time_is_short(tmp_path):
    clock = FakeClock()
    run = check(tmp_path, clock=clock, budget_s=100)
    out = run.settings.out
    clock.now += 50
    assert run.run(step("keeps_back", max_s=30, reserve_s=49)) == "skipped"  # 100 - 50 - 49 = 1 s: under 2 s
    assert run.run(step("fits", max_s=30, reserve_s=48)) == "ok"  # 2 s: started, with a limit of 2 s
    clock.now += 60
    assert run.run(step("late")) == "skipped"
    assert read(out / "keeps_back.json") == {
        "step": "keeps_back",
        "status": "skipped",
        "reason": "1s left of the 100s budget",
    }
    assert read(out / "fits.json")["limit_s"] == 2
    assert (out / "summary.txt").read_text().splitlines() == [
        "keeps_back: skipped, 1s left of the 100s budget",
        "fits: ok, 0s, done at 50s",
        "late: skipped, -10s left of the 100s budget",
    ]


def test_steps_are_skipped_when_a_module_or_an_earlier_step_is_missing(tmp_path):
    run = check(tmp_path)
    assert run.run(step("fails", "import sys; sys.exit(1)")) == "failed"
    assert run.run(step("after", requires=("fails",))) == "skipped"
    assert run.run(step("never_ran", requires=("nothing",))) == "skipped"
    run.missing = {"litdata": "ModuleNotFoundError: No module named 'litdata'"}
    assert run.run(step("stream", needs=("json", "litdata"))) == "skipped"
    assert run.run(step("bench", needs=("json",))) == "ok"
    assert (run.settings.out / "summary.txt").read_text().splitlines()[1:] == [
        "after: skipped, needs fails, which did not succeed",
        "never_ran: skipped, needs nothing, which did not succeed",
        "stream: skipped, not importable: litdata",
        "bench: ok, 0s, done at 0s",
    ]


@pytest.mark.slow  # subprocesses
def test_the_module_check_names_what_is_missing(tmp_path):
    run = check(tmp_path)
    run.check_modules(["json", "no_such_module_xyz", "vit.no_such_part"])
    assert run.missing == {
        "no_such_module_xyz": "ModuleNotFoundError: No module named 'no_such_module_xyz'",
        "vit.no_such_part": "ModuleNotFoundError: No module named 'vit.no_such_part'",
    }
    summary = (run.settings.out / "summary.txt").read_text()
    assert (
        "modules: missing no_such_module_xyz (ModuleNotFoundError: No module named 'no_such_module_xyz'); " in summary
    )
    assert read(run.settings.out / "modules.json")["checked"] == ["json", "no_such_module_xyz", "vit.no_such_part"]


def test_a_folder_with_results_is_not_written_again(tmp_path):
    check(tmp_path)
    with pytest.raises(UsageError, match="already holds a check's results"):
        check(tmp_path)


# ------------------------------------------------------------------------------------------------ the whole check
@pytest.mark.slow  # subprocesses
def test_main_runs_the_plan_and_writes_every_json(tmp_path, monkeypatch, capsys):
    steps = [step("first", "print('RESULT  first done')"), step("second", "import sys; sys.exit(2)"),
             step("third", requires=("second",))]  # fmt: skip
    monkeypatch.setattr(gpu_check, "plan_steps", lambda settings, scratch: steps)
    for name, value in {"WHEELS": str(tmp_path / "none"), "BUDGET_S": "1000", "ONLY": "", "DRY_RUN": "0"}.items():
        monkeypatch.setenv(name, value)
    assert gpu_check.main(["out", "--cwd", str(tmp_path)]) == 0
    out = tmp_path / "out"
    assert sorted(p.name for p in out.glob("*.json")) == ["check.json", "first.json", "modules.json", "second.json",
                                                         "third.json"]  # fmt: skip
    assert [(s["step"], s["status"]) for s in read(out / "check.json")["steps"]] == [
        ("modules", "ok"), ("first", "ok"), ("second", "failed"), ("third", "skipped")
    ]  # fmt: skip
    assert (out / "summary.txt").read_text().splitlines()[-1].startswith("total ")
    monkeypatch.setenv("ONLY", "fourth")
    with pytest.raises(SystemExit) as stop:
        gpu_check.main(["again", "--cwd", str(tmp_path)])
    assert stop.value.code == 2
    assert capsys.readouterr().err.endswith("error: ONLY: no step named fourth; the steps are: first second third\n")
    assert not (tmp_path / "again").exists()


@pytest.mark.slow  # subprocesses
def test_a_stopped_check_stops_its_step_and_says_so(tmp_path):
    """SIGTERM to the check (the call's end): the running step's process group stops too, and the summary and the
    step's JSON say so before the check exits with 143."""
    sleeper = "import os, time; print('RESULT  pid', os.getpid(), flush=True); time.sleep(120)"
    code = (
        "import sys, vit.bench.gpu_check as g; from vit.bench.gpu_check.runner import Step; "
        f"g.plan_steps = lambda settings, scratch: [Step('sleeps', 300, 0, (sys.executable, '-c', {sleeper!r}))]; "
        "sys.exit(g.main([sys.argv[1]]))"
    )
    env = {**os.environ, "WHEELS": str(tmp_path / "none"), "DRY_RUN": "0", "BUDGET_S": "600", "ONLY": ""}
    check = subprocess.Popen([PY, "-c", code, str(tmp_path / "out")], cwd=ROOT, env=env, stderr=subprocess.DEVNULL)
    log = tmp_path / "out" / "sleeps.log"
    for _ in range(600):  # until the step has started (the module check comes first)
        if log.exists() and "RESULT  pid" in log.read_text():
            break
        time.sleep(0.1)
    pid = int(log.read_text().split()[-1])
    check.send_signal(signal.SIGTERM)
    assert check.wait(timeout=60) == 143
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the step is gone with it
    summary = (tmp_path / "out" / "summary.txt").read_text().splitlines()
    assert summary[-2].startswith("sleeps: STOPPED with the check after ") and summary[-1] == f"RESULT  pid {pid}"
    assert read(tmp_path / "out" / "sleeps.json") == {"step": "sleeps", "status": "stopped", "limit_s": 300,
                                                      "log": "sleeps.log"}  # fmt: skip


@pytest.mark.slow  # subprocesses
def test_the_shell_entry_runs_python_from_the_repository_root(tmp_path):
    entry = ROOT / "scripts" / "gpu_check.sh"
    done = subprocess.run(["bash", str(entry)], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith("error: scripts/gpu_check.sh: the following arguments are required: OUTDIR")
    assert len(entry.read_text().splitlines()) <= 10 and "PYTHONPATH" not in entry.read_text()
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "summary.txt").write_text("")
    done = subprocess.run(["bash", str(entry), "taken"], capture_output=True, text=True, cwd=tmp_path)
    assert (done.returncode, done.stderr) == (2, f"error: {tmp_path / 'taken'} already holds a check's results "
                                                 "(summary.txt); give a new folder\n")  # fmt: skip


@pytest.mark.slow  # subprocesses
def test_the_entry_imports_only_the_standard_library():
    """Before the wheels are installed and the modules checked, nothing but the standard library (and vit's own
    standard-library modules) may load: the check's modules import without site-packages (``python -S``)."""
    code = (
        "import sys, vit.bench.gpu_check, vit.bench.gpu_check.plan, vit.bench.gpu_check.programs; "
        "print(sorted({m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names) - {'__main__'}))"
    )
    done = subprocess.run([PY, "-S", "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert (done.returncode, done.stdout.strip()) == (0, "['vit']"), done.stderr
    programs = subprocess.run([PY, "-S", "-m", "vit.bench.gpu_check.programs", "--help"], capture_output=True, cwd=ROOT)
    assert programs.returncode == 0


# ------------------------------------------------------------------------------------------------ the plan
@pytest.mark.parametrize("dry", [False, True])
def test_the_plan_runs_the_recipes_first_and_the_compiled_suite_last(tmp_path, dry):
    settings = Settings(out=tmp_path, python="py", dry=dry)
    steps = plan_steps(settings, tmp_path / "scratch")
    names = [s.name for s in steps]
    recipes = ["speedrun", "vit_small", "speedrun_lr2x", "vit_small_lr2x", "prepare_shards", "imagenet_stream"]
    assert names[:2] == ["environment", "cifar_data"] and names[2:8] == recipes
    assert names[-1] == "model_compiled" and ("gpu_decode" in names) is not dry
    assert set(names) <= set(LIMITS)
    by_name = {s.name: s for s in steps}
    speedrun = by_name["speedrun"].command
    assert speedrun[:4] == ("py", "-m", "vit.bench.gpu_check.programs", "fit") and "--test" in speedrun
    assert speedrun[speedrun.index("--trainer.max_time") + 1] == ("00:00:00:20" if dry else "00:00:02:45")
    assert by_name["speedrun_lr2x"].command[by_name["speedrun_lr2x"].command.index("--lr-scale") + 1] == "2"
    assert by_name["imagenet_stream"].requires == ("prepare_shards",) and "litdata" in by_name["imagenet_stream"].needs
    assert "simplejpeg" in needed_modules(steps) and "vit.cli" in needed_modules(steps)
    sizes = DRY if dry else GPU
    assert all(word in by_name["model_compiled"].command for word in (*sizes.models, "--compile"))


def test_the_wheels_step_installs_every_carried_wheel_without_an_index(tmp_path):
    settings = Settings(out=tmp_path, python="py", wheels=tmp_path / "whl")
    assert wheels_step(settings) is None
    (tmp_path / "whl").mkdir()
    for name in ("b-1-py3-none-any.whl", "a-1-py3-none-any.whl", "notes.txt"):
        (tmp_path / "whl" / name).write_text("")
    wheels = wheels_step(settings)
    assert wheels.command[:3] == ("py", "-m", "pip") and {"--no-index", "--no-deps"} <= set(wheels.command)
    assert wheels.command[-2:] == tuple(
        str(tmp_path / "whl" / n) for n in ("a-1-py3-none-any.whl", "b-1-py3-none-any.whl")
    )


def test_the_limits_follow_the_recipes_budgets_and_keep_room_for_the_later_steps(tmp_path):
    settings = Settings(out=tmp_path, python="py")
    steps = {s.name: s for s in plan_steps(settings, tmp_path)}
    for name, budget in BUDGETS_S.items():  # what the step runs is what its limit was planned for
        command = steps[name].command
        hms = command[len(command) - command[::-1].index("--trainer.max_time")]
        assert sum(int(part) * 60**i for i, part in enumerate(reversed(hms.split(":")))) == budget
        assert steps[name].max_s > budget
    for elapsed in range(0, 126):  # setup steps that took up to 125 s: the speedrun then vit_small, both whole
        speedrun, _ = step_limit(steps["speedrun"], budget_s=570, elapsed_s=elapsed)
        vit_small, _ = step_limit(steps["vit_small"], budget_s=570, elapsed_s=elapsed + speedrun)
        assert (speedrun, vit_small) == (steps["speedrun"].max_s, steps["vit_small"].max_s)
    bench = [s for s in steps.values() if s.name in BENCH_LIMITS]
    for i, step in enumerate(bench):  # each benchmark keeps back the later ones' limits, but the compiled suite's
        assert step.reserve_s == sum(later.max_s for later in bench[i + 1 :] if later.name != "model_compiled")
