"""Issue 14: nothing lost, nothing silently wrong.

Checkpoints that survive SIGKILL, a lock on the output folder, validation before anything is deleted,
date splits that parse dates, damaged or non-finite weights and metrics as errors, argument limits of
eval and generate, and a command line that starts without importing torch.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "causal_qwen.cli"]


def run_cli(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``causal-qwen ARGS`` in a fresh interpreter."""
    merged = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([*CLI, *args], cwd=REPO, env=merged, capture_output=True, text=True, timeout=timeout)


def assert_one_line_error(done: subprocess.CompletedProcess, *needles: str) -> str:
    """Exit status 2 and one line on stderr holding every needle."""
    lines = [line for line in done.stderr.splitlines()
             if line.strip() and not line.startswith(("WARNING", "warning: "))]
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    assert len(lines) == 1, done.stderr[-3000:]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


# ---- start-up ----------------------------------------------------------------------------------------------
def test_help_and_version_start_without_torch():
    code = ("import sys, time; t = time.perf_counter(); from causal_qwen.cli import build_parser; build_parser(); "
            "print(time.perf_counter() - t); print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'torch', 'transformers', 'numpy', 'tokenizers', 'matplotlib'}))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    seconds, heavy = done.stdout.splitlines()
    assert heavy == "[]", heavy
    assert float(seconds) < 1.0
    begin = time.perf_counter()
    helped = run_cli("--help")
    assert helped.returncode == 0 and "train" in helped.stdout
    assert time.perf_counter() - begin < 2.0
    version = run_cli("--version")
    assert version.returncode == 0 and version.stdout.strip().startswith("causal-qwen 0.")


def test_a_logged_warning_reads_as_the_commands_own():
    """Without --verbose a library warning prints as ``warning: ...``, the form of the commands' own warnings."""
    import logging

    from causal_qwen.cli import PlainFormatter

    record = logging.LogRecord("causal_qwen.training.data", logging.WARNING, __file__, 1, "row %d: %s", (1, "odd"),
                               None)
    assert PlainFormatter().format(record) == "warning: row 1: odd"


def test_command_choices_match_the_library():
    from causal_qwen.commands import eval as eval_command
    from causal_qwen.commands import generate as generate_command
    from causal_qwen.core.generation import MODES
    from causal_qwen.evaluation.evaluation import METRIC_SETS

    assert eval_command.METRIC_SETS == METRIC_SETS
    assert generate_command.MODES == MODES


# ---- shared assets: a tiny model over a byte-level vocabulary, a 48-row CSV ---------------------------------
TEMPLATE = "Day {day}: the value was {value} units."


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> Path:
    """``converted/`` (a width-16 CausalQwen of 258 rows, no conversion-time calibration) and ``data.csv``."""
    from causal_qwen.conversion.loading import convert_base

    from .conftest import byte_level_tokenizer, small_qwen

    root = tmp_path_factory.mktemp("robustness_assets")
    tokenizer = byte_level_tokenizer()
    small_qwen(tied=True, vocab_size=len(tokenizer), hidden_size=16).save_pretrained(root / "base")
    tokenizer.save_pretrained(root / "base")
    model, tokenizer = convert_base(str(root / "base"), ovr_calibration="none")
    model.save_pretrained(root / "converted")
    tokenizer.save_pretrained(root / "converted")
    rows = ["day,value"] + [f"{day},{(day * 37) % 50 / 4}" for day in range(1, 49)]
    (root / "data.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return root


def settings(assets: Path, out: Path, **overrides) -> dict:
    """Six fast steps (frozen backbone), a checkpoint every 2 (the last 2 kept), evaluation at 3 and 6."""
    values = dict(
        model=str(assets / "converted"), data=str(assets / "data.csv"), template=TEMPLATE, output_dir=str(out),
        seed=0, max_steps=6, batch_size=2, max_length=48, learning_rate=1e-2, lr_scheduler_type="linear",
        warmup_steps=0, logging_steps=1, validation_split=0.1, eval_steps=3, max_eval_samples=2, save_steps=2,
        save_total_limit=2, report_to=["none"], progress_bar=False, monitor_positions=0, freeze_backbone=True,
        model_config={"ovr_negatives": 64}, target="value",
        # every recipe setting given, so these tests see one fixed set-up whatever the recipes become
        regression_learning_rate=1e-3, numeric_embedding_learning_rate=1e-3, backbone_learning_rate=1e-5,
        freeze_decision_scale=True, regression_warm_start=False, num_token_warm_start=False, interval_check=False,
    )
    values.update(overrides)
    return values


def write_config(path: Path, values: dict) -> Path:
    path.write_text(yaml.safe_dump(values), encoding="utf-8")
    return path


def train_in_child(values: dict, resume: bool, fault: str | None, messages: str, step_pause: float = 0.0) -> None:
    """A training run in a forked child (forkserver: torch is imported once); ``fault`` sets CAUSAL_QWEN_FAULT;
    ``step_pause``: seconds of sleep after each step (a run that lasts without taking a core from the test)."""
    import gc

    import torch
    from transformers import TrainerCallback

    from causal_qwen.training.run_folder import FAULT_ENV
    from causal_qwen.training.train_config import TrainConfig
    from causal_qwen.training.training import run_training

    torch.set_num_threads(1)
    gc.freeze()  # the training stack the server imported: the run's closing gc.collect() need not walk it
    if fault:
        os.environ[FAULT_ENV] = fault
    else:
        os.environ.pop(FAULT_ENV, None)

    def report(message: str) -> None:
        with open(messages, "a", encoding="utf-8") as handle:
            handle.write(message + "\n")

    class Pause(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            time.sleep(step_pause)

    callbacks = [Pause()] if step_pause else []
    run_training(TrainConfig(**values).validate("fault test"), resume=resume, report=report, callbacks=callbacks)


@pytest.fixture(scope="module")
def children():
    """A forkserver context whose server has imported the training stack (a child starts in milliseconds)."""
    import multiprocessing

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["causal_qwen.training.training", "tests.test_robustness"])
    return context


def run_child(children, values: dict, resume: bool, messages: Path, fault: str | None = None,
              kill_after: float | None = None) -> int | None:
    """Run `train_in_child`; SIGKILL it after ``kill_after`` seconds if it still runs. Returns its exit code."""
    process = children.Process(target=train_in_child, args=(values, resume, fault, str(messages)))
    process.start()
    process.join(kill_after)
    if process.is_alive():
        process.kill()
        process.join()
    return process.exitcode


# ---- checkpoints that survive SIGKILL ----------------------------------------------------------------------
CHECKPOINT_FILES = ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json")
# Deterministic kills inside the checkpoint and final writes (causal_qwen.training.run_folder.fault_point).
FAULTS = (
    "checkpoint.model_written:1", "checkpoint.model_written:3", "publish.checkpoint.staged:1",
    "publish.checkpoint.staged:2", "publish.checkpoint.renamed:2", "remove.renamed:1", "publish.final.staged:1",
    "publish.final.renamed:1",
)


def checkpoint_steps(out: Path) -> list[int]:
    """Steps of the ``checkpoint-N`` folders, asserting each is complete (no partial one under that name)."""
    steps = []
    for folder in out.glob("checkpoint-*"):
        missing = [name for name in CHECKPOINT_FILES if not (folder / name).is_file()]
        assert not missing, (folder, missing)
        step = int(folder.name.split("-")[1])
        assert json.loads((folder / "trainer_state.json").read_text())["global_step"] == step
        steps.append(step)
    return sorted(steps)


def final_weights(out: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(out / "final" / "model.safetensors")


def metric_steps(out: Path) -> tuple[list[dict], list[int]]:
    from causal_qwen.training.monitoring import read_metrics

    records = read_metrics(out / "metrics.jsonl")
    return [r for r in records if "loss" in r], [r["step"] for r in records if "eval_loss" in r]


def resume_until_done(children, values: dict, messages: Path, rng: random.Random, kills: int,
                      window: tuple[float, float]) -> None:
    """Resume (or start, when the killed run had not started training) until a run ends; ``kills`` of the
    attempts are SIGKILLed at a random moment of ``window`` (seconds). Checks before every attempt that every
    checkpoint is complete and that the attempt names the newest one."""
    out = Path(values["output_dir"])
    for attempt in range(kills + 1):
        steps = checkpoint_steps(out) if out.is_dir() else []
        started = (out / "train_config.yaml").is_file()
        before = messages.read_text().splitlines() if messages.is_file() else []
        kill_after = rng.uniform(*window) if attempt < kills else 120
        code = run_child(children, values, started, messages, kill_after=kill_after)
        lines = messages.read_text().splitlines()[len(before):]
        if started and lines:
            if steps and steps[-1] < values["max_steps"]:
                assert lines[0].startswith(f"resuming from checkpoint-{steps[-1]} (step {steps[-1]} of 6)"), lines
            elif steps:
                assert "finished" in lines[0], lines
            else:
                assert lines[0].startswith("no complete checkpoint in"), lines
        if code == 0:
            return
        assert code == -signal.SIGKILL, (attempt, code)
    raise AssertionError(f"{out}: the last attempt did not finish")


@pytest.mark.slow
def test_sigkill_anywhere_resumes_to_the_uninterrupted_weights(assets, tmp_path, children):
    """22 killed runs: 8 at fixed points inside checkpoint and final writes, the others at random moments (half
    of whose resumes are killed again); each resumes to the uninterrupted run's exact weights and metrics."""
    reference_dir = tmp_path / "reference"
    assert run_child(children, settings(assets, reference_dir), False, tmp_path / "reference.txt", kill_after=120) == 0
    begin = time.time()  # a second uninterrupted run (the fork server now warm) times the kill window
    timed = tmp_path / "timed"
    assert run_child(children, settings(assets, timed), False, tmp_path / "timed.txt", kill_after=120) == 0
    assert all(torch_equal(final_weights(timed)[name], t) for name, t in final_weights(reference_dir).items())
    # Random kills fall between a little before the run touches its folder and the end of the run.
    window = (0.8 * ((timed / "train_config.yaml").stat().st_mtime - begin), 0.9 * (time.time() - begin))
    reference = final_weights(reference_dir)
    reference_train, reference_eval = metric_steps(reference_dir)
    assert [r["step"] for r in reference_train] == [1, 2, 3, 4, 5, 6] and reference_eval == [3, 6]
    assert checkpoint_steps(reference_dir) == [4, 6]

    rng = random.Random(14)
    interrupted = 0
    for index, fault in enumerate(kill_scenarios()):
        if interrupted >= KILLED_RUNS:
            break
        values = settings(assets, tmp_path / f"run{index}")
        messages = tmp_path / f"run{index}.txt"
        delay = None if fault is not None else rng.uniform(*window)
        run_started = time.time()
        code = run_child(children, values, False, messages, fault=fault, kill_after=delay if fault is None else 120)
        if fault is not None:
            assert code == -signal.SIGKILL, (fault, code)
        elif code == 0:  # it ended before its kill: the machine runs faster now than when the window was timed
            window = retimed(window, time.time() - run_started)
        if code != 0:
            interrupted += 1
            resume_until_done(children, values, messages, rng, kills=index % 2 if fault is None else 0, window=window)
        out = Path(values["output_dir"])
        weights = final_weights(out)
        for name, tensor in reference.items():
            assert torch_equal(weights[name], tensor), (index, fault, delay, name)
        train, evaluated = metric_steps(out)
        assert [r["step"] for r in train] == [1, 2, 3, 4, 5, 6], (index, fault, delay, train)
        assert evaluated == [3, 6], (index, fault, delay)
        for mine, theirs in zip(train, reference_train):
            assert mine["loss"] == pytest.approx(theirs["loss"], rel=1e-6), (index, fault, delay)
        assert checkpoint_steps(out) == [4, 6]
        assert not [p.name for p in out.iterdir() if p.name.startswith((".staging", ".trash"))], index
    said = "".join(path.read_text() for path in tmp_path.glob("run*.txt"))
    for phrase in ("resuming from checkpoint-2 ", "resuming from checkpoint-4 ", "starting from step 0",
                   "writing final/ from checkpoint-6", "already finished at step 6"):
        assert phrase in said, phrase
    assert interrupted >= KILLED_RUNS, interrupted


def test_cli_killed_during_a_checkpoint_write_resumes_and_says_which(assets, tmp_path, children):
    """A run SIGKILLed inside the write of checkpoint-4 (after the model file, before the optimizer's):
    ``causal-qwen train --resume`` names checkpoint-2, never the half-written one, and ends like a straight run.
    (The killed run is a forked child, as in the test above; the command is the resume.)"""
    out = tmp_path / "run"
    values = settings(assets, out)
    config = write_config(tmp_path / "c.yaml", values)
    messages = tmp_path / "killed.txt"
    code = run_child(children, values, False, messages, fault="checkpoint.model_written:2", kill_after=120)
    assert code == -signal.SIGKILL, code
    assert "data: 43 training and 5 validation documents" in messages.read_text()
    assert checkpoint_steps(out) == [2] and (out / ".staging" / "checkpoint-4" / "model.safetensors").is_file()
    resumed = run_cli("train", str(config), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert resumed.stdout.startswith("resuming from checkpoint-2 (step 2 of 6)"), resumed.stdout[:300]
    assert "trained 6 steps (4 of them after resuming, mean loss" in resumed.stdout  # the mean of this session's
    train, evaluated = metric_steps(out)
    assert [r["step"] for r in train] == [1, 2, 3, 4, 5, 6] and evaluated == [3, 6]
    assert checkpoint_steps(out) == [4, 6] and not (out / ".staging").exists()


KILLED_RUNS = 22


def kill_scenarios(most: int = 60):
    """Each of `FAULTS`, then ``None`` (a kill at a random moment) until ``most`` runs (the caller stops once
    enough runs were killed; a run may end before its random kill)."""
    yield from FAULTS
    for _ in range(most - len(FAULTS)):
        yield None


def retimed(window: tuple[float, float], run_seconds: float) -> tuple[float, float]:
    """The kill window scaled to a whole run that took ``run_seconds``: its end at 0.9 of the run, its start in
    the same proportion. On a shared machine a run's length changes with the load beside it."""
    factor = 0.9 * run_seconds / window[1]
    return window[0] * factor, window[1] * factor


def torch_equal(a, b) -> bool:
    import torch

    return bool(torch.equal(a, b))


# ---- the output folder: validation before deletion, lock, finished runs -----------------------------------------
def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``folder`` with its size and modification time (ns); the lock file aside (each run
    writes its pid there while it lasts)."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")
            if p.is_file() and p.name != ".lock"}


@pytest.fixture(scope="module")
def finished_run(assets, tmp_path_factory, children) -> Path:
    """A finished six-step run (checkpoints 4 and 6, final/, metrics.jsonl)."""
    out = tmp_path_factory.mktemp("finished") / "run"
    assert run_child(children, settings(assets, out), False, out.parent / "messages.txt", kill_after=120) == 0
    return out


def cli_error(capsys, *argv: str) -> str:
    """``causal-qwen ARGV`` in this process: exit status 2 and one line on stderr, returned."""
    from causal_qwen.cli import main as cli_main

    assert cli_main(list(argv)) == 2
    lines = [line for line in capsys.readouterr().err.splitlines()
             if line.strip() and not line.startswith(("WARNING", "warning: "))]
    assert len(lines) == 1, lines
    return lines[0]


def test_overwrite_with_bad_data_deletes_nothing(assets, finished_run, tmp_path, capsys):
    before = snapshot(finished_run)
    config = write_config(tmp_path / "c.yaml", settings(assets, finished_run, overwrite_output_dir=True))
    bad = tmp_path / "bad.csv"
    bad.write_text("day,value\n1,2.5\n2,lots\n3,4.0\n", encoding="utf-8")
    line = cli_error(capsys, "train", str(config), "--set", f"data={bad}")
    assert f"{bad}: row 2 (line 3): template field 'value' holds 'lots'" in line
    bad_split = cli_error(capsys, "train", str(config), "--set", "split_by=value", "--set", "split_at=tomorrow",
                          "--set", "validation_split=0")
    assert "split_at 'tomorrow' is not a number" in bad_split
    assert snapshot(finished_run) == before
    assert sorted(p.name for p in finished_run.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-6"]


def test_output_dir_that_is_a_file(assets, tmp_path, capsys):
    a_file = tmp_path / "occupied"
    a_file.write_text("keep me", encoding="utf-8")
    config = write_config(tmp_path / "c.yaml", settings(assets, a_file))
    line = cli_error(capsys, "train", str(config))
    assert f"output_dir '{a_file}' is a file, not a folder" in line
    assert a_file.read_text() == "keep me"


def test_resuming_a_finished_run_does_nothing_and_says_so(assets, finished_run, tmp_path, capsys):
    from causal_qwen.cli import main as cli_main

    before = snapshot(finished_run)
    config = write_config(tmp_path / "c.yaml", settings(assets, finished_run))
    assert cli_main(["train", str(config), "--resume"]) == 0
    out = capsys.readouterr().out
    assert "already finished at step 6" in out and "nothing to do" in out
    assert snapshot(finished_run) == before
    assert not (finished_run / "checkpoint-7").exists()
    line = cli_error(capsys, "train", str(config))  # a fresh start would clobber the finished run
    assert "already holds checkpoints or a trained model (latest checkpoint-6, final/)" in line


def test_resuming_a_finished_run_clears_what_a_kill_after_publishing_left(assets, finished_run, tmp_path):
    """A run killed between publishing ``final/`` and removing the emptied ``.staging/`` (or deleting the moved-aside
    ``.trash-*`` folder) is finished: its resume trains nothing, removes those leftovers and keeps every other file."""
    import shutil

    from causal_qwen.training.train_config import TrainConfig
    from causal_qwen.training.training import run_training

    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    before = snapshot(run)
    (run / ".staging").mkdir()
    (run / ".trash-checkpoint-2").mkdir()
    (run / ".trash-checkpoint-2" / "model.safetensors").write_bytes(b"old")
    said: list[str] = []
    result = run_training(TrainConfig(**settings(assets, run)).validate("test"), resume=True, report=said.append)
    assert not result.trained and result.global_step == 6
    assert any("already finished at step 6" in line for line in said), said
    assert not (run / ".staging").exists() and not (run / ".trash-checkpoint-2").exists()
    assert snapshot(run) == before


def test_partial_checkpoint_is_skipped_and_named(assets, finished_run, tmp_path):
    """A checkpoint folder without its trainer state (as a killed run of an older version could leave) is
    never resumed from: --resume names it and takes the newest complete one."""
    import shutil

    from causal_qwen.training.run_folder import plan_run

    copy = tmp_path / "run"
    shutil.copytree(finished_run, copy)
    shutil.rmtree(copy / "final")
    (copy / "checkpoint-6" / "trainer_state.json").unlink()
    plan = plan_run(copy, max_steps=6, resume=True, overwrite=False)
    assert plan.checkpoint == str(copy / "checkpoint-4")
    assert plan.message.startswith("resuming from checkpoint-4 (step 4 of 6); skipped checkpoint-6 (no readable")


def hold_output_dir(children, assets: Path, out: Path):
    """A training run into ``out`` that lasts (many steps); returns the process once it holds the lock."""
    values = settings(assets, out, max_steps=100000, save_steps=0, eval_steps=0, validation_split=0.0)
    process = children.Process(target=train_in_child, args=(values, False, None, str(out.parent / "holder.txt"), 0.2))
    process.start()
    deadline = time.time() + 60
    while time.time() < deadline:
        lock = out / ".lock"
        if lock.is_file() and str(process.pid) in lock.read_text():
            return process
        time.sleep(0.05)
    process.kill()
    raise AssertionError("the first run never took the lock")


def test_second_run_into_a_locked_folder_fails_at_once(assets, tmp_path, children):
    from causal_qwen.training.train_config import TrainConfig
    from causal_qwen.training.training import run_training

    out = tmp_path / "shared"
    holder = hold_output_dir(children, assets, out)
    try:
        begin = time.perf_counter()
        with pytest.raises(ValueError, match=rf"in use by another run \(pid {holder.pid} on host "):
            run_training(TrainConfig(**settings(assets, out)).validate("second"))
        assert time.perf_counter() - begin < 1.0
        config = write_config(tmp_path / "c.yaml", settings(assets, out))
        done = run_cli("train", str(config), env={"PYTHONPROFILEIMPORTTIME": "1"})
        imported = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if "import time:" in line]
        assert "causal_qwen.training.run_folder" in imported and "causal_qwen.training.training" not in imported, \
            "checked before the training stack loads"
        done.stderr = "\n".join(line for line in done.stderr.splitlines() if not line.startswith("import time:"))
        assert_one_line_error(done, f"output_dir '{out}' is in use by another run (pid {holder.pid} on host")
        assert holder.is_alive(), "the first run goes on"
    finally:
        holder.kill()
        holder.join()
    assert not list(out.glob("checkpoint-*")) and not (out / "final").exists()


# ---- date splits -------------------------------------------------------------------------------------------
def test_date_split_parses_dates_and_reports_sizes(tmp_path, finished_run):
    import datetime

    from causal_qwen.training.data import DataSource, SplitSpec, read_documents, split_documents

    stocks = read_documents(DataSource(path="vega:stocks.csv", template="{symbol} {price}", split_by="date"))
    for split_at in ("Jan 1 2009", "2009-01-01", datetime.date(2009, 1, 1)):
        train, valid = split_documents(stocks, SplitSpec(split_by="date", split_at=split_at))
        assert (len(train), len(valid)) == (485, 75), split_at  # 2009-2010 of five symbols; text order gave 227/333
        assert all(doc.split_value.endswith(("2009", "2010")) for doc in valid)
    table = tmp_path / "t.csv"
    table.write_text("date,v\n2012-01-01,1\n2012-01-02,2\nsoon,3\n2012-01-04,4\n", encoding="utf-8")
    documents = read_documents(DataSource(path=str(table), template="{v}", split_by="date"))
    with pytest.raises(ValueError, match=r"row 3: split_by column 'date' holds 'soon', which is not a number and not a date"):
        split_documents(documents, SplitSpec(split_by="date", split_at="2012-01-03"))
    with pytest.raises(ValueError, match=r"split_at 'next year' is not a date"):
        split_documents(stocks, SplitSpec(split_by="date", split_at="next year"))
    said = (finished_run.parent / "messages.txt").read_text()
    assert "data: 43 training and 5 validation documents (a random 10% of the rows; evaluating the first 2)" in said


# ---- damaged weights, non-finite figures, number index, eval settings from the run ----------------------------
def damaged_copy(finished_run: Path, tmp_path: Path, how: str) -> Path:
    """A copy of the run's final/ with its model.safetensors truncated or its tensor bytes replaced by noise."""
    import shutil

    folder = tmp_path / how
    shutil.copytree(finished_run / "final", folder)
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    if how == "truncated":
        weights.write_bytes(data[: len(data) // 2])
    else:
        header = 8 + int.from_bytes(data[:8], "little")
        weights.write_bytes(data[:header] + random.Random(0).randbytes(len(data) - header))
    return folder


@pytest.mark.parametrize("how", ["truncated", "noise"])
def test_damaged_weights_are_one_line_errors(finished_run, assets, tmp_path, capsys, how):
    folder = damaged_copy(finished_run, tmp_path, how)
    line = cli_error(capsys, "eval", "--model", str(folder), "--data", str(assets / "data.csv"), "--template", TEMPLATE)
    assert f"weights file '{folder / 'model.safetensors'}'" in line
    assert ("is damaged" in line) if how == "truncated" else ("NaN/infinite values" in line)


def test_non_finite_figures_are_errors_and_undefined_ones_null():
    from causal_qwen.evaluation.evaluation import checked_metrics

    with pytest.raises(ValueError, match=r"model 'm' gives non-finite figures \(perplexity inf, ovr_prob_sum nan\)"):
        checked_metrics({"token_count": 9, "perplexity": float("inf"), "ovr_prob_sum": float("nan")}, "model 'm'")
    fine = checked_metrics({"num_count": 3, "num_mdae": 1.0, "num_scale_error_spearman": float("nan"),
                            "calibration": [{"nominal": 0.5, "empirical": float("nan")}]})
    assert fine["num_scale_error_spearman"] is None and fine["calibration"][0]["empirical"] is None
    json.dumps(fine, allow_nan=False)


def test_number_index_out_of_range_is_an_error(finished_run, assets, capsys):
    line = cli_error(capsys, "eval", "--model", str(finished_run / "final"), "--data", str(assets / "data.csv"),
                     "--metrics", "numbers", "--number-index", "9")
    assert "--number-index 9 is out of range: the documents hold at most 2 numbers each (0..1 from the start" in line


def test_eval_reads_the_runs_config_and_scores_the_target(finished_run, tmp_path, capsys):
    from causal_qwen.cli import main as cli_main

    report = tmp_path / "m.json"
    assert cli_main(["eval", "--model", str(finished_run / "final"), "--metrics", "numbers", "--json", str(report)]) == 0
    out = capsys.readouterr().out
    assert f"settings from {finished_run / 'train_config.yaml'}" in out and "target value" in out
    assert "training's validation rows (10%)" in out
    assert any(line.startswith("numbers scored: the target field") and line.endswith(" value") for line in out.splitlines())
    metrics = json.loads(report.read_text())
    assert metrics["documents"] == 5 and metrics["num_count"] == 5 and metrics["number_target"] == "value"
    assert metrics["num_mdae_training_median"] > 0 and "forecasting the training rows' median" in out
    assert cli_main(["eval", "--config", str(finished_run / "train_config.yaml"), "--model", str(finished_run / "final"),
                     "--metrics", "numbers", "--all-numbers", "--json", str(report)]) == 0
    metrics = json.loads(report.read_text())
    assert metrics["num_count"] == 10 and "number_target" not in metrics  # day and value of 5 documents
    assert "note:" not in capsys.readouterr().out
    # A model converted from a random preset gets a note under its language figures (they say nothing of text).
    random_preset = tmp_path / "from-random" / "final"  # the run's final model, beside its train_config.yaml
    shutil.copytree(finished_run / "final", random_preset)
    shutil.copy(finished_run / "train_config.yaml", random_preset.parent)
    saved = json.loads((random_preset / "config.json").read_text())
    (random_preset / "config.json").write_text(json.dumps({**saved, "converted_from": "random:tiny"}))
    for folder, noted in ((finished_run / "final", False), (random_preset, True)):
        assert cli_main(["eval", "--model", str(folder), "--metrics", "all"]) == 0
        out = capsys.readouterr().out
        assert ("note: a model converted from random:tiny (random weights) learns a table's numbers, not language"
                in out) is noted and "perplexity" in out


def test_eval_says_when_it_scores_trained_rows_or_another_target(finished_run, tmp_path, capsys):
    from causal_qwen.cli import main as cli_main

    saved = yaml.safe_load((finished_run / "train_config.yaml").read_text())
    unsplit = tmp_path / "unsplit.yaml"
    unsplit.write_text(yaml.safe_dump({**saved, "validation_split": 0.0, "split_by": None, "split_at": None}))
    model = str(finished_run / "final")
    assert cli_main(["eval", "--config", str(unsplit), "--model", model, "--metrics", "numbers"]) == 0
    out = capsys.readouterr().out
    assert "every row" in out and "note: the run trained on every row of" in out and "not a forecast" in out
    assert cli_main(["eval", "--model", model, "--metrics", "numbers", "--target", "day"]) == 0
    out = capsys.readouterr().out
    assert "note: the run's intervals were fitted and checked for 'value', not 'day'" in out
    # A --target that is no field of the template: the one error line, before any setting or note is printed.
    assert cli_main(["eval", "--model", model, "--metrics", "numbers", "--target", "valeu"]) == 2
    printed = capsys.readouterr()
    assert printed.out == "" and printed.err.strip().splitlines() == [
        f"causal-qwen eval: error: the field 'valeu' is not a field of the template {saved['template']!r}"]


# ---- generation within the model's positions ---------------------------------------------------------------
def test_generation_caps_at_the_position_limit(assets, caplog):
    from causal_qwen.conversion.loading import load_model_and_tokenizer
    from causal_qwen.core.text_generation import generate

    model, tokenizer = load_model_and_tokenizer(model_dir=str(assets / "converted"))
    limit = model.config.max_position_embeddings  # 256
    prompt = "Day 1: the value was"
    prompt_tokens = int(tokenizer([prompt], return_tensors="pt")["input_ids"].shape[-1])
    with caplog.at_level("WARNING", logger="causal_qwen.core.generation"):
        result = generate(model, tokenizer, prompt, max_new_tokens=1_000_000_000, min_new_tokens=0)[0]
    assert f"max_new_tokens=1,000,000,000 would pass the model's {limit} positions" in caplog.text
    assert f"generating at most {limit - prompt_tokens} tokens" in caplog.text
    assert len(result.token_ids) <= limit - prompt_tokens
    with pytest.raises(ValueError, match=rf"prompt 0 is {limit + 4:,} tokens long; the model reads at most {limit}"):
        generate(model, tokenizer, "x" * (limit + 4), max_new_tokens=5)


# ---- one source for the demo and the example ---------------------------------------------------------------
def test_the_demo_trains_with_the_example_settings():
    from causal_qwen.evaluation import demo
    from causal_qwen.training.train_config import load_train_config

    example = yaml.safe_load((REPO / "examples" / "seattle_weather_demo.yaml").read_text())
    settings = demo.DemoSettings()
    overrides = settings.training_overrides()
    own = {"model", "output_dir", "save_steps", "report_to", "overwrite_output_dir"}  # the demo's folder, no files
    for key, value in example.items():
        if key not in own:
            assert overrides[key] == load_train_config(REPO / "examples" / "seattle_weather_demo.yaml").to_dict()[key], key
    assert (settings.base, settings.template, settings.target) == (example["model"], example["template"], example["target"])
    assert demo.DEMO_TEMPLATE == example["template"]  # what benchmarks/number_tables.py imports


# ---- bases and output paths that cannot work ---------------------------------------------------------------
def test_unreachable_hub_id_fails_at_once(tmp_path, capsys, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    begin = time.perf_counter()
    line = cli_error(capsys, "convert", "--base", "nobody-here/no-model-14", "--out", str(tmp_path / "out"))
    assert time.perf_counter() - begin < 15
    assert "cannot reach the Hugging Face hub for 'nobody-here/no-model-14'" in line
    assert "pass a local folder or a .gguf file instead" in line
    assert not (tmp_path / "out").exists()


def test_convert_out_that_is_a_file(tmp_path, capsys):
    a_file = tmp_path / "model"
    a_file.write_text("keep me", encoding="utf-8")
    line = cli_error(capsys, "convert", "--base", "random:tiny", "--out", str(a_file))
    assert f"--out '{a_file}' is a file, not a folder" in line and a_file.read_text() == "keep me"


# ---- what a new user meets: model folders, paths, failed first runs ---------------------------------------
def test_a_checkpoint_loads_as_a_model_folder_and_a_broken_folder_is_named(assets, finished_run, tmp_path, capsys):
    """Every checkpoint-N holds the tokenizer (eval/predict/generate take it as --model); a folder without its
    tokenizer or its weights gets a one-line error naming what is missing."""
    import shutil

    from causal_qwen.cli import main as cli_main

    assert cli_main(["predict", "--model", str(finished_run / "checkpoint-4"), "--top-k", "2", "day 3"]) == 0
    printed = capsys.readouterr().out
    assert "next step after 'day 3'" in printed
    # The interval's ends are written at the precision of the median they surround.
    median, *ends = re.search(r"written as (\S+) .*50% \[(\S+), (\S+)\], 90% \[(\S+), (\S+)\]", printed).groups()
    assert {len(end.partition(".")[2]) for end in ends} == {len(median.partition(".")[2])}
    no_tokenizer = tmp_path / "no_tokenizer"
    shutil.copytree(assets / "converted", no_tokenizer)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json"):
        (no_tokenizer / name).unlink(missing_ok=True)
    assert "holds no tokenizer" in cli_error(capsys, "predict", "--model", str(no_tokenizer), "day 3")
    no_weights = tmp_path / "no_weights"
    shutil.copytree(assets / "converted", no_weights)
    for file in no_weights.glob("*.safetensors"):
        file.unlink()
    assert "holds no weights" in cli_error(capsys, "predict", "--model", str(no_weights), "day 3")
    edited = tmp_path / "edited_config"
    shutil.copytree(assets / "converted", edited)
    config = json.loads((edited / "config.json").read_text())
    config["hidden_size"] *= 2
    (edited / "config.json").write_text(json.dumps(config))
    assert "config.json does not match the weights" in cli_error(capsys, "predict", "--model", str(edited), "day 3")
    (edited / "config.json").write_text('{"a": 1}')
    assert "its config.json names no model_type" in cli_error(capsys, "predict", "--model", str(edited), "day 3")


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json"])
def test_a_damaged_tokenizer_file_is_a_one_line_error_naming_it(assets, tmp_path, capsys, name):
    """A truncated tokenizer.json ended in the tokenizers parser's traceback (``Exception: EOF while parsing``), a
    truncated tokenizer_config.json in a line that named no file."""
    import shutil

    folder = tmp_path / "damaged"
    shutil.copytree(assets / "converted", folder)
    data = (folder / name).read_bytes()
    (folder / name).write_bytes(data[: len(data) // 2])
    line = cli_error(capsys, "predict", "--model", str(folder), "day 3")
    assert f"tokenizer file '{folder / name}' is damaged" in line


def test_a_file_that_is_no_base_is_named(tmp_path, capsys):
    table = tmp_path / "table.csv"
    table.write_text("a,b\n1,2\n", encoding="utf-8")
    assert "is a file but not a .gguf one" in cli_error(capsys, "convert", "--base", str(table), "--out", str(tmp_path / "o"))
    empty = tmp_path / "empty.gguf"
    empty.touch()
    assert f"GGUF file '{empty}' is empty" in cli_error(capsys, "convert", "--base", str(empty), "--out", str(tmp_path / "o"))
    assert not (tmp_path / "o").exists()


def test_a_first_run_stopped_by_bad_data_leaves_no_folder(assets, tmp_path, capsys):
    out = tmp_path / "runs" / "deeper" / "new_run"
    config = write_config(tmp_path / "c.yaml", settings(assets, out))
    bad = tmp_path / "bad.csv"
    bad.write_text("day,value\n1,2.5\n2,lots\n", encoding="utf-8")
    assert "holds 'lots'" in cli_error(capsys, "train", str(config), "--set", f"data={bad}")
    assert not (tmp_path / "runs").exists(), "nor the folders made for it"


def test_the_saved_config_names_the_data_by_its_absolute_path(assets, tmp_path, monkeypatch):
    from causal_qwen.training.train_config import TrainConfig
    from causal_qwen.training.training import saved_settings

    monkeypatch.chdir(assets)
    config = TrainConfig(**settings(assets, tmp_path / "run", data="data.csv"))
    assert saved_settings(config)["data"] == str((assets / "data.csv").resolve())
    assert config.data == "data.csv"


def test_eval_split_at_alone_cuts_the_configs_column(assets, finished_run, capsys):
    from causal_qwen.cli import main as cli_main

    assert cli_main(["eval", "--model", str(finished_run / "final"), "--split-at", "40"]) == 2  # the run split at random
    assert "--split-at needs --split-by" in capsys.readouterr().err
    assert cli_main(["eval", "--model", str(finished_run / "final"), "--split-by", "day", "--split-at", "40"]) == 0
    assert "the rows with day >= '40'" in capsys.readouterr().out


def test_generate_checks_where_the_individual_goes_before_generating(assets, tmp_path, capsys):
    occupied = tmp_path / "a_file"
    occupied.write_text("", encoding="utf-8")
    line = cli_error(capsys, "generate", "--model", str(assets / "converted"), "--mode", "causal",
                     "--individual-scope", "sequence", "--seed", "1", "--save-individual", str(occupied / "me.json"), "day 3")
    assert "is not a writable folder" in line


def test_a_model_folder_that_does_not_exist_is_named_so(tmp_path, capsys):
    missing = tmp_path / "no_such_model"
    assert f"model folder '{missing}' does not exist" in cli_error(capsys, "predict", "--model", str(missing), "day 3")
    # eval too, before it looks for the data in the folder's train_config.yaml (was: "--data is required")
    assert f"model folder '{missing}' does not exist" in cli_error(capsys, "eval", "--model", str(missing))


def test_a_run_folder_given_as_a_model_points_to_where_its_model_is(finished_run, tmp_path, capsys):
    """A run's folder, a LoRA checkpoint and an unfinished run's folder each say where the model is."""
    line = cli_error(capsys, "eval", "--model", str(finished_run))
    assert f"its model is '{finished_run / 'final'}'" in line
    lora_checkpoint = tmp_path / "lora_run" / "checkpoint-20"
    lora_checkpoint.mkdir(parents=True)
    (lora_checkpoint / "adapter_config.json").write_text("{}", encoding="utf-8")
    line = cli_error(capsys, "generate", "--model", str(lora_checkpoint), "day 3")
    assert "it is a LoRA checkpoint" in line and "final/" in line
    assert "unfinished training run's folder" in cli_error(capsys, "predict", "--model", str(lora_checkpoint.parent), "day 3")
    assert "holds no config.json" in cli_error(capsys, "predict", "--model", str(tmp_path), "day 3")


def test_train_names_a_missing_model_before_reading_the_data(assets, tmp_path, capsys):
    missing = tmp_path / "no_such_model"
    config = write_config(tmp_path / "c.yaml", settings(assets, tmp_path / "run", model=str(missing),
                                                        data=str(tmp_path / "no_such_data.csv")))
    line = cli_error(capsys, "train", str(config))
    assert "no_such_model" in line and "no_such_data" not in line
    empty_folder = tmp_path / "empty"
    empty_folder.mkdir()
    assert f"model folder '{empty_folder}' holds no config.json" in cli_error(
        capsys, "train", str(config), "--set", f"model={empty_folder}")


def test_eval_scores_the_target_of_a_template_that_opens_with_a_number(assets, tmp_path, capsys):
    """``{day}: ... {value}``: the opening number has no prediction but is the document's number 0, so the
    target (number 1) is scored on every document, as it is when a word comes first."""
    from causal_qwen.cli import main as cli_main

    scores = {}
    for name, template in {"opens": "{day}: the value was {value}.", "word first": "Day {day}: the value was {value}."}.items():
        report = tmp_path / f"{name}.json"
        assert cli_main(["eval", "--model", str(assets / "converted"), "--data", str(assets / "data.csv"),
                         "--template", template, "--target", "value", "--metrics", "numbers",
                         "--json", str(report)]) == 0
        scores[name] = json.loads(report.read_text())
    capsys.readouterr()
    assert scores["opens"]["num_count"] == scores["word first"]["num_count"] == 48
    assert scores["opens"]["number_target"] == "value"


def test_train_into_a_log_prints_a_line_per_logging_step_not_bars_or_raw_dictionaries(assets, tmp_path, capsys):
    """``causal-qwen train`` whose output is not a terminal (a log file, CI): Trainer's step bar wrote every refresh
    into the log and the raw log dictionaries went to stdout. Now one readable line per logging step, and the
    bar only on a terminal (or with progress_bar true and --progress)."""
    from causal_qwen.cli import main as cli_main

    config = write_config(tmp_path / "c.yaml", settings(assets, tmp_path / "run", progress_bar=True, max_steps=2,
                                                         save_steps=0, eval_steps=0))
    assert cli_main(["train", str(config)]) == 0
    captured = capsys.readouterr()
    assert "step 1/2, loss " in captured.out and "step 2/2, loss " in captured.out, captured.out
    assert "{'loss'" not in captured.out and "it/s" not in captured.err


def test_ctrl_c_and_a_config_json_that_is_no_object_end_in_one_line(assets, tmp_path, capsys, monkeypatch):
    """Ctrl-C during ``train`` printed a 30-line KeyboardInterrupt traceback; now one line saying how to resume
    (exit status 130). A model folder whose config.json is a JSON list raised AttributeError; now a one-line error."""
    from causal_qwen.cli import main as cli_main
    from causal_qwen.training import training

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(training, "run_training", interrupted)
    config = write_config(tmp_path / "c.yaml", settings(assets, tmp_path / "run"))
    assert cli_main(["train", str(config)]) == 130
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert err == ["causal-qwen train: interrupted; `causal-qwen train CONFIG --resume` continues from the newest "
                   "complete checkpoint"]

    folder = tmp_path / "listed"
    shutil.copytree(assets / "converted", folder)
    (folder / "config.json").write_text("[]", encoding="utf-8")
    line = cli_error(capsys, "generate", "--model", str(folder), "Hello")
    assert "config.json holds a JSON list, not an object of settings" in line


def test_ctrl_c_before_the_first_checkpoint_says_to_run_again_not_to_resume(assets, tmp_path, capsys, monkeypatch):
    """A stop before any checkpoint was written leaves nothing for ``--resume`` (which would fail with "holds no
    checkpoint-N folder"), so the one line says to run the command again."""
    from causal_qwen.cli import main as cli_main
    from causal_qwen.training import training

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(training, "_train", interrupted)
    config = write_config(tmp_path / "c.yaml", settings(assets, tmp_path / "run"))
    assert cli_main(["train", str(config)]) == 130
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert err == ["causal-qwen train: interrupted; no checkpoint was saved yet: run the same command again"]


@pytest.mark.parametrize("argv, expected", [
    (["generate", "--top-p", "2"], "argument --top-p: must lie in (0, 1], got '2'"),
    (["generate", "--temperature", "-1"], "argument --temperature: must be a finite number >= 0, got '-1'"),
    (["generate", "--max-new-tokens", "0"], "argument --max-new-tokens: must be at least 1, got '0'"),
    (["generate", "--causal-temperature", "nan"], "argument --causal-temperature: must be a finite number >= 0"),
    (["predict", "--top-k", "abc"], "argument --top-k: must be an integer, got 'abc'"),
])
def test_an_option_out_of_range_is_named_by_its_flag_before_any_model_loads(argv, expected, capsys):
    from causal_qwen.cli import main as cli_main

    with pytest.raises(SystemExit) as exit:
        cli_main([argv[0], "--model", "no_such_model_folder", *argv[1:], "a prompt"])
    assert exit.value.code == 2
    error = capsys.readouterr().err
    assert expected in error and "no_such_model_folder" not in error
    assert len(error.strip().splitlines()) == 1, error  # one line, not argparse's usage block above it


def test_a_prompt_read_as_an_option_is_explained_in_one_line(capsys):
    from causal_qwen.cli import main as cli_main

    with pytest.raises(SystemExit) as exit:
        cli_main(["generate", "--model", "no_such_model_folder", "-3.5e2"])
    assert exit.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "causal-qwen generate: error: the following arguments are required: PROMPT; a prompt that starts with '-' "
        "goes after '--' (causal-qwen generate ... -- -3.5e2) (--help lists the options)"]
    with pytest.raises(SystemExit):  # a negative number given to an option is its value, not a prompt: no hint
        cli_main(["generate", "--model", "no_such_model_folder", "--temperature", "-1", "--bogus", "a prompt"])
    assert "goes after '--'" not in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["train", "config.yaml", "--bogus"])  # an unknown option elsewhere gets no prompt hint
    assert capsys.readouterr().err.splitlines() == [
        "causal-qwen: error: unrecognized arguments: --bogus (--help lists the options)"]


def test_a_converted_folder_trained_with_the_numbers_own_noise_loads_without_a_missing_weights_report(assets):
    """The pretrained recipe adds the numbers' own noise (``number_noise_init``) to a converted folder that has none:
    its weights start as the config says, and transformers' load report, which would list them as MISSING, is not
    shown."""
    import torch

    from causal_qwen.conversion.loading import added_modules, load_causal_model
    from causal_qwen.core.heads import NumberNoise

    folder = assets / "converted"
    assert added_modules(folder, {"number_noise_init": 1.0}) == {"number_noise_init": "action.number_noise."}
    assert added_modules(folder, {"ovr_negatives": 8}) == {}

    class Kept(logging.Handler):
        def __init__(self) -> None:
            super().__init__(logging.WARNING)
            self.messages: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.messages.append(record.getMessage())

    transformers_loading = logging.getLogger("transformers.modeling_utils")
    kept = Kept()
    transformers_loading.addHandler(kept)
    try:
        model = load_causal_model(folder, number_noise_init=1.0)
    finally:
        transformers_loading.removeHandler(kept)
    assert not [message for message in kept.messages if "LOAD REPORT" in message]
    assert not transformers_loading.filters  # the report is let through again after the load
    started = NumberNoise(model.config.causal_size)
    started.reset_parameters(1.0)
    for name, value in started.state_dict().items():
        assert torch.equal(model.action.number_noise.state_dict()[name], value)


def test_sigterm_ends_a_run_in_one_line_and_keeps_its_checkpoints(assets, tmp_path):
    """``kill`` (or ``timeout``) during training: exit status 143, one line naming ``--resume``, no traceback; the
    complete checkpoints stay for it."""
    out = tmp_path / "run"
    config = write_config(tmp_path / "c.yaml", settings(assets, out, max_steps=400, save_steps=2, eval_steps=400))
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    child = subprocess.Popen([*CLI, "train", str(config)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 240
        while not checkpoint_steps(out) and child.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        assert child.poll() is None, child.communicate()[1][-2000:]
        child.send_signal(signal.SIGTERM)
        _, stderr = child.communicate(timeout=120)
    finally:
        child.kill()
    assert child.returncode == 128 + signal.SIGTERM, stderr[-2000:]
    assert "causal-qwen train: terminated; `causal-qwen train CONFIG --resume` continues" in stderr
    assert "Traceback" not in stderr and checkpoint_steps(out)
