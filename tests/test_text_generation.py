"""Text in and out of `model.generate` (`causal_qwen.core.text_generation`): `generate` equals its documented steps
(arguments, the streamer, its results: pieces, texts, numbers, finish reasons, individuals, seeded samples); the
decision reads no full-vocabulary scale where a cached one decides; the generate command on top of it."""

from __future__ import annotations

import json
import re
import threading

import pytest
import torch

from causal_qwen.core.cauchy import decision_score
from causal_qwen.core.generation import MODES, generate_ids
from causal_qwen.core.text_generation import NumericTextStreamer, generate, generate_arguments
from causal_qwen import from_qwen

from .conftest import SMALL_NUM_ID, small_qwen

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one thread (tests/conftest.py)

PROMPTS = ("The capital of France is", "Once upon a time, in a small village by the sea, there lived", "Hello")


def through_model_generate(model, tokenizer, prompts, callback=None, track_text=True, **options):
    """`generate`'s call made step by step with ``model.generate``: (results, the pieces sent to the callback)."""
    pieces: list = []
    streamer = NumericTextStreamer(tokenizer, callback=callback or pieces.append, track_text=track_text)
    with torch.inference_mode():
        model.generate(**generate_arguments(model, tokenizer, prompts, **options), streamer=streamer,
                       tokenizer=tokenizer)
    return streamer.results(prompts), pieces


def assert_same_generation(model, tokenizer, prompts, **options):
    """Results and streamed pieces of both ways are equal; returns the results."""
    expected_pieces: list = []
    expected = generate(model, tokenizer, list(prompts), callback=expected_pieces.append, **options)
    results, pieces = through_model_generate(model, tokenizer, list(prompts), **options)
    assert [r.to_dict() for r in results] == [r.to_dict() for r in expected]
    assert pieces == expected_pieces
    return results


class number_bias:
    """Within it, ``<NUM>``'s classification bias is raised by ``amount`` (1e4: every step writes a number)."""

    def __init__(self, model, amount: float) -> None:
        self.bias, self.num_id, self.amount = model.action.classification_head.bias, model.config.num_token_id, amount

    def __enter__(self):
        with torch.no_grad():
            self.bias[self.num_id] += self.amount

    def __exit__(self, *exc):
        with torch.no_grad():
            self.bias[self.num_id] -= self.amount


# ---- generate equals its documented steps ------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_texts_pieces_and_results_equal_the_documented_steps(tiny_model, tokenizer, mode):
    """Traditional mode samples (temperature 1, seed 5): the same samples, from torch's seeded global generator."""
    options = {"seed": 5} if mode != "standard" else {}
    results = assert_same_generation(tiny_model, tokenizer, PROMPTS, mode=mode, max_new_tokens=12, **options)
    assert all(len(result.token_ids) == 12 and result.finish_reason == "length" for result in results)
    if mode == "causal":  # the token scope: a fresh individual every token, replayed from the seed
        assert results[0].individual is None and results[0].seed == 5


@pytest.mark.parametrize("mode", MODES)
def test_generated_numbers_are_written_and_carried_alike(tiny_model, tokenizer, mode):
    """Every step writes a number; "." inside a number is no stop string; the JSON form of the results is equal."""
    options = {"seed": 2} if mode != "standard" else {}
    with number_bias(tiny_model, 1e4):
        results = assert_same_generation(
            tiny_model, tokenizer, PROMPTS[:2], mode=mode, max_new_tokens=3, stop_strings=["."], **options
        )
    for result in results:
        assert len(result.numbers) == 3 and result.finish_reason == "length"
        assert (result.numbers[0].scale is None) == (mode == "causal")


def test_stop_strings_and_end_of_sequence_end_rows_alike(tiny_model, tokenizer):
    free = generate(tiny_model, tokenizer, list(PROMPTS), mode="standard", max_new_tokens=16)
    stop = free[0].text[3:6]
    stopped = assert_same_generation(tiny_model, tokenizer, PROMPTS, mode="standard", max_new_tokens=16,
                                     stop_strings=[stop, "\n"])
    assert stopped[0].finish_reason == "stop_string" and stopped[0].text.endswith(stop)
    assert len(stopped[0].token_ids) < 16
    eos = free[1].token_ids[0]  # row 1 ends at its first token; the others go on (unless they write it too)
    ended = assert_same_generation(tiny_model, tokenizer, PROMPTS, mode="standard", max_new_tokens=16, eos_token_id=eos)
    assert ended[1].finish_reason == "eos" and ended[1].token_ids == [eos] and ended[1].text == ""
    assert any(result.finish_reason == "length" for result in ended)
    assert_same_generation(tiny_model, tokenizer, PROMPTS, mode="standard", max_new_tokens=16, eos_token_id=eos,
                           min_new_tokens=3)
    last_step = free[0].token_ids[-1]  # a stop met at the last step: finish reason "length", as before
    text_of_last = tokenizer.decode([last_step])
    if text_of_last.strip():
        assert_same_generation(tiny_model, tokenizer, PROMPTS[:1], mode="standard", max_new_tokens=16,
                               stop_strings=[text_of_last])


def test_sampling_options_and_a_replayed_individual(tiny_model, tokenizer):
    traditional = dict(mode="traditional", temperature=0.7, top_k=20, top_p=0.9, seed=11, max_new_tokens=10)
    assert_same_generation(tiny_model, tokenizer, PROMPTS, **traditional)
    greedy = assert_same_generation(tiny_model, tokenizer, PROMPTS, mode="traditional", temperature=0, max_new_tokens=6)
    sequence = dict(mode="causal", individual_scope="sequence")
    drawn = generate(tiny_model, tokenizer, PROMPTS[:1], **sequence, seed=4, max_new_tokens=6)[0]
    replayed = assert_same_generation(tiny_model, tokenizer, PROMPTS, **sequence, individual=drawn.individual,
                                      max_new_tokens=6)
    assert replayed[0].token_ids == drawn.token_ids and torch.equal(replayed[2].individual, drawn.individual)
    assert greedy[0].individual is None
    for mode in ("causal", "traditional"):  # no seed: one drawn from torch's global generator, the same both ways
        torch.manual_seed(8)
        expected = generate(tiny_model, tokenizer, list(PROMPTS), mode=mode, max_new_tokens=6)
        after = torch.get_rng_state()
        torch.manual_seed(8)
        results, _ = through_model_generate(tiny_model, tokenizer, list(PROMPTS), mode=mode, max_new_tokens=6)
        assert [r.to_dict() for r in results] == [r.to_dict() for r in expected]
        assert torch.equal(torch.get_rng_state(), after)


def test_untracked_text_is_decoded_once_at_the_end(tiny_model, tokenizer):
    options = dict(mode="causal", seed=1, max_new_tokens=8)
    expected = generate(tiny_model, tokenizer, list(PROMPTS), **options)
    results, pieces = through_model_generate(tiny_model, tokenizer, list(PROMPTS), track_text=False, **options)
    assert [r.to_dict() for r in results] == [r.to_dict() for r in expected]
    assert [(p.index, p.text, p.finished) for p in pieces] == [(0, "", True), (1, "", True), (2, "", True)]


def test_the_streamer_can_be_iterated_from_another_thread(tiny_model, tokenizer):
    streamer = NumericTextStreamer(tokenizer, timeout=120)
    arguments = generate_arguments(tiny_model, tokenizer, list(PROMPTS), mode="standard", max_new_tokens=8)
    worker = threading.Thread(target=tiny_model.generate, kwargs=dict(**arguments, streamer=streamer))
    worker.start()
    texts = {index: "" for index in range(len(PROMPTS))}
    finished = []
    for piece in streamer:
        texts[piece.index] += piece.text
        if piece.finished:
            finished.append(piece.index)
    worker.join()
    assert sorted(finished) == [0, 1, 2]
    assert [texts[i] for i in range(3)] == [r.text for r in streamer.results(PROMPTS)]
    with pytest.raises(TypeError, match="cannot be iterated"):
        iter(NumericTextStreamer(tokenizer, callback=print))
    with pytest.raises(RuntimeError, match="CausalQwenForCausalLM.generate"):
        NumericTextStreamer(tokenizer).put(torch.zeros(1, 3, dtype=torch.long))


def test_bad_options_give_clear_errors(tiny_model, tokenizer):
    cases = [
        (dict(mode="beam"), ValueError, "standard, causal, traditional"),
        (dict(mode="standard", temperature=0.7), ValueError, "only applies to mode 'traditional'"),
        (dict(mode="standard", individual=[0.5] * 64), ValueError, "only apply to mode 'causal'"),
        (dict(mode="causal", individual_scope="sequence", individual=[0.5] * 5), ValueError, "individual has shape"),
        (dict(mode="causal", individual=[0.5] * 64), ValueError, "individual_scope='sequence'"),
        (dict(mode="causal", causal_temperature=-1.0), ValueError, "causal_temperature"),
        (dict(mode="causal", causal_temperature=1e39), ValueError, "beyond float32's largest"),  # once: '!' (id 0)
        (dict(max_new_tokens=0), ValueError, "max_new_tokens"),
        (dict(mode="traditional", top_p=1.5), ValueError, "top_p"),
        (dict(stop_strings=[""]), ValueError, "stop strings must be non-empty"),
        (dict(mode="causal", seed="3"), TypeError, "seed must be an int"),
    ]
    for options, error, message in cases:
        with pytest.raises(error, match=message):
            generate(tiny_model, tokenizer, list(PROMPTS), **options)
        with pytest.raises(error, match=message):
            generate_arguments(tiny_model, tokenizer, list(PROMPTS), **options)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        generate_arguments(tiny_model, tokenizer, ["a", ""])
    arguments = generate_arguments(tiny_model, tokenizer, ["a"], mode="causal")
    arguments["seed"] = "3"
    with pytest.raises(TypeError, match="seed must be an int"):
        tiny_model.generate(**arguments)


# ---- model.generate: seeds and the decision's cost -------------------------------------------------------------
def test_a_seed_replays_the_samples_and_leaves_torch_generators_alone():
    model = from_qwen(small_qwen(), num_token_id=SMALL_NUM_ID)
    ids = torch.randint(1, 400, (3, 7), generator=torch.Generator().manual_seed(1))
    options = dict(max_new_tokens=8, min_new_tokens=8, pad_token_id=0)  # both ban the model's end-of-sequence id
    ours = generate_ids(model, ids, mode="traditional", seed=7, temperature=0.9, **options)
    state = torch.get_rng_state()
    sampled = model.generate(input_ids=ids, mode="traditional", do_sample=True, temperature=0.9, top_k=0, seed=7,
                             **options)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(sampled[:, ids.shape[1]:], ours.token_ids)
    other = generate_ids(model, ids, mode="traditional", seed=8, temperature=0.9, **options)
    assert not torch.equal(other.token_ids, ours.token_ids)
    for scope in ("token", "sequence"):
        causal = generate_ids(model, ids, mode="causal", individual_scope=scope, seed=7, **options)
        hf = model.generate(input_ids=ids, mode="causal", individual_scope=scope, seed=7, return_dict_in_generate=True,
                            **options)
        assert torch.equal(torch.get_rng_state(), state)
        assert torch.equal(hf.sequences[:, ids.shape[1]:], causal.token_ids) and hf.seed == causal.seed == 7
    # a seed beyond torch's range wraps into [0, 2**64) as causal mode's row seeds do (it was a ValueError)
    wrapped = generate_ids(model, ids, mode="traditional", seed=2**64 + 7, temperature=0.9, **options)
    assert torch.equal(wrapped.token_ids, ours.token_ids)


@pytest.mark.parametrize("mode", MODES)
def test_no_full_vocabulary_scale_is_formed_where_a_cached_one_decides(tiny_model, monkeypatch, mode):
    """The calibrated conversion has W_scale = 0: standard mode decides with the cached position-free scale (V,),
    causal mode with its constant scale, traditional mode on loc_S; none forms the (B,S,V) scale_S."""
    ids = torch.randint(10, 150000, (2, 5), generator=torch.Generator().manual_seed(3))
    expected = generate_ids(tiny_model, ids, mode=mode, max_new_tokens=4, min_new_tokens=4,
                            **({"temperature": 0} if mode == "traditional" else {"seed": 1} if mode == "causal" else {}))

    def refuse(*args, **kwargs):
        raise AssertionError("the full scale_S was formed")

    monkeypatch.setattr(tiny_model.action, "classify", refuse)
    hf = tiny_model.generate(input_ids=ids, mode=mode, seed=expected.seed, max_new_tokens=4,
                             min_new_tokens=4, do_sample=False, pad_token_id=0, return_dict_in_generate=True)
    assert torch.equal(hf.sequences[:, ids.shape[1]:], expected.token_ids)


def test_standard_scores_with_the_cached_scale_are_the_decision_scores(tiny_model):
    ids = torch.randint(10, 150000, (2, 5), generator=torch.Generator().manual_seed(4))
    hf = tiny_model.generate(input_ids=ids, mode="standard", max_new_tokens=1, pad_token_id=0, eos_token_id=None,
                             return_dict_in_generate=True, output_logits=True)
    with torch.no_grad():
        out = tiny_model(ids)
    expected = decision_score(out.loc_S[:, -1], out.scale_S[:, -1], tiny_model.ovr_thresholds())
    torch.testing.assert_close(hf.logits[0], expected, rtol=1e-5, atol=0)
    assert torch.equal(hf.logits[0].argmax(-1), expected.argmax(-1))
    assert torch.isnan(hf.numeric_scales[:, : ids.shape[1]]).all()


# ---- the generate command ---------------------------------------------------------------------------------------
@pytest.fixture
def cli(monkeypatch, tiny_model, tokenizer):
    from causal_qwen.cli import main
    from causal_qwen.conversion import loading

    monkeypatch.setattr(loading, "load_model_and_tokenizer", lambda **kwargs: (tiny_model, tokenizer))
    return main


@pytest.mark.parametrize(
    "flags, options",
    [
        (["--mode", "causal", "--seed", "3"], dict(mode="causal", seed=3)),
        (["--mode", "causal", "--seed", "3", "--individual-scope", "sequence", "--causal-temperature", "2e7"],
         dict(mode="causal", seed=3, individual_scope="sequence", causal_temperature=2e7)),
        (["--mode", "traditional", "--seed", "2", "--temperature", "0.8", "--top-k", "40"],
         dict(mode="traditional", seed=2, temperature=0.8, top_k=40)),
        (["--stop", "e", "--min-new-tokens", "2"], dict(mode="standard", stop_strings=("e",), min_new_tokens=2)),
    ],
    ids=["causal", "causal-sequence", "traditional", "standard-stop"],
)
def test_cli_json_equals_generate(cli, capsys, tiny_model, tokenizer, flags, options):
    argv = ["generate", "--base", "random:tiny", "--max-new-tokens", "6", "--json", *flags, *PROMPTS[:2]]
    assert cli(argv) == 0
    raw = capsys.readouterr().out
    printed = json.loads(raw)
    expected = generate(tiny_model, tokenizer, list(PROMPTS[:2]), max_new_tokens=6, **options)
    assert printed == json.loads(json.dumps([result.to_dict() for result in expected]))
    for result in expected:  # non-ASCII text is written as itself, not as \u escapes
        assert json.dumps(result.text, ensure_ascii=False) in raw


CHAT_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}")


def test_cli_chat_sends_each_prompt_through_the_chat_template(cli, capsys, monkeypatch, tiny_model, tokenizer):
    """``generate --chat``: each PROMPT is a user's message rendered by the tokenizer's chat template (after a
    ``--system`` message), the model continues the rendered text, and the stream shows the message, then the reply.
    Without a template, or ``--system`` without ``--chat``, a one-line error."""
    assert cli(["generate", "--base", "random:tiny", "--chat", "Hello"]) == 2
    assert "--chat: the model's tokenizer has no chat template" in capsys.readouterr().err
    assert cli(["generate", "--base", "random:tiny", "--system", "Be brief.", "Hello"]) == 2
    assert "--system applies to --chat only" in capsys.readouterr().err

    monkeypatch.setattr(tokenizer, "chat_template", CHAT_TEMPLATE, raising=False)
    argv = ["generate", "--base", "random:tiny", "--max-new-tokens", "4", "--chat", "--system", "Be brief."]
    assert cli(argv + ["--json", "Hello", "What is 2 plus 3?"]) == 0
    printed = json.loads(capsys.readouterr().out)
    rendered = ["<system>Be brief.\n<user>Hello\n<assistant>", "<system>Be brief.\n<user>What is 2 plus 3?\n<assistant>"]
    assert [result["prompt"] for result in printed] == rendered
    expected = generate(tiny_model, tokenizer, rendered, max_new_tokens=4)
    assert printed == json.loads(json.dumps([result.to_dict() for result in expected]))
    assert cli(argv + ["Hello"]) == 0
    assert capsys.readouterr().out.startswith("Hello\n" + generate(tiny_model, tokenizer, rendered[:1], max_new_tokens=4)[0].text)
    # An empty message is still a chat turn (the template writes its markup); an empty plain prompt is not.
    assert cli(argv + ["--json", ""]) == 0
    assert json.loads(capsys.readouterr().out)[0]["prompt"] == "<system>Be brief.\n<user>\n<assistant>"
    assert cli(["generate", "--base", "random:tiny", "Hello", ""]) == 2
    assert "prompt 1 is empty" in capsys.readouterr().err


def test_cli_streams_as_before(cli, capsys, tiny_model, tokenizer):
    with number_bias(tiny_model, 1e4):
        assert cli(["generate", "--base", "random:tiny", "--max-new-tokens", "2", "The price is"]) == 0
        single = capsys.readouterr().out
        expected = generate(tiny_model, tokenizer, "The price is", max_new_tokens=2)[0]
    assert single.startswith("The price is" + expected.text + "\nnumbers:\n  number at token 0: ")
    # The median and the interval's ends are written at the precision of the number as it was written.
    written, *shown = re.search(r"number at token 0: (\S+)  \(median (\S+); 50% \[(\S+), (\S+)\]; "
                                r"90% \[(\S+), (\S+)\]\)", single).groups()
    assert written == expected.numbers[0].text
    assert {len(end.partition(".")[2]) for end in shown} == {len(written.partition(".")[2])}
    assert cli(["generate", "--base", "random:tiny", "--max-new-tokens", "3", *PROMPTS]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    expected = generate(tiny_model, tokenizer, list(PROMPTS), max_new_tokens=3)
    assert lines == [f"[{index}] {PROMPTS[index]}{result.text}" for index, result in enumerate(expected)]


def test_a_number_written_after_a_prompt_ending_in_one_is_set_apart(tiny_model, tokenizer):
    """Prompt "1e-3" and a first new number 2.5 would join into "1e-32.5", which reads back as no number: the text
    starts with a space there, and prompt + text reads back as the prompt's number, then the new one."""
    from causal_qwen.core.numbers import find_numbers

    with number_bias(tiny_model, 1e4):
        ending, spaced = generate(tiny_model, tokenizer, ["1e-3", "costs 3 and"], mode="standard", max_new_tokens=1)
    assert ending.text.startswith(" ") and not spaced.text.startswith("  ")
    read = [span.value for span in find_numbers("1e-3" + ending.text)]
    assert read == [pytest.approx(1e-3), pytest.approx(ending.numbers[0].value, rel=1e-6)]


def test_a_number_written_right_after_a_prompt_s_word_is_set_apart(tiny_model, tokenizer):
    """Prompt "The price is" and a first new number 2.5 would join into "is2.5", which reads back as text: the
    text starts with a space there, not after a prompt that ends in one."""
    from causal_qwen.core.numbers import find_numbers

    with number_bias(tiny_model, 1e4):
        glued, spaced = generate(tiny_model, tokenizer, ["The price is", "The price is "], mode="standard",
                                 max_new_tokens=1)
    assert glued.text.startswith(" ") and not spaced.text.startswith(" ")
    read = [span.value for span in find_numbers("The price is" + glued.text)]
    assert read == [pytest.approx(glued.numbers[0].value, rel=1e-6)]


def test_predict_refuses_a_text_longer_than_the_model_reads(tiny_model, tokenizer):
    from causal_qwen.evaluation.predict import predict_next

    limit = tiny_model.config.max_position_embeddings
    with pytest.raises(ValueError, match=f"reads at most {limit:,} positions"):
        predict_next(tiny_model, tokenizer, " ".join(["word"] * (limit + 10)))


def test_cli_individual_scope_outside_causal_mode_is_an_error(tmp_path, capsys):
    from causal_qwen.cli import main

    assert main(["generate", "--model", str(tmp_path / "no_model"), "--individual-scope", "sequence", "hi"]) == 2
    assert "--individual-scope and --causal-temperature apply to --mode causal only" in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [
    (["--mode", "causal", "--top-k", "5"], "top_k only applies to mode 'traditional'"),
    (["--max-new-tokens", "3", "--min-new-tokens", "5"], "min_new_tokens=5 exceeds max_new_tokens=3"),
])
def test_cli_generation_options_are_checked_before_the_model_loads(tmp_path, capsys, flags, message):
    """A conflict between options is named before any model is read (once only after loading it, a minute on a
    real base): here the model folder does not even exist."""
    from causal_qwen.cli import main

    assert main(["generate", "--model", str(tmp_path / "no_model"), *flags, "hi"]) == 2
    assert message in capsys.readouterr().err


def test_a_decimal_comma_tokenizer_writes_and_reads_back_the_numbers_generated(tiny_model):
    """With ``decimal_comma`` (``convert --decimal-comma``) a generated number is written ``6,5``, as the same
    tokenizer reads it back (``6.5`` would be text to it), in the text, each number's own text and predict's line;
    a stop string ``","`` does not cut a number written so."""
    from causal_qwen.core.tokenizer import NumericTokenizer
    from causal_qwen.evaluation.predict import predict_next

    german = NumericTokenizer.default(decimal_comma=True)
    with number_bias(tiny_model, 1e4):
        results = assert_same_generation(tiny_model, german, ["Der Preis ist"], mode="standard", max_new_tokens=3,
                                         stop_strings=[","])
        forecast = predict_next(tiny_model, german, "Der Preis ist").number
    written = [number.text for number in results[0].numbers]
    assert written and all("." not in text for text in written) and any("," in text for text in written)
    assert [number.value for number in german.find_numbers(results[0].text)] == [
        float(text.replace(",", ".")) for text in written]
    assert "." not in forecast.text and german.find_numbers(forecast.text)[0].value == pytest.approx(forecast.median,
                                                                                                       rel=1e-3)


@pytest.mark.parametrize("prompt_words", [3, 30])
def test_a_streamer_without_max_new_tokens_follows_hugging_faces_default_length(tiny_model, tokenizer, prompt_words):
    """Without max_new_tokens or max_length Hugging Face writes 20 new tokens after any prompt: the streamer's rows
    hold all of them, also after a prompt longer than 20 tokens (it once took 20 tokens in all, prompt included)."""
    batch = tokenizer(["word " * prompt_words], return_tensors="pt")
    streamer = NumericTextStreamer(tokenizer, callback=lambda piece: None)
    with torch.inference_mode():
        out = tiny_model.generate(**batch, mode="standard", streamer=streamer, min_new_tokens=20,
                                  return_dict_in_generate=True)
    result = streamer.results(["prompt"])[0]
    assert out.sequences.shape[1] - batch["input_ids"].shape[1] == 20
    assert result.token_ids == out.sequences[0, batch["input_ids"].shape[1]:].tolist()
    assert result.finish_reason == "length"


def test_the_text_path_reads_the_prompts_numbers_at_the_tokenizers_precision(tiny_model, tokenizer):
    """`generate_arguments` (the CLI's and `generate`'s path) hands model.generate the tokenizer's float64 values, as
    model.generate(**tokenizer(...)) does: 16777217 once reached the model as float32's 16777216."""
    arguments = generate_arguments(tiny_model, tokenizer, ["The town had 16777217 people and"], mode="standard",
                                   max_new_tokens=1)
    assert 16777217.0 in arguments["numeric_values"].flatten().tolist()
    with torch.inference_mode():
        out = tiny_model.generate(**arguments, return_dict_in_generate=True)
    assert 16777217.0 in out.numeric_values.flatten().tolist()
