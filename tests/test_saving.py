"""``save_pretrained`` of the model and the tokenizer from Python: written beside the folder and moved in file by
file, so that a save that fails half-way leaves the earlier save whole (the command line's runs publish whole
folders, `run_folder`; these are the calls a user's own script makes)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from causal_qwen import CausalQwenForCausalLM
from causal_qwen.core import files
from causal_qwen.core.tokenizer import NumericTokenizer

from .conftest import byte_level_tokenizer, small_qwen
from .test_model import convert, random_ids


def folder_bytes(folder) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir()) if path.is_file()}


def test_a_model_save_keeps_other_files_drops_stale_shards_and_leaves_no_staging(tmp_path):
    model = convert(small_qwen())
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine", encoding="utf-8")
    (folder / "model-00001-of-00002.safetensors").write_bytes(b"an earlier sharded save")
    model.save_pretrained(folder)
    names = sorted(path.name for path in folder.iterdir())
    assert "notes.txt" in names and "model.safetensors" in names and "config.json" in names
    assert "model-00001-of-00002.safetensors" not in names
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model"]  # no staging folder left beside it
    reloaded = CausalQwenForCausalLM.from_pretrained(folder)
    ids = random_ids()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).loc_S, model(ids).loc_S, rtol=0, atol=0)


def test_a_model_save_that_fails_half_way_leaves_the_earlier_save_whole(tmp_path, monkeypatch):
    import transformers.modeling_utils

    folder = tmp_path / "model"
    convert(small_qwen(seed=0)).save_pretrained(folder)
    before = folder_bytes(folder)

    def half_written(tensors, filename, metadata=None):
        with open(filename, "wb") as handle:
            handle.write(b"half of the weights")
        raise OSError("No space left on device")

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", half_written)
    with pytest.raises(OSError, match="No space left"):
        convert(small_qwen(seed=1)).save_pretrained(folder)
    assert folder_bytes(folder) == before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model"]
    CausalQwenForCausalLM.from_pretrained(folder)  # still loads


def test_a_tokenizer_save_returns_the_folders_paths_and_fails_without_touching_it(tmp_path, monkeypatch):
    tokenizer = byte_level_tokenizer()
    folder = tmp_path / "tokenizer"
    written = tokenizer.save_pretrained(folder)
    assert written and all(str(path).startswith(str(folder)) and (folder / path.split("/")[-1]).is_file()
                           for path in written)
    reloaded = NumericTokenizer.from_pretrained(folder)
    text = "It cost 12.5 dollars."
    assert reloaded(text)["input_ids"].tolist() == tokenizer(text)["input_ids"].tolist()
    assert reloaded(text)["numeric_values"].tolist() == tokenizer(text)["numeric_values"].tolist()
    before = folder_bytes(folder)

    def failing(path, text):
        raise OSError("disk full")

    monkeypatch.setattr("causal_qwen.core.tokenizer.write_text_atomic", failing)
    with pytest.raises(OSError, match="disk full"):
        tokenizer.save_pretrained(folder)
    assert folder_bytes(folder) == before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["tokenizer"]


def test_saving_into_a_file_names_it(tmp_path):
    target = tmp_path / "weights"
    target.write_text("not a folder", encoding="utf-8")
    with pytest.raises(ValueError, match="it is a file, not a folder"):
        files.save_through_staging(target, lambda staging: None)


def test_a_save_into_the_working_folder_stages_beside_it(tmp_path, monkeypatch):
    folder = tmp_path / "here"
    folder.mkdir()
    monkeypatch.chdir(folder)
    written = byte_level_tokenizer().save_pretrained(".")
    assert all((folder / Path(path).name).is_file() for path in written)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["here"]
    assert not [path for path in folder.iterdir() if path.is_dir()]
