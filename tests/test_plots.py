"""Plots: every figure is written as a PNG with content; bad input raises a clear error; the CLI kinds work."""

from __future__ import annotations

import json

import pytest
import torch

from causal_qwen.evaluation import plots

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def assert_png(path, min_bytes: int = 10_000) -> None:
    """A real PNG with more than a blank canvas in it (an empty 800x600 figure is about 5 kB)."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > min_bytes, f"{path} looks empty ({len(data)} bytes)"


def test_number_densities(tmp_path):
    path = plots.plot_number_densities([10.0, 20.0, 5.0], [11.0, 18.0, 5.5], [1.0, 2.0, 0.5], tmp_path / "d.png",
                                       titles=["a", "b", "c"], unit="temp (C)")
    assert_png(path)
    with pytest.raises(ValueError, match="positive"):
        plots.plot_number_densities([1.0], [1.0], [0.0], tmp_path / "x.png")
    with pytest.raises(ValueError, match="equal lengths"):
        plots.plot_number_densities([1.0, 2.0], [1.0], [1.0], tmp_path / "x.png")
    with pytest.raises(ValueError, match="empty"):
        plots.plot_number_densities([], [], [], tmp_path / "x.png")


def test_calibration(tmp_path):
    generator = torch.Generator().manual_seed(0)
    path = plots.plot_calibration({"held-out": torch.rand(200, generator=generator), "train": torch.rand(300, generator=generator)},
                                  tmp_path / "c.png")
    assert_png(path)
    with pytest.raises(ValueError, match="at least one series"):
        plots.plot_calibration({}, tmp_path / "x.png")
    with pytest.raises(ValueError, match=r"must lie in \[0, 1\]"):
        plots.plot_calibration({"ranks": torch.tensor([0.2, 1.5])}, tmp_path / "x.png")


def test_calibration_draws_the_pit_histogram_beside_the_reliability_curve(tmp_path):
    generator = torch.Generator().manual_seed(0)
    path = plots.plot_calibration({"uniform PIT": torch.rand(500, generator=generator)}, tmp_path / "c.png", bins=8)
    assert_png(path)
    from PIL import Image

    width, height = Image.open(path).size
    assert width > 1.6 * height  # two panels side by side


def test_next_token(tmp_path):
    path = plots.plot_next_token(["<NUM>", " high", ","], [0.6, 0.2, 0.01], [0.5, 0.3, 0.1], tmp_path / "n.png",
                                 context="rain 0.0 mm, low 5 C, high")
    assert_png(path)
    with pytest.raises(ValueError, match="equal lengths"):
        plots.plot_next_token(["a"], [0.5, 0.1], [0.2], tmp_path / "x.png")


def test_individual_space_projection(tmp_path):
    generator = torch.Generator().manual_seed(0)
    loc_U = torch.randn(50, 8, generator=generator) * torch.tensor([5.0, 3.0, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1])
    coords, explained = plots.project_2d(loc_U)
    assert coords.shape == (50, 2)
    assert float(explained.sum()) > 0.95  # two dominant directions
    path = plots.plot_individual_space(loc_U, torch.rand(50, 8, generator=generator), tmp_path / "i.png",
                                       color_values=torch.arange(50.0), color_label="value")
    assert_png(path)
    with pytest.raises(ValueError, match="shape"):
        plots.plot_individual_space(loc_U, torch.rand(50, 7), tmp_path / "x.png")
    with pytest.raises(ValueError, match="P >= 2"):
        plots.project_2d(torch.zeros(1, 8))


def test_training_curves(tmp_path):
    records = [{"step": s, "loss": 5.0 / s, "cls_loss": 1.0 / s, "reg_loss": 4.0 / s, "lr": 0.01} for s in range(1, 30)]
    records.append({"step": 15, "eval_loss": 0.5})
    assert_png(plots.plot_training_curves(records, tmp_path / "t.png"))
    with pytest.raises(ValueError, match="no step"):
        plots.plot_training_curves([{"step": 1, "epoch": 0.1}], tmp_path / "x.png")


def test_forecasts(tmp_path):
    x = torch.arange(40.0)
    truth = 15 + 5 * torch.sin(x / 6)
    path = plots.plot_forecasts(x, truth, truth + 0.5, torch.ones(40), tmp_path / "f.png",
                                baselines={"median": torch.full((40,), 15.0)})
    assert_png(path)


def test_bad_output_paths(tmp_path):
    with pytest.raises(ValueError, match=r"\.png"):
        plots.plot_number_densities([1.0], [1.0], [1.0], tmp_path / "figure.jpg")
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(ValueError, match="cannot write"):
        plots.plot_number_densities([1.0], [1.0], [1.0], blocker / "figure.png")


# ---- the CLI ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from causal_qwen.cli import main

    out = tmp_path_factory.mktemp("plot_models") / "tiny"
    assert main(["convert", "--base", "random:tiny", "--out", str(out)]) == 0
    return out


@pytest.fixture()
def table(tmp_path):
    path = tmp_path / "table.csv"
    path.write_text("day,low,high\n1,3.5,10.5\n2,4.0,11.0\n3,6.5,12.5\n4,2.0,9.0\n")
    return path


def test_cli_plot_kinds(tiny_dir, table, tmp_path):
    from causal_qwen.cli import main

    common = ["--model", str(tiny_dir), "--data", str(table), "--template", "low {low} C, high {high} C."]
    assert main(["plot", "numbers", *common, "--number-index", "-1", "--count", "3", "--out", str(tmp_path / "n.png")]) == 0
    assert_png(tmp_path / "n.png")
    assert main(["plot", "calibration", *common, "--out", str(tmp_path / "c.png")]) == 0
    assert_png(tmp_path / "c.png")
    assert main(["plot", "individuals", *common, "--out", str(tmp_path / "i.png")]) == 0
    assert_png(tmp_path / "i.png")
    assert main(["plot", "next-token", "--model", str(tiny_dir), "--text", "low 3.5 C, high", "--top-k", "5",
                 "--out", str(tmp_path / "t.png")]) == 0
    assert_png(tmp_path / "t.png")


def test_cli_plot_training_and_errors(tmp_path, capsys):
    from causal_qwen.cli import main

    metrics = tmp_path / "run" / "metrics.jsonl"
    metrics.parent.mkdir()
    metrics.write_text("".join(json.dumps({"step": s, "loss": 3.0 / s, "reg_loss": 2.0 / s}) + "\n" for s in range(1, 9)))
    assert main(["plot", "training", str(metrics.parent), "--out", str(tmp_path / "curves.png")]) == 0
    assert_png(tmp_path / "curves.png")
    (metrics.parent / "final").mkdir()  # the run's model folder, as eval and predict are given it
    assert main(["plot", "training", str(metrics.parent / "final"), "--out", str(tmp_path / "final.png")]) == 0
    assert_png(tmp_path / "final.png")
    assert main(["plot", "training", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "x.png")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_cli_plot_numbers_without_numbers(tiny_dir, tmp_path, capsys):
    from causal_qwen.cli import main

    text = tmp_path / "plain.txt"
    text.write_text("no digits here\nnor here\n")
    assert main(["plot", "numbers", "--model", str(tiny_dir), "--data", str(text), "--out", str(tmp_path / "n.png")]) == 2
    assert "no numbers" in capsys.readouterr().err


def test_cli_plot_refuses_an_output_that_is_no_png_before_any_work(tmp_path, capsys):
    from causal_qwen.cli import main

    never_read = ["--model", str(tmp_path / "no_model"), "--data", str(tmp_path / "no_data.csv")]
    for kind in ("numbers", "calibration", "individuals"):
        assert main(["plot", kind, *never_read, "--out", str(tmp_path / "figure.jpg")]) == 2
        assert "plot output must be a .png file" in capsys.readouterr().err, kind
    assert main(["plot", "next-token", "--model", str(tmp_path / "no_model"), "--text", "x",
                 "--out", str(tmp_path / "figure.pdf")]) == 2
    assert "plot output must be a .png file" in capsys.readouterr().err


def test_cli_plot_training_reads_a_bom_and_names_a_line_that_is_no_object(tmp_path, capsys):
    from causal_qwen.cli import main

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_bytes(b"\xef\xbb\xbf" + b"".join(json.dumps({"step": s, "loss": 1.0 / s}).encode() + b"\n"
                                                  for s in range(1, 4)))
    assert main(["plot", "training", str(metrics), "--out", str(tmp_path / "curves.png")]) == 0
    metrics.write_text('{"step": 1, "loss": 1.0}\n5\n', encoding="utf-8")
    assert main(["plot", "training", str(metrics), "--out", str(tmp_path / "curves.png")]) == 2
    assert f"{metrics}: line 2 is a JSON int, not an object" in capsys.readouterr().err
    metrics.write_text('{"step": 1, "loss": 1.0}\n{"step": "a", "loss": 0.5}\n', encoding="utf-8")
    assert main(["plot", "training", str(metrics), "--out", str(tmp_path / "curves.png")]) == 2
    assert "metrics record 2: step 'a' is not a number" in capsys.readouterr().err
