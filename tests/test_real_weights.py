"""Real weights: the calibrated conversion of Qwen2.5-Coder-0.5B-Instruct decides like its base.

Needs the real GGUF file (``scripts/fetch_real_qwen.py`` fetches it; ``CAUSAL_QWEN_REAL_GGUF`` points
elsewhere); every test is skipped with the reason when it is absent. The full figures (1,024 held-out positions,
8 generation prompts, causal fluency, fine-tuning) are ``benchmarks/real_weights.py``. Held-out text: the
odd-numbered topics of Python's reference documentation, which the calibration never reads.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from causal_qwen import from_qwen

REAL_GGUF = Path(
    os.environ.get("CAUSAL_QWEN_REAL_GGUF", "/root/.cache/causal_qwen/real/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
)
POSITIONS = 256  # held-out next-token positions scored
CALIBRATION_POSITIONS = 1024  # fewer than the default 4,096, to keep the suite short

pytestmark = [
    pytest.mark.real_weights,
    pytest.mark.slow,
    pytest.mark.skipif(not REAL_GGUF.is_file(), reason=f"real Qwen2.5 GGUF weights not found at {REAL_GGUF}"),
]


@pytest.fixture(scope="module")
def real():
    """(qwen, calibrated CausalQwen, numeric tokenizer) sharing the base's backbone."""
    from causal_qwen.conversion.conversion import load_qwen_base
    from causal_qwen.conversion.loading import load_tokenizer_for_base

    tokenizer = load_tokenizer_for_base(str(REAL_GGUF))
    qwen = load_qwen_base(str(REAL_GGUF))
    model = from_qwen(
        qwen, tokenizer=tokenizer, num_token_id=tokenizer.num_token_id, calibration_positions=CALIBRATION_POSITIONS
    )
    return qwen, model.eval(), tokenizer


def held_out_batch(tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, values) of ``POSITIONS + 1`` tokens of held-out documentation text without numbers, as (1,T)."""
    from causal_qwen.conversion import calibration

    pieces = []
    for text in calibration.held_out_texts():
        ids = tokenizer([text[:2000]], return_tensors="pt")["input_ids"][0]  # (T,)
        numbers = (ids == tokenizer.num_token_id).nonzero()[:, 0]
        end = int(numbers[0]) if len(numbers) else len(ids)  # the text up to its first number
        pieces.append(ids[: min(end, 128)])
        if sum(len(piece) for piece in pieces) > POSITIONS:
            break
    ids = torch.cat(pieces)[: POSITIONS + 1][None]  # (1,T)
    return ids, torch.zeros(ids.shape)


@torch.no_grad()
def test_conversion_is_exact_and_numbers_have_the_reserved_id(real):
    qwen, model, tokenizer = real
    ids, values = held_out_batch(tokenizer)
    out = model(input_ids=ids, numeric_values=values)
    logits = qwen(input_ids=ids).logits
    assert torch.equal(out.loc_S.float(), logits.float())  # traditional mode is Qwen
    assert model.config.num_token_id == tokenizer.num_token_id == 151665


@torch.no_grad()
def test_standard_and_causal_decisions_agree_with_the_base(real):
    from causal_qwen.evaluation.evaluation import token_totals

    _, model, tokenizer = real
    ids, values = held_out_batch(tokenizer)
    out = model(input_ids=ids[:, :-1], numeric_values=values[:, :-1])
    figures = token_totals(model, out.loc_U[0], out.scale_U[0], ids[0, 1:], chunk_positions=None).metrics()
    # the shared token noise makes every token's decision scale the same up to ρ = 1e-3: Qwen's greedy token
    assert figures["standard_agreement"] >= 0.99, figures
    assert figures["causal_agreement"] >= 0.99, figures
    assert 0.5 <= figures["ovr_prob_sum"] <= 2.0, figures
    # The target (<= 2x the softmax perplexity) is out of reach for any calibration that keeps loc_S equal to
    # Qwen's logits (docs/design.md, "Calibration at conversion"); the literal setting gives ~5,900x, this ~100x.
    assert figures["ovr_ppl_ratio"] < 300, figures


@torch.no_grad()
def test_standard_generation_follows_the_base(real):
    from causal_qwen.core.generation import generate_ids

    qwen, model, tokenizer = real
    # End-of-text is banned on both sides until `new` tokens.
    ids = tokenizer(["The capital of France is"], return_tensors="pt")["input_ids"]  # (1,P)
    new = 24
    eos = qwen.generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    reference = qwen.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                              do_sample=False, pad_token_id=0, eos_token_id=eos)[0, ids.shape[1]:]
    ours = generate_ids(model, ids, mode="standard", max_new_tokens=new, min_new_tokens=new, eos_token_id=eos)
    assert torch.equal(ours.token_ids[0, :new], reference[:new]), tokenizer.decode(ours.token_ids[0].tolist())


@torch.no_grad()
def test_individuals_write_differently_and_one_replays(real):
    """Issue 29 on real weights: with the calibrated causal temperature, token-scope sampling writes different
    continuations for different seeds (and standard mode's only by chance), a sequence-scope individual replays
    on a second prompt as a fresh run with its ε does, and another ε writes otherwise there."""
    from causal_qwen.core.generation import generate_ids

    _, model, tokenizer = real
    assert model.config.causal_temperature > 1.0
    first = tokenizer(["Once upon a time, in a small village, there lived"], return_tensors="pt")["input_ids"]
    second = tokenizer(["My favourite dish to cook on a Sunday is"], return_tensors="pt")["input_ids"]
    options = dict(max_new_tokens=12, min_new_tokens=12, eos_token_id=[])
    standard = generate_ids(model, first, mode="standard", **options).token_ids[0]
    sampled = [generate_ids(model, first, mode="causal", seed=seed, **options).token_ids[0] for seed in range(4)]
    assert len({tuple(tokens.tolist()) for tokens in sampled}) >= 3
    assert sum(torch.equal(tokens, standard) for tokens in sampled) <= 1
    sequence = dict(mode="causal", individual_scope="sequence", **options)
    drawn = [generate_ids(model, first, seed=seed, **sequence) for seed in (1, 2)]
    replayed = generate_ids(model, second, individual=drawn[0].individual, **sequence).token_ids
    fresh = generate_ids(model, second, individual=drawn[0].individual.clone(), **sequence).token_ids
    other = generate_ids(model, second, individual=drawn[1].individual, **sequence).token_ids
    assert torch.equal(replayed, fresh) and not torch.equal(replayed, other)


@torch.no_grad()
def test_a_chat_through_the_instruct_template_is_qwens(real):
    """The Instruct GGUF's chat template comes with the numeric tokenizer (it was dropped before, and
    ``apply_chat_template`` failed); ``model.generate`` on the chat writes Qwen's own greedy answer in standard mode."""
    qwen, model, tokenizer = real
    messages = [{"role": "user", "content": "Name the capital of France in one word."}]
    chat = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
    assert chat["input_ids"][0, 0] == tokenizer.convert_tokens_to_ids("<|im_start|>")
    new = 6
    reference = qwen.generate(chat["input_ids"], attention_mask=chat["attention_mask"], max_new_tokens=new,
                              min_new_tokens=new, do_sample=False, pad_token_id=0)
    ours = model.generate(**chat, mode="standard", max_new_tokens=new, min_new_tokens=new, pad_token_id=0)
    assert torch.equal(ours, reference), tokenizer.decode(ours[0, chat["input_ids"].shape[1]:].tolist())
