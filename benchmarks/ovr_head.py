"""Benchmark of the fused OvR Cauchy head + loss (issue 5) against the (N, V) reference and against Qwen's CE.

    python benchmarks/ovr_head.py --json              # parts (a) and (b), full sizes
    python benchmarks/ovr_head.py --part a --quick    # small sizes, a minute or so
    python benchmarks/ovr_head.py --smoke --json      # every part on toy sizes (the test suite's run; figures meaningless)

Part (a), head + loss alone (forward + backward), C = 896, V = 151,936, N tokens (2,048, or the largest N
at which the reference fits in this machine's available memory; stated as ``head_tokens``):
    head_mem_ratio       peak memory fused / reference
    head_time_ratio      time fused / reference
    head_time_vs_matmul  time fused / time of the matrix products alone (the lower bound: the two forward
                         products loc = U·Wᵀ, scale = s·|W|ᵀ and the four backward products for ∂U, ∂s and
                         ∂W through W and |W|, unchunked, on preallocated (N, V) operands)
    sampled_speedup      exact fused / sampled fused (m = 4,096) for one training step (forward + backward)
                         of the ``random:tiny`` head (C = 64, V = 151,936) on 1 × 512 tokens
Part (b), one training step (forward + backward, no optimizer) on 1 × 512 tokens:
    ``random:qwen2.5-0.5b`` converted to CausalQwen (fused loss) vs ``Qwen2ForCausalLM`` with its own CE. The
    conversion keeps the literal values (``ovr_calibration="none"``): the calibration sets values, not shapes or
    operations, and would add a minute to the run.
    step_mem_ratio       (peak − params − grads) CausalQwen / Qwen
    step_raw_peak_ratio  process peak RSS CausalQwen / Qwen
    step_time_ratio      time CausalQwen / Qwen

Memory method (CPU): every measurement runs in its own fresh process. After the inputs (or the model) are
built and a small warm-up has run, glibc's ``malloc_trim`` returns freed heap pages to the OS and the
kernel's peak-RSS counter (VmHWM) is reset through ``/proc/self/clear_refs``; the figure is
``VmHWM − VmRSS`` at the reset: the extra resident memory the step needed on top of what existed before
it (gradients included). PyTorch's CPU allocator hands large blocks straight back to the OS, so RSS
follows the live tensors. Timings: wall clock, minimum over ``--repeats`` runs (fused, reference and the
products interleaved in one process); the machine may be shared, so minima are the honest figure, and
the ``*_cpu`` figures (CPU seconds of the process, all threads) are given too: they are far less
sensitive to other processes on the machine (the load average is printed at the start and the end).

A part that cannot run (a worker that fails, a module that moved) stops the script with exit status 1 and the
worker's error; no part is ever skipped. ``--smoke`` runs every part through the same code on toy sizes
(V = 2,048, C = 32, 16 tokens, ``random:tiny`` for part (b)), its workers in the script's own process (one import
of torch instead of six), so that the test suite notices quickly when the script breaks.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from causal_qwen import from_qwen  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

VOCAB = 151936
CAUSAL = 896
TINY_NEGATIVES = 4096
STEP_BASE = "random:qwen2.5-0.5b"
# --smoke: every part on toy sizes (the suite's run)
SMOKE = dict(tokens=16, causal=32, vocab=2048, negatives=256, base="random:tiny")
REFERENCE_BYTES_PER_ENTRY = 56
GiB = 1024**3


# ----------------------------------------------------------------------------------------------------------
# Memory probes (Linux)
# ----------------------------------------------------------------------------------------------------------


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak() -> int:
    """Return freed heap pages to the OS (glibc ``malloc_trim``), reset VmHWM to the current RSS; returns that
    RSS in bytes."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # not glibc: the baseline may then include some reusable free memory
        pass
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")
    return _status_kib("VmRSS") * 1024


def peak_since_reset(baseline: int) -> int:
    """Bytes of peak RSS above ``baseline`` since the last `reset_peak`."""
    return _status_kib("VmHWM") * 1024 - baseline


def available_memory() -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("MemAvailable not in /proc/meminfo")


# ----------------------------------------------------------------------------------------------------------
# Workers: each runs in its own process and prints one JSON line
# ----------------------------------------------------------------------------------------------------------


def head_inputs(tokens: int, causal: int, vocab: int, seed: int = 0) -> dict:
    """Inputs like a freshly converted model: W ~ N(0, 0.02²), s = γ0 + |b_noise| = 10.1, C = 100.

    loc_U, decision_scale: (N,C); weight: (V,C); bias: (V,); threshold: (); targets: (N,)
    """
    g = torch.Generator().manual_seed(seed)
    return dict(
        loc_U=torch.randn(tokens, causal, generator=g).requires_grad_(),
        decision_scale=(10.1 + 0.1 * torch.rand(tokens, causal, generator=g)).requires_grad_(),
        weight=(0.02 * torch.randn(vocab, causal, generator=g)).requires_grad_(),
        bias=torch.zeros(vocab).requires_grad_(),
        threshold=torch.tensor(100.0),
        target_ids=torch.randint(0, vocab, (tokens,), generator=g),
    )


def head_step(kind: str, inputs: dict, chunk_size: int, negatives: int | None = None, generator=None) -> None:
    """One forward + backward of the head + loss; gradients are left in ``.grad``."""
    from causal_qwen.core.fused_ovr import fused_ovr_loss, reference_ovr_loss

    loss_fn = fused_ovr_loss if kind == "fused" else reference_ovr_loss
    out = loss_fn(**inputs, chunk_size=chunk_size, negatives=negatives, generator=generator)
    out.loss.backward()


def clear_grads(inputs: dict) -> None:
    for tensor in inputs.values():
        if isinstance(tensor, torch.Tensor):
            tensor.grad = None


def matmul_step(ops: dict) -> None:
    """The products alone: 2 forward (N,C)×(C,V), 2 backward (N,V)×(V,C), 2 backward (V,N)×(N,C)."""
    torch.addmm(ops["bias"], ops["loc_U"], ops["weight"].t(), out=ops["loc_S"])  # (N,V)
    torch.mm(ops["scale"], ops["abs_weight"].t(), out=ops["scale_S"])  # (N,V)
    torch.mm(ops["loc_S"], ops["weight"], out=ops["grad_loc_U"])  # (N,C)
    torch.mm(ops["scale_S"], ops["abs_weight"], out=ops["grad_scale"])  # (N,C)
    torch.mm(ops["loc_S"].t(), ops["loc_U"], out=ops["grad_weight"])  # (V,C)
    ops["grad_weight"].addmm_(ops["scale_S"].t(), ops["scale"])  # (V,C)


def timed(step) -> dict[str, float]:
    """Run ``step()``; its wall-clock seconds and the CPU seconds of this process (all threads)."""
    wall, cpu = time.perf_counter(), time.process_time()
    step()
    return {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}


def worker_head_memory(kind: str, tokens: int, chunk_size: int, causal: int = CAUSAL, vocab: int = VOCAB) -> dict:
    """Peak memory (and time) of one forward + backward of the fused or the reference head, after a warm-up."""
    warm_up = head_inputs(8, causal, vocab, seed=1)
    head_step(kind, warm_up, chunk_size)
    del warm_up
    inputs = head_inputs(tokens, causal, vocab)
    baseline = reset_peak()
    sample = timed(lambda: head_step(kind, inputs, chunk_size))
    return dict(kind=kind, tokens=tokens, peak_bytes=peak_since_reset(baseline), sample=sample)


def matmul_operands(inputs: dict, tokens: int) -> dict:
    """Operands and preallocated outputs of `matmul_step`: (N,V) ×2, (N,C) ×2, (V,C)."""
    vocab, causal = inputs["weight"].shape
    return dict(
        loc_U=inputs["loc_U"].detach(),
        scale=inputs["decision_scale"].detach(),
        weight=inputs["weight"].detach(),
        abs_weight=inputs["weight"].detach().abs(),
        bias=inputs["bias"].detach(),
        loc_S=torch.zeros(tokens, vocab),  # zeros: pages touched before the timing
        scale_S=torch.zeros(tokens, vocab),
        grad_loc_U=torch.empty(tokens, causal),
        grad_scale=torch.empty(tokens, causal),
        grad_weight=torch.zeros(vocab, causal),
    )


def worker_head_timing(tokens: int, repeats: int, chunk_size: int, causal: int = CAUSAL, vocab: int = VOCAB) -> dict:
    """Rounds of fused, reference and products-alone, interleaved in one process so that a shared machine's
    load affects all three alike; every sample is kept (the caller takes minima)."""
    inputs = head_inputs(tokens, causal, vocab)
    samples: dict[str, list[dict]] = {"fused": [], "reference": [], "matmul": []}
    for _ in range(repeats):
        for kind in ("fused", "reference"):
            samples[kind].append(timed(lambda: head_step(kind, inputs, chunk_size)))
            clear_grads(inputs)
        with torch.no_grad():
            ops = matmul_operands(inputs, tokens)
            samples["matmul"].append(timed(functools.partial(matmul_step, ops)))
            del ops
    return dict(tokens=tokens, samples=samples)


def worker_sampled(tokens: int, repeats: int, chunk_size: int, vocab: int = VOCAB,
                   negatives: int = TINY_NEGATIVES) -> dict:
    """Exact vs sampled (m = 4,096) fused step of the ``random:tiny`` head, interleaved; all samples kept."""
    from causal_qwen.conversion.presets import preset_config

    causal = preset_config("random:tiny").hidden_size
    inputs = head_inputs(tokens, causal, vocab)
    generator = torch.Generator().manual_seed(0)
    samples: dict[str, list[dict]] = {"exact": [], "sampled": []}
    sampled_negatives = negatives
    for round_index in range(repeats + 1):  # the first round warms up
        for kind, negatives in (("exact", None), ("sampled", sampled_negatives)):
            sample = timed(lambda: head_step("fused", inputs, chunk_size, negatives=negatives, generator=generator))
            if round_index:
                samples[kind].append(sample)
            clear_grads(inputs)
    return dict(tokens=tokens, causal=causal, samples=samples)


def worker_step(kind: str, tokens: int, repeats: int, base: str = STEP_BASE) -> dict:
    """One training step (forward + backward) of CausalQwen (fused loss) or Qwen2ForCausalLM (CE)."""
    from causal_qwen.conversion.presets import build_preset

    base = build_preset(base)
    if kind == "causal_qwen":

        model = from_qwen(base, ovr_loss_implementation="fused", ovr_calibration="none")
        del base
    else:
        model = base
    model.train()
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, 151643, (1, tokens), generator=g)  # (1,S)
    batch = dict(input_ids=input_ids, labels=input_ids.clone())
    if kind == "causal_qwen":
        batch["numeric_values"] = torch.zeros(1, tokens)  # (1,S)

    def step() -> None:
        model(**batch).loss.backward()

    params = sum(p.numel() * p.element_size() for p in model.parameters())
    grads = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    step()  # warm-up
    model.zero_grad(set_to_none=True)
    samples, peaks, raw = [], [], []
    for _ in range(repeats):
        baseline = reset_peak()
        samples.append(timed(step))
        peaks.append(peak_since_reset(baseline))
        raw.append(_status_kib("VmHWM") * 1024)
        model.zero_grad(set_to_none=True)
    return dict(
        kind=kind,
        tokens=tokens,
        params_bytes=params,
        grads_bytes=grads,
        baseline_bytes=baseline,
        peak_above_baseline=peaks[0],
        peak_above_params_grads=peaks[0] - grads,  # the baseline already holds the parameters
        raw_peak_bytes=raw[0],
        samples=samples,
    )


# ----------------------------------------------------------------------------------------------------------
# Orchestration
# ----------------------------------------------------------------------------------------------------------


def run_worker(args: argparse.Namespace, name: str, **kwargs) -> dict:
    """Run one worker in a fresh Python process (in this one with ``--smoke``); returns its JSON result."""
    if args.smoke:
        try:
            return json.loads(json.dumps(WORKERS[name](**json.loads(json.dumps(kwargs)))))
        except Exception as error:
            raise PartFailed(f"worker {name} failed: {type(error).__name__}: {error}") from error
    command = [sys.executable, __file__, "--worker", name, "--worker-args", json.dumps(kwargs)]
    command += ["--threads", str(args.threads)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        raise PartFailed(f"worker {name} failed (exit status {done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


class PartFailed(RuntimeError):
    """A part of the benchmark could not run: the script stops with exit status 1."""


def fastest(samples: list[dict]) -> dict[str, float]:
    """Minimum wall-clock and minimum CPU seconds over samples."""
    return {key: min(sample[key] for sample in samples) for key in ("wall", "cpu")}


def choose_tokens(wanted: int, vocab: int = VOCAB) -> tuple[int, float]:
    """Largest N ≤ ``wanted`` (halving) whose predicted reference peak fits in 90% of the available memory.

    The reference's peak was measured at about 52 bytes per (token × vocabulary) entry at N = 2,048
    (≈ 13 fp32 (N, V) tensors alive at once); 56 bytes are assumed.
    """
    budget = 0.9 * available_memory()
    tokens = wanted
    while tokens > 64 and REFERENCE_BYTES_PER_ENTRY * tokens * vocab > budget:
        tokens //= 2
    return tokens, REFERENCE_BYTES_PER_ENTRY * tokens * vocab


def part_a(args: argparse.Namespace) -> dict:
    causal, vocab = (SMOKE["causal"], SMOKE["vocab"]) if args.smoke else (CAUSAL, VOCAB)
    wanted = SMOKE["tokens"] if args.smoke else 256 if args.quick else 2048
    tokens, predicted = choose_tokens(wanted, vocab)
    sizes = dict(chunk_size=args.chunk_size, causal=causal, vocab=vocab)
    memory = {kind: run_worker(args, "head_memory", kind=kind, tokens=tokens, **sizes) for kind in ("fused", "reference")}
    timing = run_worker(args, "head_timing", tokens=tokens, repeats=args.repeats, **sizes)
    samples = timing["samples"]
    for kind in ("fused", "reference"):
        samples[kind].append(memory[kind]["sample"])  # the memory runs are timed samples too
    best = {kind: fastest(kind_samples) for kind, kind_samples in samples.items()}
    negatives = SMOKE["negatives"] if args.smoke else TINY_NEGATIVES
    sampled = run_worker(args, "sampled", tokens=SMOKE["tokens"] if args.smoke else 512,
                         repeats=args.repeats + (0 if args.smoke else 2), chunk_size=args.chunk_size, vocab=vocab,
                         negatives=negatives)
    exact_best, sampled_best = fastest(sampled["samples"]["exact"]), fastest(sampled["samples"]["sampled"])
    fused_peak, reference_peak = memory["fused"]["peak_bytes"], memory["reference"]["peak_bytes"]
    return dict(
        head_tokens=tokens,
        head_tokens_requested=wanted,
        head_causal_size=causal,
        head_vocab=vocab,
        head_chunk_size=args.chunk_size,
        head_reference_predicted_peak_bytes=predicted,
        head_fused_peak_bytes=fused_peak,
        head_reference_peak_bytes=reference_peak,
        head_fused_time_s=best["fused"]["wall"],
        head_reference_time_s=best["reference"]["wall"],
        head_matmul_time_s=best["matmul"]["wall"],
        head_fused_cpu_s=best["fused"]["cpu"],
        head_reference_cpu_s=best["reference"]["cpu"],
        head_matmul_cpu_s=best["matmul"]["cpu"],
        head_samples=samples,
        head_mem_ratio=fused_peak / reference_peak,
        head_time_ratio=best["fused"]["wall"] / best["reference"]["wall"],
        head_time_vs_matmul=best["fused"]["wall"] / best["matmul"]["wall"],
        head_time_ratio_cpu=best["fused"]["cpu"] / best["reference"]["cpu"],
        head_time_vs_matmul_cpu=best["fused"]["cpu"] / best["matmul"]["cpu"],
        sampled_tokens=sampled["tokens"],
        sampled_causal_size=sampled["causal"],
        sampled_negatives=negatives,
        sampled_exact_time_s=exact_best["wall"],
        sampled_time_s=sampled_best["wall"],
        sampled_speedup=exact_best["wall"] / sampled_best["wall"],
        sampled_speedup_cpu=exact_best["cpu"] / sampled_best["cpu"],
    )


def part_b(args: argparse.Namespace) -> dict:
    tokens = SMOKE["tokens"] if args.smoke else 128 if args.quick else 512
    base = SMOKE["base"] if args.smoke else STEP_BASE
    qwen = run_worker(args, "step", kind="qwen", tokens=tokens, repeats=args.repeats, base=base)
    causal = run_worker(args, "step", kind="causal_qwen", tokens=tokens, repeats=args.repeats, base=base)
    qwen_best, causal_best = fastest(qwen["samples"]), fastest(causal["samples"])
    return dict(
        step_base=base,
        step_tokens=tokens,
        step_qwen_time_s=qwen_best["wall"],
        step_causal_qwen_time_s=causal_best["wall"],
        step_qwen_cpu_s=qwen_best["cpu"],
        step_causal_qwen_cpu_s=causal_best["cpu"],
        step_qwen_peak_above_params_grads_bytes=qwen["peak_above_params_grads"],
        step_causal_qwen_peak_above_params_grads_bytes=causal["peak_above_params_grads"],
        step_qwen_raw_peak_bytes=qwen["raw_peak_bytes"],
        step_causal_qwen_raw_peak_bytes=causal["raw_peak_bytes"],
        step_qwen_params_grads_bytes=qwen["params_bytes"] + qwen["grads_bytes"],
        step_causal_qwen_params_grads_bytes=causal["params_bytes"] + causal["grads_bytes"],
        step_mem_ratio=causal["peak_above_params_grads"] / qwen["peak_above_params_grads"],
        step_raw_peak_ratio=causal["raw_peak_bytes"] / qwen["raw_peak_bytes"],
        step_time_ratio=causal_best["wall"] / qwen_best["wall"],
        step_time_ratio_cpu=causal_best["cpu"] / qwen_best["cpu"],
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--part", choices=("a", "b", "all"), default="all")
    parser.add_argument("--quick", action="store_true", help="N = 256 for (a), 128 tokens for (b)")
    parser.add_argument("--smoke", action="store_true",
                        help="every part on toy sizes, one repeat (checks that the script runs; figures meaningless)")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per measurement (minimum reported)")
    parser.add_argument("--chunk-size", type=int, default=8192, help="vocabulary slice of the fused head")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--worker-args", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.smoke:
        args.repeats = 1
    return args


WORKERS = {
    "head_memory": worker_head_memory,
    "head_timing": worker_head_timing,
    "sampled": worker_sampled,
    "step": worker_step,
}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.worker:
        print(json.dumps(WORKERS[args.worker](**json.loads(args.worker_args))), flush=True)
        return 0
    results: dict = dict(threads=args.threads, cpu_count=os.cpu_count(), torch=torch.__version__, quick=args.quick,
                         smoke=args.smoke)
    results["load_average_start"] = os.getloadavg()
    parts = [(name, run) for name, run in (("a", part_a), ("b", part_b)) if args.part in (name, "all")]
    for name, run in parts:
        try:
            results.update(run(args))
        except PartFailed as error:
            print(f"ovr_head: part ({name}) failed: {error}", file=sys.stderr)
            return 1
    results["load_average_end"] = os.getloadavg()
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    for key, value in results.items():
        shown = f"{value / GiB:.3f} GiB" if key.endswith("bytes") and isinstance(value, (int, float)) else value
        print(f"{key:48s} {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
