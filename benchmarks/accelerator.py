"""Checks that need an accelerator: decisions in every weight dtype (standard, and causal in both scopes of the
individual), the fused OvR loss against the plain one, and decoding speed against Qwen, all on one device.

    python benchmarks/accelerator.py [--device cuda] [--base random:qwen2.5-0.5b] [--json]

The suite runs on CPU; this script is what to run on a GPU (about two minutes on one H200). For float32, bfloat16
and float16 weights, on 3 left-padded prompts of random ids (rows of 24, 15 and 6 tokens, the first with a
number in it), 16 new tokens:

    standard_exact      every standard-mode decision of `generate_ids` equals ``argmax_k (loc_S_k − t_k)/scale_S_k``
                        recomputed from that step's own loc_U, scale_U (recorded by a forward hook) with the head
                        in the model's dtype; how often it also equals the float64 decision is reported
    causal_exact        every causal-mode decision (a fresh individual per token, and one per text) equals the argmax
                        of `decisions.decision_scores` recomputed from that step's loc_U, scale_U and individual c
                        (recorded by hooks); the same seed replays the same tokens
    fused_loss          the fused OvR loss and its gradients (loc_U, decision scale, W) against
                        `reference_ovr_loss` on 256 positions of the converted head: largest relative difference

and, in bfloat16, tokens/s of Qwen's own greedy ``generate`` and CausalQwen's ``model.generate`` per mode
(batch 1 and 8, 64-token prompt, 64 new tokens; best of 3). Exits with 1 if a check fails.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the repository root, for causal_qwen without an installed package
    sys.path.insert(0, str(ROOT))

import argparse  # noqa: E402
import copy  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

from causal_qwen.conversion.conversion import load_qwen_base  # noqa: E402
from causal_qwen.core import cauchy  # noqa: E402
from causal_qwen.core.fused_ovr import fused_ovr_loss, reference_ovr_loss  # noqa: E402
from causal_qwen.core.decisions import decision_scores  # noqa: E402
from causal_qwen.core.generation import MODES, SCOPES, generate_ids  # noqa: E402
from causal_qwen import from_qwen  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
NEW_TOKENS = 16
FUSED_LOSS_TOLERANCE = 1e-4  # relative, float32 on both sides
SPEED_BATCHES = (1, 8)
SPEED_PROMPT, SPEED_NEW = 64, 64


def left_padded_prompts(model, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids, attention mask and numbers, (3,24) each: rows of 24, 15 and 6 real tokens, left padded with 0."""
    generator = torch.Generator().manual_seed(1)
    num_token_id = model.config.num_token_id
    ids = torch.randint(1, min(50_000, num_token_id), (3, 24), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, :9] = 0
    mask[2, :18] = 0
    ids = ids.masked_fill(mask == 0, 0)
    values = torch.zeros(ids.shape)
    ids[0, 10], values[0, 10] = num_token_id, 37.5
    return ids.to(device), mask.to(device), values.to(device)


def standard_decisions_are_exact(model, ids, mask, values) -> dict:
    """Each generated token against ``argmax_k (loc_S_k − t_k)/scale_S_k`` (`cauchy.decision_score`) from the step's
    own (loc_U, scale_U): with loc_S, scale_S from the head in the model's dtype (the generator's shortcut must
    equal it: ``mismatches``), and in float64 (``float64_agreement``: how often low-precision weights still
    decide as exact arithmetic would)."""
    steps: list[tuple[torch.Tensor, torch.Tensor]] = []
    hook = model.abduction.register_forward_hook(lambda module, args, out: steps.append((out[0], out[1])))
    try:
        out = generate_ids(model, ids, mask, values, mode="standard", max_new_tokens=NEW_TOKENS, eos_token_id=[])
    finally:
        hook.remove()
    exact_action = copy.deepcopy(model.action).double()
    thresholds = model.ovr_thresholds()
    mismatches = agree64 = 0
    with torch.no_grad():
        for step, (loc_U, scale_U) in enumerate(steps):  # (B,C) each; the prefill's (B,P,C)
            if loc_U.dim() == 3:
                loc_U, scale_U = loc_U[:, -1], scale_U[:, -1]
            chosen = out.token_ids[:, step]  # (B,)
            loc_S, scale_S = model.action.classify(loc_U, scale_U)  # (B,V) each, in the model's dtype
            mismatches += int((chosen != cauchy.decision_score(loc_S, scale_S, thresholds).argmax(-1)).sum())
            loc_S, scale_S = exact_action.classify(loc_U.double(), scale_U.double())  # (B,V) each, float64
            agree64 += int((chosen == cauchy.decision_score(loc_S, scale_S, thresholds.double()).argmax(-1)).sum())
    total = out.token_ids.numel()
    return {
        "decisions": total, "mismatches": mismatches, "float64_agreement": agree64 / total,
        "ok": mismatches == 0 and len(steps) == NEW_TOKENS,
    }


def causal_decisions_are_exact(model, ids, mask, values) -> dict:
    """Each causal-mode token (both scopes) against the argmax of `decisions.decision_scores` from the step's own
    (loc_U, scale_U) and individual coordinates c; and a second run with the same seed gives the same tokens."""
    report = {}
    for scope in SCOPES:
        steps: list[tuple[torch.Tensor, torch.Tensor]] = []
        individuals: list[torch.Tensor] = []
        hooks = [
            model.abduction.register_forward_hook(lambda module, args, out: steps.append((out[0], out[1]))),
            model.register_forward_pre_hook(lambda module, args, kwargs: individuals.append(kwargs["individual"]),
                                            with_kwargs=True),
        ]
        options = dict(mode="causal", individual_scope=scope, seed=5, max_new_tokens=NEW_TOKENS, eos_token_id=[])
        try:
            out = generate_ids(model, ids, mask, values, **options)
        finally:
            for hook in hooks:
                hook.remove()
        mismatches = 0
        with torch.no_grad():
            for step, ((loc_U, scale_U), c) in enumerate(zip(steps, individuals)):
                scores, _ = decision_scores(model, loc_U[:, -1:], scale_U[:, -1:], c, model.config.causal_temperature)
                mismatches += int((out.token_ids[:, step] != scores[:, -1].argmax(-1)).sum())
        replayed = torch.equal(generate_ids(model, ids, mask, values, **options).token_ids, out.token_ids)
        report[scope] = {"decisions": out.token_ids.numel(), "mismatches": mismatches, "replayed": replayed,
                         "ok": mismatches == 0 and replayed and len(steps) == NEW_TOKENS}
    return report


def fused_loss_matches(model, device: str) -> dict:
    """Fused vs plain OvR loss on the converted head (float32), with gradients for loc_U, the scale and W."""
    head = model.action.classification_head
    generator = torch.Generator().manual_seed(2)
    positions, width = 256, head.weight.shape[1]
    loc_U = (torch.randn(positions, width, generator=generator) * 2).to(device)
    decision_scale = (torch.rand(positions, width, generator=generator) + 0.1).to(device)
    targets = torch.randint(0, head.weight.shape[0], (positions,), generator=generator).to(device)
    thresholds = model.ovr_thresholds().detach().float()
    weight = head.weight.detach().float()
    bias = None if head.bias is None else head.bias.detach().float()
    token_noise = model.action.token_noise_scale().detach().float()
    results = {}
    for name, loss_fn in (("fused", fused_ovr_loss), ("reference", reference_ovr_loss)):
        inputs = [tensor.clone().requires_grad_() for tensor in (loc_U, decision_scale, weight)]
        loss = loss_fn(*inputs, bias, thresholds, targets, token_noise=token_noise).loss
        loss.backward()
        results[name] = [loss.detach()] + [tensor.grad for tensor in inputs]
    differences = [
        float((fused - reference).abs().max() / reference.abs().max().clamp_min(1e-30))
        for fused, reference in zip(results["fused"], results["reference"])
    ]
    worst = max(differences)
    return {"loss": float(results["fused"][0]), "max_relative_difference": worst, "ok": worst < FUSED_LOSS_TOLERANCE}


def _timed(call, device: str) -> float:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    call()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start


def decoding_speed(qwen, model, device: str, repeats: int = 3) -> dict:
    """tokens/s (best of ``repeats``, interleaved) of Qwen's greedy generate and model.generate per mode."""
    report = {}
    for batch in SPEED_BATCHES:
        ids = torch.randint(1, 50_000, (batch, SPEED_PROMPT), generator=torch.Generator().manual_seed(batch)).to(device)
        options = dict(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=SPEED_NEW,
                       min_new_tokens=SPEED_NEW, pad_token_id=0)
        calls = {"qwen": lambda: qwen.generate(**options, do_sample=False)}
        for mode in MODES:
            extra = {"do_sample": False} if mode == "traditional" else {"seed": 0} if mode == "causal" else {}
            calls[f"generate_{mode}"] = lambda mode=mode, extra=extra: model.generate(**options, mode=mode, **extra)
        best = {name: float("inf") for name in calls}
        with torch.inference_mode():
            for call in calls.values():
                call()  # warm-up
            for repeat in range(repeats):
                for name in calls if repeat % 2 == 0 else reversed(list(calls)):
                    best[name] = min(best[name], _timed(calls[name], device))
        for name, seconds in best.items():
            report[f"{name}_b{batch}_tokens_per_s"] = batch * SPEED_NEW / seconds
        for mode in MODES:
            report[f"ratio_generate_{mode}_b{batch}"] = best["qwen"] / best[f"generate_{mode}"]
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    parser.add_argument("--device", default=default_device, help="default: cuda when present, else cpu")
    parser.add_argument("--base", default="random:qwen2.5-0.5b", help="Qwen2 base (default random:qwen2.5-0.5b)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument("--no-speed", action="store_true", help="skip the tokens/s comparison")
    args = parser.parse_args(argv)

    device = args.device
    report: dict = {"device": torch.cuda.get_device_name() if device.startswith("cuda") else device, "base": args.base,
                    "torch": torch.__version__, "dtypes": {}}
    qwen_cpu = load_qwen_base(args.base).eval()
    converted_cpu = from_qwen(copy.deepcopy(qwen_cpu)).eval()  # converted (and calibrated) once
    for dtype_name, dtype in DTYPES.items():
        model = copy.deepcopy(converted_cpu).to(device=device, dtype=dtype)
        ids, mask, values = left_padded_prompts(model, device)
        entry = {
            "standard_exact": standard_decisions_are_exact(model, ids, mask, values),
            "causal_exact": causal_decisions_are_exact(model, ids, mask, values),
        }
        if dtype is torch.float32:
            entry["fused_loss"] = fused_loss_matches(model, device)
        if dtype is torch.bfloat16 and not args.no_speed:
            qwen = copy.deepcopy(qwen_cpu).to(device=device, dtype=dtype)
            report["speed_bfloat16"] = decoding_speed(qwen, model, device)
            del qwen
        report["dtypes"][dtype_name] = entry
        print(f"{dtype_name}: {json.dumps(entry)}", file=sys.stderr, flush=True)
        del model
        if device.startswith("cuda"):
            torch.cuda.empty_cache()

    report["all_ok"] = all(ok for entry in report["dtypes"].values() for _, ok in _flat_ok(entry))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for dtype_name, entry in report["dtypes"].items():
            print(f"{dtype_name}: " + "; ".join(f"{name} {'ok' if ok else 'FAIL'}" for name, ok in _flat_ok(entry)))
        for name, value in report.get("speed_bfloat16", {}).items():
            print(f"  {name} = {value:.3f}")
        print("all checks pass" if report["all_ok"] else "SOME CHECKS FAIL")
    return 0 if report["all_ok"] else 1


def _flat_ok(entry: dict):
    """(name, ok) of each check of one dtype's entry, a mode's result named ``check[mode]``."""
    for name, result in entry.items():
        if "ok" in result:
            yield name, result["ok"]
        else:
            for mode, outcome in result.items():
                yield f"{name}[{mode}]", outcome["ok"]


if __name__ == "__main__":
    sys.exit(main())
