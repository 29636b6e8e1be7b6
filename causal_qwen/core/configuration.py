"""`CausalQwenConfig`: Qwen2's configuration plus the causal heads' settings (docs/design.md: "Initialisation",
"Losses").

Every field below is validated in ``__post_init__``; a bad value raises ``ValueError`` naming it.
"""

from __future__ import annotations

import math

from transformers import Qwen2Config

NOISE_MODES = ("constant", "uniform", "zero")
OVR_REDUCTIONS = ("sum", "mean")
OVR_LOSS_IMPLEMENTATIONS = ("fused", "reference")
THRESHOLD_KINDS = ("scalar", "per_token")
OVR_CALIBRATIONS = ("base_agreement", "none")


def not_causal_qwen(where: str, model_type: str) -> str:
    """The one-line error for ``where`` (a quoted folder) holding a ``model_type`` model instead of a CausalQwen one;
    a plain Qwen2 model is told how to convert it."""
    hint = ""
    if model_type == "qwen2":
        hint = " (convert it first: causal_qwen.from_qwen(path), or causal-qwen convert --base PATH --out DIR)"
    return f"{where} holds a {model_type!r} model, not a CausalQwen one{hint}"


class CausalQwenConfig(Qwen2Config):
    r"""Configuration of `CausalQwenForCausalLM`: all of `Qwen2Config`, plus

    causal_size (`int`, *optional*): size ``C`` of the individual representation ``U`` (the "causal size"; not the
        threshold, which is written ``t``); ``None`` means
        ``hidden_size`` (required for the exact identity initialisation of ``W_loc``).
    num_token_id (`int`): vocabulary id of ``<NUM>``; by default the first reserved slot 151665.
    initial_scale (`float`, defaults to 10.0): ``γ0``; ``b_scale`` starts at ``softplus⁻¹(γ0)`` so that
        ``scale_U = γ0`` everywhere at initialisation.
    noise_init (`float`, defaults to 0.1): initial value of the exogenous noise scale ``b_noise``.
    noise_mode (`str`, defaults to ``"constant"``): ``"constant"`` (every component ``noise_init``),
        ``"uniform"`` (``U(0, 2·noise_init)``) or ``"zero"``.
    token_noise_init (`float`, defaults to 0.0): ``γ_S``, the scale of every token's own exogenous noise
        ``ε_S,k ~ Cauchy(0, γ_S)``, added to ``scale_S`` (0: the literal design; the calibration sets it).
    number_noise_init (`float`, *optional*): when set, numbers get their own exogenous noise
        ``η ~ Cauchy(0, γ_Y)``, ``γ_Y = softplus(w_η · loc_U + b_η)`` starting at this value (`heads.NumberNoise`),
        added to ``scale_Y``; ``None`` (default) keeps ``scale_Y = s @ |W_reg|ᵀ`` alone.
    ovr_threshold (`float`, defaults to 100.0): initial OvR decision threshold ``t`` (``P_k = P(S_k > t_k)``).
    ovr_threshold_kind (`str`, defaults to ``"scalar"``): ``"scalar"`` or ``"per_token"`` (one per vocabulary id).
    learnable_threshold (`bool`, defaults to False): thresholds are parameters instead of buffers.
    ovr_reduction (`str`, defaults to ``"sum"``): ``"sum"`` over the vocabulary per position, or
        ``"mean"`` (divided by ``V``).
    ovr_loss_implementation (`str`, defaults to ``"fused"``): the vocabulary-chunked fused head+loss, or the
        ``"reference"`` that materialises (tokens × vocabulary) tensors.
    ovr_chunk_size (`int`, defaults to 8192): vocabulary slice size of the fused loss.
    ovr_negatives (`int`, *optional*): sample this many negatives per batch during training (unbiased
        estimate of the OvR sum); ``None`` means the exact loss.
    regression_weight (`float`, defaults to 1.0): ``λ`` in ``L = L_cls + λ·L_reg``.
    regression_gate_alpha (`float`, defaults to 0.0): ``α`` in ``gate = α + (1-α)·P_<NUM>``.
    detach_regression_gate (`bool`, defaults to True): stop gradients through the gate.
    seed (`int`, defaults to 0): seed of the random draws made when converting from Qwen (``w_num``, ``W_reg``,
        a ``"uniform"`` ``b_noise``); the same base and seed give the same model.
    ovr_calibration (`str`, defaults to ``"base_agreement"``): how the conversion from Qwen sets the thresholds and
        the decision scale (`causal_qwen.conversion.calibration`): ``"base_agreement"`` fits them to the base's
        logits on a fixed calibration text; ``"none"`` keeps the literal ``initial_scale`` / ``noise_init`` / ``ovr_threshold``.
    calibration_positions (`int`, defaults to 4096): calibration text positions used by ``"base_agreement"``.
    causal_temperature (`float`, defaults to 1.0): ``τ``, causal mode's factor on the individual's spread at decision
        time only: an individual is drawn as ``u = loc_U + τ·scale_U ⊙ tan(π(ε − ½))``, so each token's score moves
        by a Cauchy of scale ``τ·(|W_cls| scale_U)_k``. Standard and traditional mode, the losses and training never
        read it. ``"base_agreement"`` sets it at conversion so that causal choices per token come closest to the
        base's softmax (`causal_qwen.conversion.causal_temperature`); 0 means no individual spread at all. At each
        position the spread is further multiplied by ``ρ(g)`` of the position's top-two logit margin ``g``
        (`decisions.spread_factor`): 1 where the base hesitates, vanishing where it is sure.
    causal_candidates (`int`, defaults to 6): ``K``, how many tokens a causal decision chooses among at each
        position: the ``K`` with the highest standard-mode scores (the population's best); 0 means every token.
    number_scale_factor (`float`, defaults to 1.0): ``f`` in ``scale_Y = f·(…)``: set by training's interval check
        (`causal_qwen.training.interval_check`) when the number intervals measured on training rows kept out of
        training were too narrow or too wide.
    earlier_numbers (`int`, defaults to 0): ``K``, how many of a row's earlier numbers the number read-out reads
        beside ``U`` where the row's number ``earlier_numbers_target`` comes next (`heads.EarlierNumbers`); 0 (the
        design's read-out) reads none. Training sets both when its warm start keeps the values
        (`causal_qwen.training.warm_start`).
    earlier_numbers_target (`int`, defaults to 0): ``k``, the ordinal (from 0) of the number the earlier numbers
        serve: the term applies where exactly ``k`` numbers of the row have been read.
    converted_from (`str`, *optional*): what the conversion read (a ``random:*`` preset, a Qwen folder, ``.gguf``
        file or hub id); training's ``recipe: auto`` reads it.
    """

    model_type = "causal_qwen"

    causal_size: int | None = None
    num_token_id: int = 151665
    initial_scale: float = 10.0
    noise_init: float = 0.1
    noise_mode: str = "constant"
    token_noise_init: float = 0.0
    number_noise_init: float | None = None
    ovr_threshold: float = 100.0
    ovr_threshold_kind: str = "scalar"
    learnable_threshold: bool = False
    ovr_reduction: str = "sum"
    ovr_loss_implementation: str = "fused"
    ovr_chunk_size: int = 8192
    ovr_negatives: int | None = None
    regression_weight: float = 1.0
    regression_gate_alpha: float = 0.0
    detach_regression_gate: bool = True
    seed: int = 0
    ovr_calibration: str = "base_agreement"
    calibration_positions: int = 4096
    causal_temperature: float = 1.0
    causal_candidates: int = 6
    number_scale_factor: float = 1.0
    earlier_numbers: int = 0
    earlier_numbers_target: int = 0
    converted_from: str | None = None

    @classmethod
    def get_config_dict(cls, pretrained_model_name_or_path, **kwargs):
        """`PretrainedConfig.get_config_dict`, behind every ``from_pretrained``; ``ValueError`` for the config of
        another kind of model. A plain Qwen2 checkpoint would otherwise load with a warning and random heads (and
        thresholds of 100): it needs the conversion, which calibrates them."""
        config_dict, kwargs = super().get_config_dict(pretrained_model_name_or_path, **kwargs)
        found = config_dict.get("model_type")
        if found is not None and found != cls.model_type:
            raise ValueError(not_causal_qwen(repr(str(pretrained_model_name_or_path)), found))
        return config_dict, kwargs

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        if self.causal_size is None:
            self.causal_size = self.hidden_size
        self._check_causal_settings()

    def _check_causal_settings(self) -> None:
        def positive(name: str) -> None:
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"CausalQwenConfig.{name} must be a finite positive number, got {value!r}")

        def one_of(name: str, allowed: tuple[str, ...]) -> None:
            if getattr(self, name) not in allowed:
                raise ValueError(f"CausalQwenConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}")

        positive("causal_size")
        positive("initial_scale")
        positive("ovr_chunk_size")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"CausalQwenConfig.seed must be a non-negative int, got {self.seed!r}")
        one_of("noise_mode", NOISE_MODES)
        one_of("ovr_reduction", OVR_REDUCTIONS)
        one_of("ovr_loss_implementation", OVR_LOSS_IMPLEMENTATIONS)
        one_of("ovr_threshold_kind", THRESHOLD_KINDS)
        one_of("ovr_calibration", OVR_CALIBRATIONS)
        positive("calibration_positions")
        if self.number_noise_init is not None:
            positive("number_noise_init")
        if not (math.isfinite(self.noise_init) and self.noise_init >= 0):
            raise ValueError(f"CausalQwenConfig.noise_init must be finite and >= 0, got {self.noise_init!r}")
        if not (math.isfinite(self.token_noise_init) and self.token_noise_init >= 0):
            raise ValueError(f"CausalQwenConfig.token_noise_init must be finite and >= 0, got {self.token_noise_init!r}")
        factor = self.number_scale_factor
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not (math.isfinite(factor) and factor > 0):
            raise ValueError(f"CausalQwenConfig.number_scale_factor must be a positive number, got {factor!r}")
        temperature = self.causal_temperature
        if isinstance(temperature, bool) or not (
            isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature >= 0
        ):
            raise ValueError(f"CausalQwenConfig.causal_temperature must be a finite number >= 0, got {temperature!r}")
        for name in ("earlier_numbers", "earlier_numbers_target"):
            count = getattr(self, name)
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise ValueError(f"CausalQwenConfig.{name} must be an int >= 0, got {count!r}")
        if self.earlier_numbers and self.earlier_numbers_target < 1:
            raise ValueError("CausalQwenConfig.earlier_numbers_target must be >= 1 when earlier_numbers is set (the "
                             f"number it serves needs numbers before it), got {self.earlier_numbers_target!r}")
        candidates = self.causal_candidates
        if isinstance(candidates, bool) or not isinstance(candidates, int) or candidates < 0:
            raise ValueError(f"CausalQwenConfig.causal_candidates must be an int >= 0, got {candidates!r}")
        if not math.isfinite(self.ovr_threshold):
            raise ValueError(f"CausalQwenConfig.ovr_threshold must be finite, got {self.ovr_threshold!r}")
        if not (math.isfinite(self.regression_weight) and self.regression_weight >= 0):
            raise ValueError(f"CausalQwenConfig.regression_weight must be >= 0, got {self.regression_weight!r}")
        if not 0.0 <= self.regression_gate_alpha <= 1.0:
            raise ValueError(
                f"CausalQwenConfig.regression_gate_alpha must lie in [0, 1], got {self.regression_gate_alpha!r}"
            )
        if not 0 <= self.num_token_id < self.vocab_size:
            raise ValueError(
                f"CausalQwenConfig.num_token_id={self.num_token_id} lies outside the vocabulary of {self.vocab_size} rows"
            )
        if self.ovr_negatives is not None and not (isinstance(self.ovr_negatives, int) and self.ovr_negatives > 0):
            raise ValueError(f"CausalQwenConfig.ovr_negatives must be a positive int or None, got {self.ovr_negatives!r}")


# Saved configs name this class in ``auto_map`` and carry this module's source, so that AutoConfig loads them
# with ``trust_remote_code=True`` in a Python that never imported ``causal_qwen``.
CausalQwenConfig.register_for_auto_class()
if __name__ == "causal_qwen.core.configuration":  # the package itself, not the copy saved beside a model
    from transformers import AutoConfig

    AutoConfig.register(CausalQwenConfig.model_type, CausalQwenConfig, exist_ok=True)
