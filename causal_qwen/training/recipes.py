"""One default recipe per kind of base: the training settings a config leaves out.

A config that names only ``data``, ``template``, ``target`` and a split trains sensibly: every setting below that
the config does not give comes from the recipe of the base's kind.

``random`` — a randomly initialised preset (``random:tiny``, the embedded default): the base knows nothing to
keep, so everything trains, the heads fast (3e-2) and the backbone ten times slower, and the decision scale
learns the numbers' spread. The regression head starts at its ridge fit (`warm_start`) with a strong relative
ridge (1): Adam moves ``b_reg`` by about its rate per step, 0.18 in 180 steps at 1e-3, so without the start a
target in the thousands (a payroll, a generation in GWh) is never reached, and a weak ridge (1e-2) overfits the
tiny model's random features (docs/benchmarks.md, "Tables nobody tuned for": 4, 5 and 6 of 9 tables below their
median without a start, at 1e-2 and at 1).

``pretrained`` — a real Qwen2/Qwen2.5 base: the backbone and the numeric embedding stay frozen and the heads move
at 1e-5, so general text keeps its perplexity (×1.001 after 60 steps); the regression head and the ``<NUM>`` row
start at their closed-form fits on the frozen features (`warm_start`; the regression's ridge chosen by its
out-of-fold error, ``auto``: a table of 35 rows wants a far stronger ridge than one of 1,300), which is where
nearly all of what the heads learn comes from (benchmarks/real_weights_finetune.py; docs/design.md, "Fine-tuning
a calibrated model"). With
nothing before the heads training, the backbone runs once per example (`feature_cache`), not once per step.

Both keep a tenth of the training rows (the latest ones when the split is by a column such as a date; at least 8
when that takes at most a quarter of them) to check the number locations and the width of the number intervals after
training: the width is rescaled when it is off (``interval_check``). Both check the locations too: they shrink
toward the training median when that median alone predicts the kept rows better than the model does, and a blend
with it does so clearly (`location_check`). The random recipe checks them only when the kept rows are a seeded pick,
which stands for a random split's held-out rows (``location_check: seeded``; a tiny model that memorised its table's
text): after a split in time the tiny model's latest stretch erred more than the months after it (seattle-temps'
October), and the check then pulled a good forecast toward the median. The pretrained recipe checks them on either
slice (``true``): where its frozen read-out extrapolated a date into a later period (ten tickers' prices, driving's
gas prices) the slice already showed it below the median (docs/benchmarks.md, "The location check shrinks only a
forecast the median beats"). A table too small for such a slice trains on every row, and its widths are floored at
the regression warm start's out-of-fold error (`interval_check.floor_intervals`). The pretrained recipe refits its
regression read-out to the rows trained on before the checks, so that they measure the read-out it saves, and to
every training row after them, the kept ones included (``refit_after_check``): on frozen features the read-out is
the ridge fit, and after a time split the latest rows are the ones a forecast needs most. The random recipe does
not: its read-out is trained together with its backbone, and a ridge refit undid that (docs/benchmarks.md, "Tables
nobody tuned for").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RECIPE_NAMES = ("random", "pretrained")

RECIPES: dict[str, dict[str, Any]] = {
    "random": dict(
        model_config={"ovr_negatives": 256, "ovr_reduction": "mean", "regression_gate_alpha": 1.0},
        max_steps=180,
        batch_size=64,
        learning_rate=3e-2,
        numeric_embedding_learning_rate=3e-2,
        regression_learning_rate=1e-3,
        backbone_learning_rate=3e-3,
        warmup_steps=10,
        freeze_backbone=False,
        freeze_decision_scale=False,
        regression_warm_start=1.0,
        earlier_numbers=3,
        num_token_warm_start=False,
        interval_check=0.1,
        refit_after_check=False,
        location_check="seeded",
    ),
    "pretrained": dict(
        model_config={"ovr_negatives": 2048, "regression_gate_alpha": 1.0, "number_noise_init": 1.0},
        max_steps=300,
        batch_size=8,
        learning_rate=1e-5,
        numeric_embedding_learning_rate=0.0,  # frozen with the backbone: the features are cached (`feature_cache`)
        regression_learning_rate=1e-5,
        backbone_learning_rate=1e-5,
        warmup_steps=0.1,
        freeze_backbone=True,
        freeze_decision_scale=True,
        regression_warm_start="auto",
        earlier_numbers=3,
        num_token_warm_start=1e-3,
        interval_check=0.1,
        refit_after_check=True,
        location_check=True,
    ),
}
"""The settings each recipe gives (`TrainConfig` keys; ``model_config`` entries merge under the config's own)."""


def base_kind(model: str) -> str:
    """``"random"`` for a ``random:*`` preset or a folder converted from one, else ``"pretrained"`` (a Qwen
    folder, ``.gguf`` file or hub id, or a converted folder that does not say what it was converted from)."""
    if model.startswith("random:"):
        return "random"
    config_file = Path(model) / "config.json"
    if config_file.is_file():
        try:
            converted_from = json.loads(config_file.read_text(encoding="utf-8")).get("converted_from")
        except json.JSONDecodeError:
            converted_from = None
        if isinstance(converted_from, str) and converted_from.startswith("random:"):
            return "random"
    return "pretrained"


def recipe_settings(name: str) -> dict[str, Any]:
    """A copy of recipe ``name``'s settings."""
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; the recipes are {', '.join(RECIPE_NAMES)} (or auto)")
    settings = dict(RECIPES[name])
    settings["model_config"] = dict(settings["model_config"])
    return settings


def describe_recipe(name: str, filled: list[str], model: str) -> str:
    """One line for the user: which recipe, for which base, and what it set."""
    if not filled:
        return f"recipe: {name} (base {model}); every recipe setting was given by the config"
    settings = recipe_settings(name)
    shown = []
    for key in filled:
        if key.startswith("model_config."):
            shown.append(f"{key}={settings['model_config'][key.split('.', 1)[1]]}")
        else:
            shown.append(f"{key}={settings[key]}")
    return f"recipe: {name} (base {model}); from the recipe: " + ", ".join(shown)
