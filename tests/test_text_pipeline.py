"""transformers' ``pipeline("text-generation")`` with CausalQwen (`causal_qwen.core.text_pipeline`): the prompt's
numbers reach the model as values, the text is what `text_generation.generate` and ``causal-qwen generate`` write
(generated numbers with their digits), batches, several sequences, chats, tensors, clear errors, and a folder saved
by the pipeline that ``pipeline(..., trust_remote_code=True)`` loads with this class."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from transformers import pipeline

from causal_qwen import CausalTextGenerationPipeline
from causal_qwen.core.text_generation import NumericTextStreamer, generate

from .test_text_generation import CHAT_TEMPLATE, number_bias

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one thread (tests/conftest.py)

PRICE = "The price is 12.5 dollars and"
NUMBER = re.compile(r"-?\d+\.\d+")


@pytest.fixture(scope="module")
def generator(tiny_model, tokenizer):
    """The pipeline, built the way a researcher would with the model and its tokenizer in hand."""
    return pipeline("text-generation", model=tiny_model, tokenizer=tokenizer,
                    pipeline_class=CausalTextGenerationPipeline)


@pytest.fixture
def writes_numbers(tiny_model):
    """Within it every step writes a number (``<NUM>``'s bias raised)."""
    with number_bias(tiny_model, 1e4):
        yield


# ---- the text is what generate writes ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "pipeline_options, generate_options",
    [
        (dict(mode="standard"), dict(mode="standard")),
        (dict(mode="causal", seed=3), dict(mode="causal", seed=3)),
        (dict(mode="traditional", do_sample=False), dict(mode="traditional", temperature=0)),
        (dict(mode="traditional", do_sample=True, temperature=0.8, top_k=40, seed=2),
         dict(mode="traditional", temperature=0.8, top_k=40, seed=2)),
    ],
    ids=["standard", "causal", "traditional-greedy", "traditional-sampled"],
)
def test_the_text_is_what_generate_writes(generator, tiny_model, tokenizer, pipeline_options, generate_options):
    """The prompt as given, then the continuation `generate` writes for the same prompt and options."""
    expected = generate(tiny_model, tokenizer, PRICE, max_new_tokens=8, **generate_options)[0].text
    [record] = generator(PRICE, max_new_tokens=8, **pipeline_options)
    assert record == {"generated_text": PRICE + expected}
    [new] = generator(PRICE, max_new_tokens=8, return_full_text=False, **pipeline_options)
    assert new == {"generated_text": expected}


def test_generated_numbers_are_written_with_their_digits(generator, tiny_model, tokenizer, writes_numbers):
    """Each new number is written as `generate` writes it (to the digits its scale supports); transformers' own
    pipeline, which decodes the ids without their values, cannot write them."""
    [result] = generate(tiny_model, tokenizer, PRICE, mode="standard", max_new_tokens=3)
    [record] = generator(PRICE, mode="standard", max_new_tokens=3, return_full_text=False)
    assert record["generated_text"] == result.text
    assert NUMBER.findall(record["generated_text"]) == [number.text for number in result.numbers]
    assert len(result.numbers) == 3
    plain = pipeline("text-generation", model=tiny_model, tokenizer=tokenizer)
    with pytest.warns(UserWarning, match="every number is read as 0"), \
            pytest.raises(ValueError, match="no numeric_values were given"):
        plain(PRICE, mode="standard", do_sample=False, max_new_tokens=3)


def test_the_cli_prints_the_same_text(generator, tiny_model, tokenizer, writes_numbers, monkeypatch, capsys):
    from causal_qwen.cli import main
    from causal_qwen.conversion import loading

    monkeypatch.setattr(loading, "load_model_and_tokenizer", lambda **kwargs: (tiny_model, tokenizer))
    [record] = generator(PRICE, mode="standard", max_new_tokens=3)
    assert main(["generate", "--base", "random:tiny", "--max-new-tokens", "3", PRICE]) == 0
    assert capsys.readouterr().out.startswith(record["generated_text"] + "\nnumbers:\n")


def test_the_prompt_s_numbers_reach_the_model_as_values(generator, tokenizer, writes_numbers):
    """The tokens, values and scales come back with ``return_tensors``: 12.5 at the prompt's ``<NUM>`` (0 where the
    value was dropped), and ``tokenizer.decode`` writes the full text from them."""
    [record] = generator(PRICE, mode="standard", max_new_tokens=2, return_tensors=True)
    ids, values, scales = record["generated_token_ids"], record["numeric_values"], record["numeric_scales"]
    assert set(record) == {"generated_token_ids", "numeric_values", "numeric_scales"}
    prompt_length = tokenizer(PRICE)["input_ids"].shape[1]
    numbers = [index for index, token in enumerate(ids) if token == tokenizer.num_token_id]
    assert [values[index] for index in numbers[:1]] == [12.5] and len(numbers) == 3
    assert all(index >= prompt_length for index in numbers[1:])
    [text] = generator(PRICE, mode="standard", max_new_tokens=2)
    assert tokenizer.decode(ids, numeric_values=values, numeric_scales=scales) == text["generated_text"]


# ---- batches, several sequences, chats ---------------------------------------------------------------------
def test_a_batch_of_two_prompts(generator, tiny_model, tokenizer, writes_numbers):
    """One left-padded batch (``batch_size=2``) writes what `generate` writes for both prompts at once; one prompt
    at a time what it writes for each alone."""
    prompts = [PRICE, "Hello"]
    together = generate(tiny_model, tokenizer, prompts, mode="standard", max_new_tokens=3)
    records = generator(prompts, mode="standard", max_new_tokens=3, batch_size=2)
    assert records == [[{"generated_text": prompt + result.text}] for prompt, result in zip(prompts, together)]
    alone = [generate(tiny_model, tokenizer, prompt, mode="standard", max_new_tokens=3)[0] for prompt in prompts]
    records = generator(prompts, mode="standard", max_new_tokens=3)
    assert records == [[{"generated_text": prompt + result.text}] for prompt, result in zip(prompts, alone)]


def test_several_sequences_repeat_the_prompt(generator, tiny_model, tokenizer):
    """``num_return_sequences=2`` in causal mode: the prompt twice in the batch, each copy its own individuals."""
    expected = generate(tiny_model, tokenizer, [PRICE, PRICE], mode="causal", seed=7, max_new_tokens=6)
    records = generator(PRICE, mode="causal", seed=7, max_new_tokens=6, num_return_sequences=2,
                        return_full_text=False)
    assert records == [{"generated_text": result.text} for result in expected]
    assert records[0] != records[1]


def test_causal_seeds_follow_the_sequences_of_the_call_not_its_batches(generator, tiny_model, tokenizer):
    """Sequence ``r`` of a call draws from ``seed + r`` at every ``batch_size``, as `generate` (and so
    ``causal-qwen generate``) draws prompt ``r`` of its list: one prompt at a time, two, or three at once."""
    prompts = [PRICE, "Hello", PRICE]
    expected = generate(tiny_model, tokenizer, prompts, mode="causal", seed=5, max_new_tokens=6)
    for batch_size in (1, 2, 3):
        records = generator(prompts, mode="causal", seed=5, max_new_tokens=6, batch_size=batch_size,
                            return_full_text=False)
        assert records == [[{"generated_text": result.text}] for result in expected], batch_size
    assert expected[0].text != expected[2].text  # the same prompt, another seed
    copies = generate(tiny_model, tokenizer, [PRICE, PRICE, "Hello", "Hello"], mode="causal", seed=5,
                      max_new_tokens=6)
    records = generator([PRICE, "Hello"], mode="causal", seed=5, max_new_tokens=6, num_return_sequences=2,
                        return_full_text=False)
    assert records == [[{"generated_text": result.text} for result in copies[:2]],
                       [{"generated_text": result.text} for result in copies[2:]]]
    [again] = generator(PRICE, mode="causal", seed=5, max_new_tokens=6, return_full_text=False)
    assert again == {"generated_text": expected[0].text}  # a new call counts from 0 again


def test_a_chat_goes_through_the_chat_template(generator, tiny_model, tokenizer, monkeypatch):
    """A chat's number is read as a value too; the reply is what `generate` writes after the rendered prompt."""
    monkeypatch.setattr(tokenizer, "chat_template", CHAT_TEMPLATE, raising=False)
    chat = [{"role": "user", "content": "I paid 12.5 dollars"}]
    rendered = "<user>I paid 12.5 dollars\n<assistant>"
    reply = generate(tiny_model, tokenizer, rendered, mode="standard", max_new_tokens=4)[0].text
    [record] = generator(chat, mode="standard", max_new_tokens=4)
    assert record["generated_text"] == chat + [{"role": "assistant", "content": reply}]
    [ids] = generator(chat, mode="standard", max_new_tokens=4, return_tensors=True)
    assert 12.5 in ids["numeric_values"]


# ---- errors ---------------------------------------------------------------------------------------------------
def test_bad_inputs_give_clear_errors(generator, tiny_model, tokenizer):
    with pytest.raises(ValueError, match=r"unknown mode 'fast'; the modes are standard, causal, traditional"):
        generator(PRICE, mode="fast")
    with pytest.raises(ValueError, match="unknown mode 'fast'"):
        pipeline("text-generation", model=tiny_model, tokenizer=tokenizer, mode="fast",
                 pipeline_class=CausalTextGenerationPipeline)
    with pytest.raises(ValueError, match="do_sample applies to mode 'traditional' only"):
        generator(PRICE, mode="standard", do_sample=True)
    with pytest.raises(TypeError, match="needs the model's NumericTokenizer"):
        pipeline("text-generation", model=tiny_model, tokenizer=tokenizer.tokenizer,
                 pipeline_class=CausalTextGenerationPipeline)
    with pytest.raises(ValueError, match="streamer must be a causal_qwen NumericTextStreamer"):
        generator(PRICE, mode="standard", max_new_tokens=2, streamer=object())
    with pytest.raises(ValueError, match="the prompt is empty"):
        generator("", mode="standard")
    pieces: list = []  # a streamer of one's own is used, and its pieces sent
    [record] = generator(PRICE, mode="standard", max_new_tokens=2, return_full_text=False,
                         streamer=NumericTextStreamer(tokenizer, callback=pieces.append))
    assert "".join(piece.text for piece in pieces) == record["generated_text"]


# ---- a saved folder: the pipeline's save, or the model's ----------------------------------------------------
@pytest.mark.parametrize("saved_by", ["pipeline", "model"])
def test_a_saved_folder_loads_with_trust_remote_code(generator, tiny_model, tokenizer, tmp_path, saved_by):
    """``pipe.save_pretrained``, and the model's own ``save_pretrained`` (what ``convert`` and ``train`` write) with
    the tokenizer's: the config names this class in ``custom_pipelines`` and the folder carries its code, so
    ``pipeline("text-generation", folder, trust_remote_code=True)`` picks it in a Python that never imported
    ``causal_qwen``."""
    folder = tmp_path / "saved"
    try:
        if saved_by == "pipeline":
            generator.save_pretrained(folder)
        else:
            tiny_model.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
    finally:
        del tiny_model.config.custom_pipelines  # set on the shared model's config
    assert (folder / "text_pipeline.py").is_file() and (folder / "text_generation.py").is_file()
    assert json.loads((folder / "config.json").read_text())["custom_pipelines"]["text-generation"]["impl"] == \
        "text_pipeline.CausalTextGenerationPipeline"
    [expected] = generator(PRICE, mode="standard", max_new_tokens=4)
    script = f"""
import json, sys
from transformers import pipeline
generator = pipeline("text-generation", model={str(folder)!r}, trust_remote_code=True)
[record] = generator({PRICE!r}, mode="standard", max_new_tokens=4)
print(json.dumps([type(generator).__name__, record["generated_text"],
                  any(name.split(".")[0] == "causal_qwen" for name in sys.modules)]))
"""
    env = dict(os.environ, HF_MODULES_CACHE=str(tmp_path / "modules"), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [
        "CausalTextGenerationPipeline", expected["generated_text"], False]
