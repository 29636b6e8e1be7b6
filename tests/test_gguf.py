"""The real ``.gguf`` code paths, offline: a tiny Qwen2 written with ``gguf.GGUFWriter`` the way llama.cpp's
converter writes one (architecture ``qwen2``, F32 tensors under GGUF names, a byte-level BPE tokenizer with
``[PAD<id>]`` placeholders for the unused rows), then read back through transformers' GGUF loader by
`load_qwen_base`, `from_qwen` and the tokenizer loaders."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import Qwen2ForCausalLM
from transformers.convert_slow_tokenizer import bytes_to_unicode

from causal_qwen.conversion.conversion import load_qwen_base
from causal_qwen import from_qwen

from .conftest import small_qwen_config

gguf = pytest.importorskip("gguf")
pytest.importorskip("accelerate")  # transformers refuses GGUF files without it

# A miniature of a Qwen2.5 GGUF vocabulary: the 256 byte symbols (ids 0..255, as in Qwen's), a few merges,
# the control tokens, then placeholders "[PAD<id>]" for the embedding rows no token uses (151665.. in Qwen2.5).
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ n"]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BYTE_TOKENS = list(bytes_to_unicode().values())
FIRST_PAD = len(BYTE_TOKENS) + len(MERGES) + len(SPECIALS)  # 267: the first reserved slot, k
VOCAB = 288  # rows of the embedding, as the file's token list says
EOS_ID = len(BYTE_TOKENS) + len(MERGES)  # <|endoftext|>
# llama.cpp token types: 1 normal, 3 control, 5 unused
TOKEN_TYPES = [1] * (len(BYTE_TOKENS) + len(MERGES)) + [3] * len(SPECIALS) + [5] * (VOCAB - FIRST_PAD)

# Distinct from Qwen2Config's defaults, so a dropped metadata key shows in the logits or the config.
ROPE_THETA = 5000.0
RMS_EPS = 1e-5
CONTEXT = 256


class Q8_0:
    """Q8_0 blocks through gguf-py's own (reference) quantizer."""

    qtype = gguf.GGMLQuantizationType.Q8_0

    @classmethod
    def quantize(cls, values: np.ndarray) -> np.ndarray:
        return gguf.quants.quantize(values, cls.qtype)

    @classmethod
    def round_trip(cls, tensor: torch.Tensor) -> torch.Tensor:
        """What a Q8_0 file gives back for ``tensor``."""
        values = gguf.quants.dequantize(cls.quantize(tensor.numpy().astype(np.float32)), cls.qtype)
        return torch.from_numpy(np.ascontiguousarray(values))


def gguf_tokens() -> list[str]:
    tokens = BYTE_TOKENS + [merge.replace(" ", "") for merge in MERGES] + SPECIALS
    assert len(tokens) == FIRST_PAD
    return tokens + [f"[PAD{index}]" for index in range(FIRST_PAD, VOCAB)]


def write_gguf(model: Qwen2ForCausalLM, path: Path, quantize: bool = False) -> Path:
    """Write ``model`` as llama.cpp's converter would: metadata under ``qwen2.*``, tensors in F32 under GGUF
    names (Q/K not permuted for qwen2), ``output.weight`` only when the head is not tied to the embedding.

    ``quantize``: the 2-D weights in Q8_0 blocks (norms and biases stay F32), as in a ``*-q8_0.gguf``."""
    config = model.config
    assert config.rope_parameters["rope_theta"] == ROPE_THETA and config.rms_norm_eps == RMS_EPS
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_name("tiny-qwen2")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if quantize else gguf.LlamaFileType.ALL_F32)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(ROPE_THETA)
    writer.add_layer_norm_rms_eps(RMS_EPS)

    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(gguf_tokens())
    writer.add_token_types(TOKEN_TYPES)
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(EOS_ID)
    writer.add_eos_token_id(EOS_ID)
    writer.add_pad_token_id(EOS_ID)
    writer.add_add_bos_token(False)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2, config.num_hidden_layers)
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        module, suffix = hf_name.rsplit(".", 1)
        gguf_name = names.get_name(module)
        assert gguf_name is not None, hf_name
        values = tensor.detach().numpy().astype(np.float32)
        if quantize and values.ndim == 2:
            writer.add_tensor(f"{gguf_name}.{suffix}", Q8_0.quantize(values), raw_dtype=Q8_0.qtype)
        else:
            writer.add_tensor(f"{gguf_name}.{suffix}", values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def tiny_reference(tied: bool) -> Qwen2ForCausalLM:
    """The random model the file is written from (2 layers, width 32, GQA 4/2, the vocabulary above)."""
    config = small_qwen_config(tied=tied, vocab_size=VOCAB)
    config.rms_norm_eps = RMS_EPS
    config.rope_parameters = {"rope_type": "default", "rope_theta": ROPE_THETA}
    config.max_position_embeddings = CONTEXT
    torch.manual_seed(3)
    return Qwen2ForCausalLM(config).eval()


@pytest.fixture(params=[True, False], ids=["tied", "untied"])
def tiny_gguf(request, tmp_path):
    """``(path to tiny.gguf, the Qwen2ForCausalLM written into it)``."""
    model = tiny_reference(tied=request.param)
    return write_gguf(model, tmp_path / "tiny.gguf"), model


@pytest.fixture(scope="module")
def tokenizer_gguf(tmp_path_factory):
    """A tied tiny.gguf (the tokenizer tests only read its metadata, config included)."""
    return write_gguf(tiny_reference(tied=True), tmp_path_factory.mktemp("gguf_tok") / "tiny.gguf")


def sample_ids(length: int = 12) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (2, length), generator=generator)


@torch.no_grad()
def test_load_qwen_base_reads_the_gguf_exactly(tiny_gguf):
    path, reference = tiny_gguf
    loaded = load_qwen_base(path)
    assert isinstance(loaded, Qwen2ForCausalLM)
    config = loaded.config
    assert config.tie_word_embeddings is reference.config.tie_word_embeddings, "tied ⇔ output.weight absent"
    assert (config.vocab_size, config.hidden_size, config.intermediate_size) == (VOCAB, 32, 64)
    assert (config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads) == (2, 4, 2)
    assert config.max_position_embeddings == CONTEXT
    assert config.rope_parameters["rope_theta"] == ROPE_THETA
    assert config.rms_norm_eps == pytest.approx(RMS_EPS, rel=1e-6)  # stored as float32 in the file
    assert loaded.dtype == torch.float32
    for name, tensor in reference.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), f"{name} differs after the GGUF round trip"
    if config.tie_word_embeddings:
        assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    ids = sample_ids()
    assert (loaded(ids).logits - reference(ids).logits).abs().max() <= 1e-5
    # the (dir, gguf_file=name) spelling reaches the same file
    same = load_qwen_base(path.parent, gguf_file=path.name)
    assert torch.equal(same(ids).logits, loaded(ids).logits)


@torch.no_grad()
def test_from_qwen_converts_a_gguf_file(tiny_gguf):
    path, reference = tiny_gguf
    model = from_qwen(str(path), num_token_id=FIRST_PAD)
    assert model.config.num_token_id == FIRST_PAD
    assert model.config.vocab_size == VOCAB, "<NUM> takes the reserved slot: no new row"
    assert model.config.tie_word_embeddings is False
    ids = sample_ids()
    qwen_out = reference(ids, output_hidden_states=True)
    out = model(ids)
    assert (out.features - qwen_out.hidden_states[-1]).abs().max() <= 1e-5
    assert (out.loc_S - qwen_out.logits).abs().max() <= 1e-5
    assert torch.equal(out.logits, out.loc_S)
    head = model.action.classification_head.weight
    assert torch.equal(head, reference.lm_head.weight)
    assert head.data_ptr() != model.model.embed_tokens.weight.data_ptr(), "a clone, not a tie"


@torch.no_grad()
def test_load_qwen_base_dequantizes_a_q8_0_gguf(tmp_path):
    """A quantized file (the usual download): every weight is the Q8_0 round trip of the original, in float32."""
    reference = tiny_reference(tied=False)
    path = write_gguf(reference, tmp_path / "tiny-q8_0.gguf", quantize=True)
    loaded = load_qwen_base(path)
    assert loaded.dtype == torch.float32
    state = loaded.state_dict()
    for name, tensor in reference.state_dict().items():
        expected = Q8_0.round_trip(tensor) if tensor.dim() == 2 else tensor
        assert torch.equal(state[name], expected), name
    model = from_qwen(path, num_token_id=FIRST_PAD)
    with torch.no_grad():
        loc_S = model(sample_ids()).loc_S
    assert (loc_S - loaded(sample_ids()).logits).abs().max() <= 1e-5
    assert (loc_S - reference(sample_ids()).logits).abs().max() < 0.05  # Q8_0 error only


@torch.no_grad()
def test_from_qwen_default_slot_grows_a_small_gguf(tokenizer_gguf):
    """A vocabulary without Qwen2.5's slot 151665 gets one new row for <NUM> when no id is given."""
    path, reference = tokenizer_gguf, tiny_reference(tied=True)
    model = from_qwen(str(path))
    assert model.config.num_token_id == VOCAB and model.config.vocab_size == VOCAB + 1
    ids = sample_ids()
    out = model(ids)
    assert (out.loc_S[..., :VOCAB] - reference(ids).logits).abs().max() <= 1e-5


# ---- the tokenizer stored in the file -----------------------------------------------------------------------


def test_transformers_builds_the_byte_level_bpe_from_the_gguf(tokenizer_gguf):
    """The raw tokenizer transformers makes of the file: byte-level BPE with its merges, the Qwen2 split, specials."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_gguf.parent), gguf_file=tokenizer_gguf.name)
    tokens = gguf_tokens()
    assert len(tokenizer) == VOCAB
    assert tokenizer.get_vocab() == {token: index for index, token in enumerate(tokens)}
    assert tokenizer.eos_token_id == EOS_ID and tokenizer.pad_token_id == EOS_ID
    ids = tokenizer("the then<|im_end|>", add_special_tokens=False).input_ids
    assert tokenizer.convert_ids_to_tokens(ids) == ["t", "he", "Ġthe", "n", "<|im_end|>"]  # merges applied
    assert tokenizer("12", add_special_tokens=False).input_ids == [tokens.index("1"), tokens.index("2")]  # 1 digit each
    assert tokenizer.decode(ids) == "the then<|im_end|>"


def check_num_in_first_placeholder(tokenizer) -> None:
    assert tokenizer.num_token_id == FIRST_PAD, "<NUM> takes the first [PAD<id>] placeholder, keeping its id"
    assert tokenizer.num_token_origin == "placeholder"
    assert tokenizer.model_vocab_size == VOCAB  # read from the file's metadata
    assert tokenizer.reserved_slot_used
    assert len(tokenizer) == VOCAB, "no token added"
    base = tokenizer.tokenizer
    assert base.convert_ids_to_tokens(FIRST_PAD) == "<NUM>"
    assert base.convert_ids_to_tokens(FIRST_PAD + 1) == f"[PAD{FIRST_PAD + 1}]", "only the first slot is taken"
    assert tokenizer.eos_token_id == EOS_ID and tokenizer.pad_token_id == EOS_ID


def test_numeric_tokenizer_from_gguf_puts_num_in_the_first_placeholder(tokenizer_gguf):
    from causal_qwen.core.tokenizer import NumericTokenizer

    tokenizer = NumericTokenizer.from_pretrained(str(tokenizer_gguf.parent), gguf_file=tokenizer_gguf.name)
    check_num_in_first_placeholder(tokenizer)
    texts = ["the cost is 12.5 in total", "then 3"]
    encoded = tokenizer(texts)
    ids, values, mask = encoded["input_ids"], encoded["numeric_values"], encoded["attention_mask"]
    assert ids.shape == values.shape == mask.shape == (2, ids.shape[1])
    assert (ids == FIRST_PAD).sum(dim=1).tolist() == [1, 1]
    assert values[ids == FIRST_PAD].tolist() == [12.5, 3.0]
    assert torch.all(values[ids != FIRST_PAD] == 0)
    assert torch.all(ids[mask == 0] == EOS_ID)
    assert tokenizer.batch_decode(ids, values, mask) == texts


def test_load_tokenizer_for_base_reads_the_gguf(tokenizer_gguf):
    from causal_qwen.conversion.loading import load_tokenizer_for_base

    check_num_in_first_placeholder(load_tokenizer_for_base(tokenizer_gguf))
    check_num_in_first_placeholder(load_tokenizer_for_base(str(tokenizer_gguf.parent), gguf_file=tokenizer_gguf.name))


@torch.no_grad()
def test_gguf_model_and_tokenizer_together(tokenizer_gguf):
    """Tokenizer and model from the same file, <NUM> at the tokenizer's id: text positions before the first
    number score exactly as the Qwen2 that was written, and the number enters the embedding at its position."""
    from causal_qwen.conversion.loading import load_tokenizer_for_base

    tokenizer = load_tokenizer_for_base(tokenizer_gguf)
    model = from_qwen(tokenizer_gguf, num_token_id=tokenizer.num_token_id)
    assert model.config.vocab_size == VOCAB
    encoded = tokenizer(["the cost is 12.5 in total"])
    out = model(encoded["input_ids"], numeric_values=encoded["numeric_values"])
    position = int((encoded["input_ids"][0] == FIRST_PAD).nonzero())
    reference = tiny_reference(tied=True)(encoded["input_ids"]).logits
    assert (out.loc_S[:, :position] - reference[:, :position]).abs().max() <= 1e-5
    assert (out.loc_S[:, position:] - reference[:, position:]).abs().max() > 1e-3, "the value 12.5 is read"


def test_load_model_and_tokenizer_agree_on_num_for_a_gguf(tokenizer_gguf):
    from causal_qwen.conversion.loading import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(base=str(tokenizer_gguf))
    assert model.config.num_token_id == tokenizer.num_token_id
