"""The output folder of a training run: one run at a time, complete checkpoints only, and what ``--resume``
continues from (README, "Training on your own CSV").

- **Lock.** `OutputLock` holds an exclusive ``flock`` on ``OUTPUT_DIR/.lock`` for the whole run and writes
  the holder (pid, host, start time) into it; a second run into the folder fails at once naming the holder.
  The kernel drops the lock when the process ends, however it ends, so a killed run leaves no stale lock.
- **Atomic folders.** A checkpoint (or ``final/``) is written under ``OUTPUT_DIR/.staging/NAME``, every file
  and the folder are fsync'ed, and one ``rename`` publishes it as ``OUTPUT_DIR/NAME``: a kill at any moment
  leaves either the complete folder or none. Old folders are first renamed to ``.trash-NAME``, then deleted.
- **Resume.** `plan_run` only reads: it picks the newest *complete* ``checkpoint-N`` (trainer state and
  weights present; incomplete ones are named and skipped), recognises a finished run, and lists what a fresh
  start must clear; `clear_for_run` deletes it, called only once config and data have been checked.
- **Fault points.** `fault_point` lets tests kill the process at chosen places (``CAUSAL_QWEN_FAULT``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

LOCK_FILE = ".lock"
STAGING_DIR = ".staging"
TRASH_PREFIX = ".trash-"
TRAINER_STATE = "trainer_state.json"
CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d+)$")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors",
                "pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model_fsdp_0")
FAULT_ENV = "CAUSAL_QWEN_FAULT"

_fault_counts: Counter = Counter()


# ---- fault points (tests) ----------------------------------------------------------------------------------
def fault_point(name: str) -> None:
    """Testing hook: with ``CAUSAL_QWEN_FAULT=NAME:K`` in the environment the process SIGKILLs itself the K-th
    time it reaches ``name`` (K defaults to 1). Does nothing otherwise."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    target, _, count = spec.partition(":")
    if target != name:
        return
    _fault_counts[name] += 1
    if _fault_counts[name] >= int(count or 1):
        os.kill(os.getpid(), signal.SIGKILL)


# ---- the folder itself -------------------------------------------------------------------------------------
def check_output_dir(path: str | os.PathLike) -> Path:
    """``path`` as a `Path` when it is (or can become) a writable folder; else ``ValueError`` saying why."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"output_dir {str(folder)!r} is a file, not a folder; choose a folder for the run")
    probe = folder
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise ValueError(f"output_dir {str(folder)!r} cannot be created: {str(probe)!r} is a file")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(f"output_dir {str(folder)!r} cannot be written (no write permission in {str(probe)!r})")
    return folder


class OutputLock:
    """An exclusive, non-blocking lock on ``folder/.lock`` (created with the folder) while the run lasts."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_FILE
        self._handle = None

    def acquire(self) -> "OutputLock":
        """Take the lock, or raise ``ValueError`` naming the run that holds it."""
        try:
            import fcntl
        except ImportError:  # no flock on this platform: run unlocked
            logger.warning("no file locking on this platform: %s is not protected from a second run", self.folder)
            return self
        self.folder.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+", encoding="utf-8")
        self._take(handle)
        handle.seek(0)
        handle.truncate()
        record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
        handle.write(json.dumps(record) + "\n")
        handle.flush()
        self._handle = handle
        return self

    def check_free(self) -> None:
        """Raise `acquire`'s ``ValueError`` if another run holds the lock now; take nothing, create nothing (a
        command checks this before it loads the training stack, so that it fails at once)."""
        try:
            import fcntl  # noqa: F401 (only whether this platform has flock)
        except ImportError:
            return
        try:
            handle = open(self.path, encoding="utf-8")
        except OSError:  # no lock file (a new folder), or unreadable: acquire() decides
            return
        with handle:
            self._take(handle)  # closing the descriptor drops it again

    def _take(self, handle) -> None:
        """``flock`` ``handle`` without waiting; held by another process: close it and raise, naming the holder."""
        import fcntl

        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = describe_holder(handle.read())
            handle.close()
            raise ValueError(
                f"output_dir {str(self.folder)!r} is in use by another run ({holder}); wait for it to finish or "
                "choose another output_dir"
            ) from None

    def release(self) -> None:
        """Clear the holder record and drop the lock (the file stays: removing it would race a waiting run)."""
        if self._handle is None:
            return
        self._handle.seek(0)
        self._handle.truncate()
        self._handle.close()  # closing the descriptor releases the flock
        self._handle = None

    def __enter__(self) -> "OutputLock":
        return self.acquire()

    def __exit__(self, *exc_info) -> None:
        self.release()


def describe_holder(text: str) -> str:
    """``"pid 123 on host h, since 2024-01-01 12:00:00"`` from a lock file's record (or what is known)."""
    try:
        record = json.loads(text.strip() or "{}")
    except json.JSONDecodeError:
        record = {}
    if not isinstance(record, dict) or "pid" not in record:
        return "holder unknown"
    return f"pid {record['pid']} on host {record.get('host', '?')}, since {record.get('started', '?')}"


# ---- checkpoints -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Checkpoint:
    """A ``checkpoint-N`` folder; ``problem`` says why it cannot be resumed from (None: complete)."""

    path: Path
    step: int
    problem: str | None = None

    @property
    def complete(self) -> bool:
        return self.problem is None


def read_trainer_state(folder: Path) -> dict[str, Any] | None:
    """The ``trainer_state.json`` of ``folder`` as a dict, or None when absent or unreadable."""
    try:
        state = json.loads((folder / TRAINER_STATE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def checkpoint_problem(folder: Path, step: int) -> str | None:
    """Why ``folder`` is not a complete checkpoint of ``step`` (None when it is)."""
    state = read_trainer_state(folder)
    if state is None:
        return f"no readable {TRAINER_STATE}"
    if state.get("global_step") != step:
        return f"{TRAINER_STATE} says step {state.get('global_step')!r}"
    if not any((folder / name).exists() for name in WEIGHT_FILES):
        return "no model weights"
    return None


def list_checkpoints(output_dir: str | os.PathLike) -> list[Checkpoint]:
    """The ``checkpoint-N`` folders of ``output_dir``, oldest first, each checked for completeness."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return []
    found = []
    for child in folder.iterdir():
        match = CHECKPOINT_PATTERN.match(child.name)
        if match and child.is_dir():
            step = int(match.group(1))
            found.append(Checkpoint(child, step, checkpoint_problem(child, step)))
    return sorted(found, key=lambda checkpoint: checkpoint.step)


# ---- atomic folders ----------------------------------------------------------------------------------------
def staging_path(output_dir: str | os.PathLike, name: str) -> Path:
    """Where ``name`` (``checkpoint-N``, ``final``) is written before it is published."""
    return Path(output_dir) / STAGING_DIR / name


def fsync_tree(folder: Path) -> None:
    """Flush every file under ``folder``, then the folders themselves, to disk."""
    for root, _, files in os.walk(folder):
        for name in files:
            _fsync_path(Path(root) / name, os.O_RDONLY)
        _fsync_path(Path(root), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))


def _fsync_path(path: Path, flags: int) -> None:
    try:
        descriptor = os.open(path, flags)
    except OSError:  # e.g. folders cannot be opened on some platforms
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def publish(staged: Path, target: Path) -> None:
    """Make the complete folder ``staged`` appear as ``target`` in one rename (an existing ``target`` is moved
    aside first, then deleted)."""
    fsync_tree(staged)
    fault_point(f"publish.{_kind(target.name)}.staged")
    old = None
    if target.exists():
        old = target.with_name(f"{TRASH_PREFIX}{target.name}")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(target, old)
    os.replace(staged, target)
    _fsync_path(target.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    with contextlib.suppress(OSError):  # the staging folder goes once it is empty
        staged.parent.rmdir()
    fault_point(f"publish.{_kind(target.name)}.renamed")
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _kind(name: str) -> str:
    return "checkpoint" if CHECKPOINT_PATTERN.match(name) else name


def remove_folder(folder: Path) -> None:
    """Delete ``folder`` so that no half-deleted folder keeps its name: rename it to ``.trash-NAME`` first."""
    if not folder.exists():
        return
    trash = folder.with_name(f"{TRASH_PREFIX}{folder.name}")
    shutil.rmtree(trash, ignore_errors=True)
    os.replace(folder, trash)
    fault_point("remove.renamed")
    shutil.rmtree(trash, ignore_errors=True)


def rotate_checkpoints(output_dir: str | os.PathLike, keep: int | None) -> list[Path]:
    """Delete all but the newest ``keep`` complete checkpoints (and incomplete ones older than the newest
    complete one); returns the deleted paths. ``keep`` None or < 1 keeps everything."""
    if keep is None or keep < 1:
        return []
    checkpoints = list_checkpoints(output_dir)
    complete = [c for c in checkpoints if c.complete]
    if not complete:
        return []
    kept = {c.path for c in complete[-keep:]}
    newest = complete[-1].step
    doomed = [c.path for c in checkpoints if c.path not in kept and c.step < newest]
    for path in doomed:
        remove_folder(path)
    return doomed


def leftovers(output_dir: str | os.PathLike) -> list[Path]:
    """What killed runs leave behind: the staging folder and ``.trash-*`` folders."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return []
    return [child for child in folder.iterdir() if child.name == STAGING_DIR or child.name.startswith(TRASH_PREFIX)]


# ---- what a run does with the folder ------------------------------------------------------------------------
@dataclass
class RunPlan:
    """What `plan_run` decided. ``checkpoint``: resume from it (None: step 0). ``finished``: the run already
    reached its last step: nothing trains (``final_from`` names a checkpoint whose weights still have to become
    ``final/``). ``clear``: folders a fresh start deletes. ``message``: one line for the user."""

    checkpoint: str | None = None
    finished: bool = False
    finished_step: int | None = None
    final_from: str | None = None
    clear: list[Path] = field(default_factory=list)
    message: str | None = None


def plan_run(output_dir: str | os.PathLike, max_steps: int, resume: bool | str, overwrite: bool,
             final_name: str = "final", outputs: tuple[str, ...] = ("final", "adapter"),
             started_marker: str = "train_config.yaml") -> RunPlan:
    """Decide, reading only, what the run does with ``output_dir`` (see `RunPlan`); ``ValueError`` when the
    request cannot be met (no checkpoint to resume from; checkpoints or a finished model in the way of a fresh
    start without ``overwrite``). ``outputs``: the folders a finished run writes besides its checkpoints;
    ``started_marker``: the file a run writes once its config and data have been checked (``--resume`` of a run
    killed before its first checkpoint starts it again from step 0)."""
    folder = Path(output_dir)
    if isinstance(resume, str):
        return _plan_explicit_checkpoint(Path(resume))
    checkpoints = list_checkpoints(folder)
    if resume:
        return _plan_resume(folder, checkpoints, max_steps, final_name, started_marker)
    complete = [c.path for c in checkpoints if c.complete]
    finished = [folder / name for name in outputs if (folder / name).exists()]
    if (complete or finished) and not overwrite:
        held = ", ".join(([complete[-1].name] if complete else []) + [f"{path.name}/" for path in finished])
        raise ValueError(
            f"{folder} already holds checkpoints or a trained model (latest {held}); pass --resume to continue, "
            "or --set overwrite_output_dir=true to start afresh"
        )
    incomplete = [c.path for c in checkpoints if not c.complete]
    return RunPlan(clear=[*incomplete, *complete, *finished])


def _plan_explicit_checkpoint(path: Path) -> RunPlan:
    match = CHECKPOINT_PATTERN.match(path.name)
    if not path.is_dir():
        raise ValueError(f"--resume: checkpoint folder {str(path)!r} does not exist")
    problem = checkpoint_problem(path, int(match.group(1))) if match else None
    if problem is not None or read_trainer_state(path) is None:
        raise ValueError(f"--resume: {str(path)!r} is not a complete checkpoint ({problem or 'no ' + TRAINER_STATE})")
    return RunPlan(checkpoint=str(path), message=f"resuming from {path} (step {read_trainer_state(path)['global_step']})")


def _plan_resume(folder: Path, checkpoints: list[Checkpoint], max_steps: int, final_name: str,
                 started_marker: str) -> RunPlan:
    skipped = [c for c in checkpoints if not c.complete]
    complete = [c for c in checkpoints if c.complete]
    skipped_note = "".join(f"; skipped {c.path.name} ({c.problem})" for c in skipped if not complete or c.step > complete[-1].step)
    final_state = read_trainer_state(folder / final_name)
    if final_state is not None and final_state.get("global_step", 0) >= _target_steps(max_steps, final_state):
        step = final_state["global_step"]
        return RunPlan(finished=True, finished_step=step, message=(
            f"the run in {folder} already finished at step {step} ({folder / final_name} holds its model); nothing "
            "to do (raise max_steps to train further)"))
    if complete:
        latest = complete[-1]
        state = read_trainer_state(latest.path) or {}
        target = _target_steps(max_steps, state)
        if latest.step >= target:
            return RunPlan(finished=True, finished_step=latest.step, final_from=str(latest.path), message=(
                f"the run in {folder} finished training at step {latest.step}; writing {final_name}/ from "
                f"{latest.path.name}{skipped_note}"))
        return RunPlan(checkpoint=str(latest.path), clear=[c.path for c in skipped], message=(
            f"resuming from {latest.path.name} (step {latest.step} of {target}){skipped_note}"))
    if (folder / started_marker).exists():  # an earlier run started training here, no checkpoint was complete
        return RunPlan(clear=[c.path for c in skipped], message=(
            f"no complete checkpoint in {folder} yet: starting from step 0{skipped_note}"))
    raise ValueError(f"--resume: {folder} holds no checkpoint-N folder to resume from{skipped_note}")


def _target_steps(max_steps: int, state: dict[str, Any]) -> int:
    """The run's last step: ``max_steps`` when set, else the one the saved state planned."""
    if max_steps > 0:
        return max_steps
    return int(state.get("max_steps") or 0) or 1 << 62


def clear_for_run(plan: RunPlan, output_dir: str | os.PathLike) -> None:
    """Delete what ``plan`` clears (a fresh start: the old checkpoints and model; a resume: incomplete
    checkpoints) and what killed runs left behind; call only once config and data have been checked."""
    for path in [*plan.clear, *leftovers(output_dir)]:
        if path.name == STAGING_DIR or path.name.startswith(TRASH_PREFIX):
            shutil.rmtree(path, ignore_errors=True)
        else:
            remove_folder(path)
        logger.info("removed %s", path)
