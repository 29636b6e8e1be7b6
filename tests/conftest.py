"""Shared fixtures: tiny random Qwen2 bases (tied and untied) and their conversions."""

from __future__ import annotations

import gc
import hashlib
import os
from pathlib import Path

import filelock
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# For the processes started from here on (pytest-xdist's workers, the commands and training runs the tests
# start): glibc's malloc hands every block above 32 MB back to the kernel when it is freed, and the heads over
# the 151,936-row vocabulary allocate such blocks again and again, each one page-faulted in anew (a conversion
# of random:tiny spent 11 s of 26 in the kernel so). Served from the heap instead, freed blocks are reused.
os.environ.setdefault("GLIBC_TUNABLES", "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=1073741824")


def torch_threads() -> int:
    """At most 2 threads, and no more than this process's share of the cores: under pytest-xdist every worker
    is a process of its own, and two workers with two threads each on two cores spend most of the tiny models'
    many small operations spinning (the model and loss tests ran 5x slower so)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, min(2, torch.get_num_threads(), cores // workers))


torch.set_num_threads(torch_threads())
# scikit-learn's gradient boosting (the baselines) runs on its own OpenMP runtime, which starts as many threads as
# the machine has cores when it loads; beside the other worker, its threads wait on each other at every split (a
# 3 s fit took 70-150 s with two such processes on two cores). It reads this variable when it loads, after here;
# set, not defaulted, since the workers inherit the value of the controlling process (which has no worker count).
os.environ["OMP_NUM_THREADS"] = str(torch_threads())

# ---- scheduling under pytest-xdist (`--dist loadscope --no-loadscope-reorder`, pyproject.toml) -------------
# Every module is one unit of work, run whole on one worker, so that its module-scoped models, tokenizers and
# training runs are built once. The slowest units come first in the collection (each 10 s to 35 s on one worker
# of a quiet 2-core machine), which loadscope keeps as its order of work, so that the workers end together; the
# other modules (a few seconds each) follow in file order.
SLOWEST_FIRST = (
    "test_robustness", "test_training", "test_compare", "test_demo", "test_numbers_benchmark", "test_number_grammar",
    "test_generation", "test_tokenizer", "test_plots", "test_evaluation", "test_hf_integration",
    "test_text_generation", "test_hf_generate",
)


def xdist_group(nodeid: str) -> str:
    """The unit of work of a test: its module's name."""
    return nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """The modules of `SLOWEST_FIRST` first, in that order; each module's tests stay in file order. Every
    pytest-xdist worker sorts its collection alike, so the scheduler sees one collection."""
    rank = {group: index for index, group in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(xdist_group(item.nodeid), len(rank)))


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """pytest-xdist's loadscope scheduling with whole modules as units (its own `xdist_group` marks do not reach
    the scheduler under pytest 9.2, which no longer reads the node id xdist rewrites)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleUnits(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid)

    return ModuleUnits(config, log)


def pytest_collection_finish(session) -> None:
    """Move everything imported so far (torch, transformers, the test modules) out of the garbage collector's
    reach: each `Trainer.train` ends with a full `gc.collect()` (accelerate's `free_memory`), which otherwise walks
    those millions of objects again each time (6.6 s of tests/test_training.py's 52 s)."""
    gc.freeze()


# ---- one calibration per random preset and run ----------------------------------------------------------
class SharedPresetCalibrations(dict):
    """`calibration._MEMO` for the test run: the calibrations of the random presets (``random:tiny`` …) and of
    small bases passed as model objects (keyed by their weights) are shared by the pytest-xdist workers through
    files next to their temporary folders, so each is fitted once per run (many seconds on the 151,936-row
    vocabulary) instead of once per worker. One worker fits while the others wait on the file's lock; anything
    else stays in this process. The calibration itself is tested on models built in the tests
    (tests/test_calibration.py), where nothing is shared."""

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = folder
        self.held: dict = {}  # key → the lock this process holds while it fits

    def _path(self, key) -> Path:
        return self.folder / f"calibration-{hashlib.sha256(repr(key).encode()).hexdigest()[:16]}.pt"

    def __contains__(self, key) -> bool:
        if super().__contains__(key):
            return True
        if not (isinstance(key[0], tuple) and key[0][0] in ("preset", "weights")):
            return False
        path = self._path(key)
        lock = filelock.FileLock(str(path) + ".lock")
        try:
            lock.acquire(timeout=900)
        except filelock.Timeout:
            return False
        if path.exists():
            super().__setitem__(key, torch.load(path, weights_only=False))
            lock.release()
            return True
        self.held[key] = lock  # the caller fits and stores it (`__setitem__`)
        return False

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        lock = self.held.pop(key, None)
        if lock is not None:
            path = self._path(key)
            torch.save(value, path.with_suffix(".partial"))
            os.replace(path.with_suffix(".partial"), path)
            lock.release()


@pytest.fixture(scope="session", autouse=True)
def shared_preset_calibrations(tmp_path_factory):
    from causal_qwen.conversion import calibration

    folder = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        folder = folder.parent  # shared by the workers of this run
    calibration._MEMO = SharedPresetCalibrations(folder)
    yield
    calibration._MEMO = {}


BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(file_name: str, module_name: str):
    """``benchmarks/FILE_NAME`` as a module named ``module_name`` (benchmarks/ is no package); registered in
    ``sys.modules`` so that its dataclasses can look their module up."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(module_name, BENCHMARKS / file_name)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


SMALL_VOCAB = 512
SMALL_NUM_ID = 500


def small_qwen_config(tied: bool = True, vocab_size: int = SMALL_VOCAB, hidden_size: int = 32) -> Qwen2Config:
    """A 2-layer width-32 Qwen2 (as litgpt/transformers' own parity tests use)."""
    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=tied,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )


def small_qwen(tied: bool = True, seed: int = 0, **config_kwargs) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(small_qwen_config(tied=tied, **config_kwargs)).eval()


@pytest.fixture(params=[True, False], ids=["tied", "untied"])
def small_base(request) -> Qwen2ForCausalLM:
    return small_qwen(tied=request.param)


def byte_level_tokenizer():
    """A `NumericTokenizer` over 256 byte tokens + <|endoftext|> (<NUM> appended as id 257): it loads in
    milliseconds, where the real 151,936-row vocabulary makes every model that reads it slow to convert and run."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    from causal_qwen.core.tokenizer import NumericTokenizer

    vocab = {char: index for index, char in enumerate(sorted(set(bytes_to_unicode().values())))}
    vocab["<|endoftext|>"] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return NumericTokenizer(PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>"))


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread while a module of tiny models runs: they decode one token at a time, and a second thread only
    adds synchronisation (on a busy shared machine, spinning). Modules ask for it with ``pytestmark``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tokenizer():
    """The numeric tokenizer over the real Qwen2.5 vocabulary (built offline)."""
    from causal_qwen.core.tokenizer import NumericTokenizer

    return NumericTokenizer.default()


@pytest.fixture(scope="module")
def tiny_model():
    """`random:tiny` converted with the default calibration (memoised across the session)."""
    from causal_qwen import from_qwen

    return from_qwen("random:tiny")
