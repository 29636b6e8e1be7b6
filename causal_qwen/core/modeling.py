"""`CausalQwenForCausalLM`: Qwen2's backbone with numeric embedding, abduction and action heads.

Shape legend: B batch, S sequence, H hidden size, C causal size, V vocabulary rows, N positions with a target.

    e       = embed_tokens(input_ids) + phi(numeric_values)                                  (B,S,H)
    z       = Qwen2Model(inputs_embeds=e).last_hidden_state                                   (B,S,H)
    U       ~ Cauchy(loc_U, scale_U) = abduction(z)                                           (B,S,C)
    S_k     ~ Cauchy(loc_S, scale_S),  Y ~ Cauchy(loc_Y, scale_Y)                              (B,S,V), (B,S)

The backbone keeps Qwen's attribute names (``model.*``), so Qwen checkpoints load without renaming.
docs/design.md describes the data flow, the initialisation and the losses.

Saved folders carry ``auto_map`` and a copy of this folder's modules (`register_for_auto_class`, the custom
model mechanism of transformers), so ``AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)``
loads them in a Python that never imported ``causal_qwen``.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch
from torch import Tensor
from torch.nn import functional as F
from transformers import GenerationMixin, Qwen2Model
from transformers.cache_utils import Cache
from transformers.modeling_outputs import ModelOutput
from transformers.utils import can_return_tuple
from transformers.models.qwen2.modeling_qwen2 import Qwen2PreTrainedModel

from .cauchy import ovr_probability
from .decisions import decision_scores, individual_number
from .files import save_through_staging
from .losses import gated_regression_loss, shift_targets
from .configuration import CausalQwenConfig
from .heads import AbductionNetwork, ActionNetwork, EarlierNumbers, NumberNoise, NumericEmbedding, OvrThresholds

logger = logging.getLogger(__name__)

SOFTMAX_SAMPLING = ("temperature", "top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff")
"""`generate` options that shape the softmax's sampling: traditional mode's alone."""


@dataclass
class CausalQwenOutput(ModelOutput):
    """Everything one forward pass decides.

    loss: () ``cls_loss + λ·reg_loss`` when ``labels`` are given; cls_loss, reg_loss: () its parts.
    num_targets: () number of ``<NUM>`` targets the regression term averaged over.
    logits: (B,S',V) equal to ``loc_S`` (HF convention); S' = S or the kept positions. With ``decision="standard"``
    or ``"causal"``: the mode's decision scores (`decisions.decision_scores`), ``loc_S``/``scale_S`` not formed.
    loc_S, scale_S: (B,S',V) OvR decision scores; loc_Y, scale_Y: (B,S') number regression.
    individual_Y: (B,S') with an individual (causal decision): the number it writes (`decisions.individual_number`).
    loc_U, scale_U: (B,S',C) individual representation; features: (B,S',H) the backbone's last hidden state ``z``.
    cache: the backbone's KV cache. hidden_states, attentions: the backbone's, as Qwen returns them, with
    ``output_hidden_states=True`` / ``output_attentions=True`` (the embeddings and every layer's (B,S,H) output;
    every layer's (B,heads,S,S) attention weights, which need ``attn_implementation="eager"``).
    ``forward(..., return_dict=False)`` (or ``config.return_dict = False``) returns these fields as a tuple in this
    order, the ones that are None left out (``ModelOutput.to_tuple``): the loss first when there are labels, else
    the logits.
    """

    loss: Tensor | None = None
    cls_loss: Tensor | None = None
    reg_loss: Tensor | None = None
    num_targets: Tensor | None = None
    logits: Tensor | None = None
    loc_S: Tensor | None = None
    scale_S: Tensor | None = None
    loc_Y: Tensor | None = None
    scale_Y: Tensor | None = None
    loc_U: Tensor | None = None
    scale_U: Tensor | None = None
    individual_Y: Tensor | None = None
    features: Tensor | None = None
    cache: Cache | None = None
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None

    def to_tuple(self) -> tuple:
        """The fields that are not None in their declared order (loss first, then the logits, ...), whatever order
        the forward pass filled them in: ``output[0]`` and ``return_dict=False`` read this."""
        return tuple(value for value in (getattr(self, field.name) for field in fields(self)) if value is not None)


class CausalQwenPreTrainedModel(Qwen2PreTrainedModel):
    config_class = CausalQwenConfig
    config: CausalQwenConfig

    def _init_weights(self, module: torch.nn.Module) -> None:
        """Qwen's init for the backbone; the table of docs/design.md ("Initialisation") for the causal modules
        (the classification head gets Qwen's normal init here and ``lm_head``'s values in ``from_qwen``)."""
        config = self.config
        if isinstance(module, NumericEmbedding):
            module.reset_parameters()
        elif isinstance(module, AbductionNetwork):
            module.reset_parameters(config.initial_scale)
        elif isinstance(module, ActionNetwork):
            module.reset_parameters(config.noise_init, config.noise_mode, token_noise_init=config.token_noise_init)
        elif isinstance(module, NumberNoise):
            module.reset_parameters(config.number_noise_init)
        elif isinstance(module, EarlierNumbers):
            module.reset_parameters()
        elif isinstance(module, OvrThresholds):
            module.reset_parameters(config.ovr_threshold)
        elif isinstance(module, torch.nn.Linear) and module.out_features == config.vocab_size:
            super()._init_weights(module)
        elif not _belongs_to_causal_modules(self, module):
            super()._init_weights(module)


def _belongs_to_causal_modules(model: torch.nn.Module, module: torch.nn.Module) -> bool:
    for owner in (getattr(model, "abduction", None), getattr(model, "action", None)):
        if owner is not None and any(module is child for child in owner.modules()):
            return True
    return False


class CausalQwenForCausalLM(CausalQwenPreTrainedModel, GenerationMixin):
    """Qwen2 backbone (``self.model``) + numeric embedding + abduction + action + OvR thresholds.

    Precision: the parts named in `FLOAT32_PARTS` stay float32 whatever the model's dtype (``from_pretrained(...,
    dtype=torch.float16)``, ``model.to(torch.bfloat16)``, ``model.half()``): after the calibration at conversion
    ``scale_U`` ≈ softplus(b_scale) and ``|b_noise|`` are ~1e-9 on real weights, below float16's smallest subnormal
    (6e-8), and the thresholds sit within a few hundredths of the logits, finer than bfloat16 resolves. The heads
    compute ``scale_U`` and every scale from them in float32 (`heads.AbductionNetwork`, `cauchy.linear_transform`).
    """

    _tied_weights_keys = None
    # The loss is a mean over this batch's target positions: it takes no ``num_items_in_batch``, so transformers'
    # Trainer must divide it by the gradient-accumulation steps itself (its default for such models).
    accepts_loss_kwargs = False
    FLOAT32_PARTS = (
        "abduction.scale_net", "action.b_noise", "action.token_noise", "action.number_noise", "ovr_thresholds",
        "action.earlier_numbers",
    )
    _keep_in_fp32_modules_strict = list(FLOAT32_PARTS)  # from_pretrained(dtype=float16 or bfloat16) keeps them float32

    def __init__(self, config: CausalQwenConfig) -> None:
        super().__init__(config)
        self.model = Qwen2Model(config)
        self.numeric_embedding = NumericEmbedding(config.hidden_size)
        self.abduction = AbductionNetwork(config.hidden_size, config.causal_size)
        self.action = ActionNetwork(
            config.causal_size, config.vocab_size, number_noise=config.number_noise_init is not None,
            earlier_numbers=(config.earlier_numbers, config.earlier_numbers_target) if config.earlier_numbers else None,
        )
        self.ovr_thresholds = OvrThresholds(
            config.vocab_size,
            per_token=config.ovr_threshold_kind == "per_token",
            learnable=config.learnable_threshold,
        )
        self.post_init()

    # ---- Hugging Face plumbing -------------------------------------------------------------------------
    def _apply(self, fn, recurse: bool = True):
        """`torch.nn.Module._apply`, behind ``.to()``, ``.half()``, ``.bfloat16()``, ``.cuda()``: the tensors of
        `FLOAT32_PARTS` (parameters, their gradients, buffers) move with the model but are never cast to a 16-bit
        float; one that comes in as a 16-bit float is made float32."""
        kept: set[int] = set()
        for name, tensor in [*self.named_parameters(), *self.named_buffers()]:
            if any(name == part or name.startswith(part + ".") for part in self.FLOAT32_PARTS):
                kept.add(id(tensor))
                if tensor.grad is not None:
                    kept.add(id(tensor.grad))

        def keep_float32(tensor: Tensor) -> Tensor:
            moved = fn(tensor)
            if id(tensor) in kept and moved.dtype in (torch.float16, torch.bfloat16):
                return tensor.to(device=moved.device, dtype=torch.float32)
            return moved

        return super()._apply(keep_float32, recurse)

    def save_pretrained(self, save_directory, *args, push_to_hub: bool = False, **kwargs):
        """transformers' ``save_pretrained``, written into a staging folder beside ``save_directory`` and moved in
        file by file (`files.save_through_staging`): a save killed half-way leaves every file whole, the earlier
        save's or this one's. ``push_to_hub=True`` goes through transformers' own writes, which the upload reads
        from the folder itself. The config names `text_pipeline.CausalTextGenerationPipeline` in
        ``custom_pipelines`` and the folder carries its code, so ``pipeline("text-generation", model=folder,
        trust_remote_code=True)`` reads the prompt's numbers as values."""
        save = super().save_pretrained
        if push_to_hub or not kwargs.get("is_main_process", True):
            return save(save_directory, *args, push_to_hub=push_to_hub, **kwargs)
        # The folder carries text_pipeline.py because this module imports it (transformers copies a custom model's
        # relative imports, lazy ones too); the config names the class.
        from .text_pipeline import CUSTOM_PIPELINES  # lazy: transformers' pipelines load slowly

        def save_with_pipeline(staging) -> None:
            self.config.custom_pipelines = CUSTOM_PIPELINES
            save(staging, *args, **kwargs)

        return save_through_staging(save_directory, save_with_pipeline)

    def get_input_embeddings(self) -> torch.nn.Embedding:
        return self.model.embed_tokens

    def set_input_embeddings(self, value: torch.nn.Embedding) -> None:
        self.model.embed_tokens = value

    def get_output_embeddings(self) -> torch.nn.Linear:
        return self.action.classification_head

    def set_output_embeddings(self, new_embeddings: torch.nn.Linear) -> None:
        """Install a new classification head ``W_cls, b_cls`` (V',C); per-token thresholds follow its row count
        (`OvrThresholds.resize`: kept rows keep their values, new rows get the mean of the old ones)."""
        if not isinstance(new_embeddings, torch.nn.Linear):
            raise TypeError(f"the output embeddings must be a torch.nn.Linear, got {type(new_embeddings).__name__}")
        if new_embeddings.in_features != self.config.causal_size:
            raise ValueError(
                f"the output embeddings take {new_embeddings.in_features} inputs, expected the causal size "
                f"{self.config.causal_size}"
            )
        self.action.classification_head = new_embeddings
        self.ovr_thresholds.resize(new_embeddings.out_features)

    def resize_token_embeddings(
        self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None, mean_resizing: bool = True
    ) -> torch.nn.Embedding:
        """`PreTrainedModel.resize_token_embeddings` for the embedding, the classification head (rows added at
        the end, or removed from the end) and the per-token thresholds; ``<NUM>`` keeps its id, which must stay
        inside the new vocabulary."""
        if new_num_tokens is not None:
            if isinstance(new_num_tokens, bool) or not isinstance(new_num_tokens, int) or new_num_tokens < 1:
                raise ValueError(f"new_num_tokens must be a positive int, got {new_num_tokens!r}")
            if new_num_tokens <= self.config.num_token_id:
                raise ValueError(
                    f"new_num_tokens={new_num_tokens} would drop <NUM> (id {self.config.num_token_id}): "
                    f"keep at least {self.config.num_token_id + 1} rows"
                )
        embeddings = super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        self.model.vocab_size = self.config.vocab_size
        return embeddings

    # ---- forward -------------------------------------------------------------------------------------------
    def embed(self, input_ids: Tensor, numeric_values: Tensor | None) -> Tensor:
        """``e = embed_tokens(ids) + phi(v)``: (B,S) → (B,S,H). ``phi(0) = 0`` keeps text positions exact."""
        token_embeddings = self.model.embed_tokens(input_ids)  # (B,S,H)
        if numeric_values is None:
            return token_embeddings
        return token_embeddings + self.numeric_embedding(numeric_values).to(token_embeddings.dtype)

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        numeric_values: Tensor | None = None,
        attention_mask: Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | Tensor = 0,
        return_scores: bool | None = None,
        decision: str | None = None,
        individual: Tensor | None = None,
        causal_temperature: float = 1.0,
        backbone_features: Tensor | None = None,
        earlier_term: Tensor | None = None,
        **kwargs,
    ) -> CausalQwenOutput:
        """Run the backbone and the causal heads.

        ``numeric_values`` (B,S) holds each ``<NUM>``'s value and 0 elsewhere (None: all 0, i.e. no numbers:
        ``phi(0) = 0``). ``inputs_embeds`` (B,S,H), instead of ``input_ids``: ``e`` itself, numbers included
        (`embed`); ``numeric_values`` then only give the labels' number targets.
        ``labels`` (B,S), unshifted, ``-100`` ignored: the loss of docs/design.md ("Losses") is returned with its
        parts. Without ``numeric_values`` the labels must not hold a ``<NUM>`` target (its value would be unknown).
        ``logits_to_keep``: as in Qwen, evaluate the heads on the last k positions only (0 = all).
        ``return_scores``: build the (B,S,V) ``loc_S``/``scale_S``; by default yes, except when ``labels`` are
        given and the fused loss is used (training never needs them).
        ``decision``: the logits to return at the kept positions, computing only what they read: ``"traditional"``
        ``loc_S`` alone, ``"standard"`` the OvR decision scores, ``"causal"`` the decision scores of the individual
        ``u = loc_U + τ·scale_U ⊙ c`` with ``individual`` c (B,C) or (B,S',C), its standard-Cauchy coordinates, and
        ``causal_temperature`` τ (`decisions.decision_scores`; the number it writes in ``individual_Y``); None: ``loc_S`` and
        ``scale_S`` (the default).
        ``backbone_features`` (B,S,H): the backbone's ``last_hidden_state`` for these ``input_ids``, computed before
        (training's feature cache, valid while the embedding and the backbone are frozen): the heads read it and the
        backbone does not run.
        ``earlier_term`` (B,S,2): what the earlier numbers add to ``loc_Y`` and multiply ``scale_Y`` by at these
        positions, for a model with them (`CausalQwenConfig.earlier_numbers`; `earlier_numbers_term`); None: read
        from ``input_ids`` and ``numeric_values``, which then must hold the whole rows (no KV cache of earlier
        positions: `generate` passes it, from the whole sequence).
        ``output_hidden_states``, ``output_attentions``: as for Qwen, the backbone's (`CausalQwenOutput`);
        ``return_dict=False``: the output as a tuple (`CausalQwenOutput`).
        """
        if decision not in (None, "traditional", "standard", "causal"):
            raise ValueError(f"decision must be None, 'traditional', 'standard' or 'causal', got {decision!r}")
        if (decision == "causal") != (individual is not None):
            raise ValueError("decision='causal' needs an individual, and an individual needs decision='causal'")
        kwargs.pop("numeric_strings", None)  # the tokenizer's surface strings of the numbers: text only
        cache = _one_cache(cache, kwargs.pop("past_key_values", None))
        if earlier_term is None and self.action.earlier_numbers is not None:
            earlier_term = self._earlier_term_of_rows(input_ids, numeric_values, cache)  # (B,S,2)
        elif earlier_term is not None:
            self._check_earlier_term(earlier_term, input_ids if input_ids is not None else inputs_embeds)
        if backbone_features is not None:  # training's feature cache: embedding and backbone ran before
            features, output = self._cached_features(backbone_features, input_ids), CausalQwenOutput()
            if labels is not None:
                numeric_values = self._regression_values(labels, numeric_values, features)
        else:
            features, output, numeric_values = self._backbone(
                input_ids, numeric_values, attention_mask, position_ids, cache, inputs_embeds, labels, use_cache,
                **kwargs,
            )
        kept = _keep_positions(logits_to_keep)
        if labels is not None:
            loc_U, scale_U = self.abduction(features)  # (B,S,C) each: the loss reads every position
            self._add_loss(output, loc_U, scale_U, labels, numeric_values, attention_mask, earlier_term)
            features, loc_U, scale_U = features[:, kept], loc_U[:, kept], scale_U[:, kept]
        else:
            features = features[:, kept]  # (B,S',H)
            loc_U, scale_U = self.abduction(features)  # (B,S',C) each, on the kept positions only

        if return_scores is None:
            return_scores = labels is None or self.config.ovr_loss_implementation == "reference"
        output.features, output.loc_U, output.scale_U = features, loc_U, scale_U
        output.loc_Y, output.scale_Y = self.action.regress(  # (B,S') each
            loc_U, scale_U, self.config.number_scale_factor, None if earlier_term is None else earlier_term[:, kept]
        )
        if not return_scores:
            return output
        if decision in ("standard", "causal"):
            output.logits, _ = decision_scores(self, loc_U, scale_U, individual, causal_temperature)  # (B,S',V)
            if individual is not None:
                output.individual_Y = individual_number(  # (B,S')
                    self.action, output.loc_Y, output.scale_Y, scale_U, individual
                )
        elif decision == "traditional":
            head = self.action.classification_head
            output.loc_S = output.logits = F.linear(loc_U, head.weight, head.bias)  # (B,S',V)
        else:
            output.loc_S, output.scale_S = self.action.classify(loc_U, scale_U)  # (B,S',V) each
            output.logits = output.loc_S
        return output

    def _backbone(self, input_ids, numeric_values, attention_mask, position_ids, cache, inputs_embeds, labels,
                  use_cache, **kwargs) -> tuple[Tensor, CausalQwenOutput, Tensor | None]:
        """Embed (``e = embed(x) + φ(v)``) and run the backbone: ``(z (B,S,H), output with its cache (and hidden states
        and attentions when ``kwargs`` ask for them), the values the regression targets read)``."""
        if inputs_embeds is None:
            if input_ids is None:
                raise ValueError("forward needs input_ids or inputs_embeds")
            numeric_values = self._checked_numeric_values(input_ids, numeric_values)
            inputs_embeds = self.embed(input_ids, numeric_values)
        elif input_ids is not None:
            raise ValueError("give input_ids or inputs_embeds, not both")
        elif numeric_values is not None and labels is None:  # they would change nothing
            raise ValueError("numeric_values enter through the embedding, which inputs_embeds replace: give input_ids "
                             "with numeric_values, or inputs_embeds=model.embed(input_ids, numeric_values) alone (with "
                             "labels, numeric_values are the numbers' targets)")
        if labels is not None:
            numeric_values = self._regression_values(labels, numeric_values, inputs_embeds)
        if attention_mask is not None:
            # With a KV cache the mask covers the cached positions too (as Hugging Face's generate passes it).
            past = cache.get_seq_length() if cache is not None else 0
            expected = (inputs_embeds.shape[0], past + inputs_embeds.shape[1])
            two_dimensional = isinstance(attention_mask, Tensor) and attention_mask.dim() == 2  # a static cache: a dict
            if two_dimensional and tuple(attention_mask.shape) != expected:
                raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)}, expected {expected}")
        backbone_out = self.model(
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=use_cache,
            **kwargs,
        )
        output = CausalQwenOutput(
            cache=backbone_out.cache, hidden_states=backbone_out.hidden_states, attentions=backbone_out.attentions
        )
        return backbone_out.last_hidden_state, output, numeric_values

    def set_earlier_numbers(self, count: int, target: int = 0, row_breaks: Sequence[int] = ()) -> None:
        """Read the values of each row's last ``count`` numbers where its number ``target`` (from 0) comes next
        (`heads.EarlierNumbers`, with ``w_e = 0`` until a fit sets it), or none (``count = 0``, the design's
        read-out); the config says so, and saved folders load with it. ``row_breaks``: the token ids after which
        a new row starts (none: a text is one row)."""
        self.config.earlier_numbers, self.config.earlier_numbers_target = count, target if count else 0
        self.config._check_causal_settings()
        if count:
            device = self.action.regression_head.weight.device
            self.action.earlier_numbers = EarlierNumbers(count, target, self.config.vocab_size).to(device)
            self.action.earlier_numbers.mark_row_breaks(row_breaks)
        else:
            self.action.earlier_numbers = None

    def earlier_numbers_term(self, input_ids: Tensor, numeric_values: Tensor | None) -> Tensor | None:
        """What the earlier numbers add to ``loc_Y`` and multiply ``scale_Y`` by, (B,S,2) float32, at every position
        of whole rows ``input_ids``, ``numeric_values`` (B,S) (`heads.EarlierNumbers`); None for a model without
        them."""
        earlier = self.action.earlier_numbers
        if earlier is None:
            return None
        return earlier(input_ids, numeric_values, self.config.num_token_id)

    def _earlier_term_of_rows(self, input_ids: Tensor | None, numeric_values: Tensor | None,
                              cache: Cache | None) -> Tensor:
        """`earlier_numbers_term` of this call's rows; ``ValueError`` where they are not whole rows."""
        if input_ids is None:
            raise ValueError("this model's number read-out reads the earlier numbers of each row (config."
                             "earlier_numbers): give input_ids with numeric_values, or earlier_term="
                             "model.earlier_numbers_term(input_ids, numeric_values) beside inputs_embeds")
        if cache is not None and cache.get_seq_length() > 0:
            raise ValueError("this model's number read-out reads the earlier numbers of each row (config."
                             "earlier_numbers), which a KV cache hides: pass earlier_term=model.earlier_numbers_term("
                             "whole_ids, whole_values)[:, -step:] (model.generate does)")
        return self.earlier_numbers_term(input_ids, numeric_values)

    def _check_earlier_term(self, earlier_term: Tensor, inputs: Tensor | None) -> None:
        """``ValueError`` unless this model reads earlier numbers and ``earlier_term`` is (B,S,2), (B,S) like
        ``inputs``."""
        if self.action.earlier_numbers is None:
            raise ValueError("earlier_term was given, but this model reads no earlier numbers (config.earlier_numbers "
                             "is 0)")
        expected = (*inputs.shape[:2], 2) if inputs is not None else None
        if not isinstance(earlier_term, Tensor) or earlier_term.dim() != 3 or earlier_term.shape[-1] != 2 or (
                expected is not None and tuple(earlier_term.shape) != expected):
            found = tuple(earlier_term.shape) if isinstance(earlier_term, Tensor) else type(earlier_term).__name__
            raise ValueError(f"earlier_term has shape {found}, expected {expected or '(B,S,2)'} (a shift of loc_Y "
                             "and a factor of scale_Y a position: model.earlier_numbers_term)")

    def _cached_features(self, backbone_features: Tensor, input_ids: Tensor | None) -> Tensor:
        """``z`` (B,S,H) given as ``backbone_features``, checked against ``input_ids`` and the hidden size."""
        expected_width = self.config.hidden_size
        if backbone_features.dim() != 3 or backbone_features.shape[-1] != expected_width:
            raise ValueError(f"backbone_features has shape {tuple(backbone_features.shape)}, expected (B,S,{expected_width})")
        if input_ids is not None and tuple(backbone_features.shape[:2]) != tuple(input_ids.shape):
            raise ValueError(f"backbone_features has shape {tuple(backbone_features.shape)} but input_ids has "
                             f"{tuple(input_ids.shape)}")
        return backbone_features.to(self.abduction.loc_net.weight.dtype)

    def _checked_numeric_values(self, input_ids: Tensor, numeric_values: Tensor | None) -> Tensor | None:
        if numeric_values is None:
            if bool((input_ids == self.config.num_token_id).any()):
                warnings.warn("input_ids hold <NUM> tokens but no numeric_values were given: every number is read "
                              "as 0; pass the tokenizer's numeric_values with input_ids (model(**tokenizer(text, "
                              "return_tensors='pt')))", UserWarning, stacklevel=3)
            return None
        if not isinstance(numeric_values, Tensor):
            raise TypeError(f"numeric_values must be a torch.Tensor, got {type(numeric_values).__name__}")
        if numeric_values.shape != input_ids.shape:
            raise ValueError(
                f"numeric_values has shape {tuple(numeric_values.shape)} but input_ids has {tuple(input_ids.shape)}"
            )
        if not numeric_values.is_floating_point():
            numeric_values = numeric_values.float()
        if not torch.isfinite(numeric_values).all():
            raise ValueError("numeric_values holds a non-finite value (inf or NaN)")
        stray = (numeric_values != 0) & (input_ids != self.config.num_token_id)
        if stray.any():
            where = tuple(stray.nonzero()[0].tolist())
            raise ValueError(
                f"numeric_values is non-zero at position {where}, which is not a <NUM> token "
                f"(id {self.config.num_token_id})"
            )
        return numeric_values

    def _regression_values(self, labels: Tensor, numeric_values: Tensor | None, inputs_embeds: Tensor) -> Tensor:
        """The values the regression targets read (B,S): ``numeric_values``, or zeros when there are no numbers.

        Raises ``TypeError`` for labels that are not an integer tensor and ``ValueError`` when they hold a
        ``<NUM>`` target while ``numeric_values`` is None."""
        integer = isinstance(labels, Tensor) and not (labels.is_floating_point() or labels.is_complex())
        if not integer or labels.dtype == torch.bool:
            found = labels.dtype if isinstance(labels, Tensor) else type(labels).__name__
            raise TypeError(f"labels must be an integer torch.Tensor of token ids, got {found}")
        if labels.shape != inputs_embeds.shape[:2]:
            raise ValueError(f"labels has shape {tuple(labels.shape)}, expected {tuple(inputs_embeds.shape[:2])}")
        if numeric_values is not None:
            if not isinstance(numeric_values, Tensor):
                raise TypeError(f"numeric_values must be a torch.Tensor, got {type(numeric_values).__name__}")
            if numeric_values.shape != labels.shape:
                raise ValueError(
                    f"numeric_values has shape {tuple(numeric_values.shape)} but labels has {tuple(labels.shape)}"
                )
            return numeric_values
        num_id = self.config.num_token_id
        number_targets = labels[:, 1:] == num_id  # (B,S-1): the targets are labels[i+1]
        if bool(number_targets.any()):
            where = tuple(number_targets.nonzero()[0].tolist())
            raise ValueError(
                f"labels hold a <NUM> target (id {num_id}) at position {(where[0], where[1] + 1)} but numeric_values "
                "is None: pass the numbers' values (the tokenizer returns them as numeric_values)"
            )
        return torch.zeros(labels.shape, dtype=torch.float32, device=labels.device)  # (B,S) no numbers

    def _add_loss(
        self,
        output: CausalQwenOutput,
        loc_U: Tensor,
        scale_U: Tensor,
        labels: Tensor,
        numeric_values: Tensor,
        attention_mask: Tensor | None,
        earlier_term: Tensor | None = None,
    ) -> None:
        """Fill ``loss``, ``cls_loss``, ``reg_loss``, ``num_targets`` (docs/design.md, "Losses"); ``earlier_term``
        (B,S,2): the earlier numbers' term of ``loc_Y`` and ``scale_Y`` (`earlier_numbers_term`)."""
        config = self.config
        targets = shift_targets(labels, numeric_values, attention_mask)
        causal_size = loc_U.shape[-1]
        loc_U = loc_U[:, :-1].reshape(-1, causal_size)[targets.positions]  # (N,C)
        scale_U = scale_U[:, :-1].reshape(-1, causal_size)[targets.positions]  # (N,C)
        decision_scale = self.action.decision_scale(scale_U)  # (N,C)
        num_positions = max(int(targets.positions.numel()), 1)
        position_weight = 1.0 / num_positions
        if config.ovr_reduction == "mean":
            position_weight /= config.vocab_size

        cls_loss, p_num = self.classification_loss(loc_U, decision_scale, targets.token_ids, position_weight)

        if earlier_term is not None:
            earlier_term = earlier_term[:, :-1].reshape(-1, 2)[targets.positions]  # (N,2)
        loc_Y, scale_Y = self.action.regress(loc_U, scale_U, self.config.number_scale_factor, earlier_term)  # (N,) each
        is_number = targets.token_ids == config.num_token_id  # (N,)
        reg_loss = gated_regression_loss(
            loc_Y.float(),
            scale_Y.float(),
            targets.values,
            is_number,
            p_num.float(),
            alpha=config.regression_gate_alpha,
            detach_gate=config.detach_regression_gate,
        )
        output.cls_loss = cls_loss
        output.reg_loss = reg_loss
        output.num_targets = is_number.sum()
        output.loss = cls_loss + config.regression_weight * reg_loss

    def classification_loss(
        self, loc_U: Tensor, decision_scale: Tensor, target_ids: Tensor, position_weight: float
    ) -> tuple[Tensor, Tensor]:
        """``Σ_i w·Σ_k BCE_ik`` over the N target positions, and ``P_<NUM>`` per position (N,).

        loc_U, decision_scale: (N,C); target_ids: (N,)
        """
        from .fused_ovr import model_classification_loss

        head = self.action.classification_head
        threshold = self.ovr_thresholds()
        token_noise = self.action.token_noise_scale()  # () γ_S
        return model_classification_loss(
            loc_U, decision_scale, head.weight, head.bias, threshold, target_ids, position_weight=position_weight,
            num_token_id=self.config.num_token_id, chunk_size=self.config.ovr_chunk_size,
            negatives=self.config.ovr_negatives if self.training else None, token_noise=token_noise,
            implementation=self.config.ovr_loss_implementation,
        )

    def ovr_probabilities(self, loc_S: Tensor, scale_S: Tensor) -> Tensor:
        """``P_k = P(S_k > t_k)`` (t: the thresholds) for scores from this model: (...,V) → (...,V)."""
        return ovr_probability(loc_S, scale_S, self.ovr_thresholds())

    # ---- GenerationMixin.generate ----------------------------------------------------------------------------
    def generate(
        self,
        inputs: Tensor | None = None,
        generation_config=None,
        *,
        mode: str | None = None,
        individual_scope: str = "token",
        causal_temperature: float | None = None,
        individual: Tensor | None = None,
        numeric_values: Tensor | None = None,
        seed: int | None = None,
        **kwargs,
    ):
        """`GenerationMixin.generate` in one of the three modes of docs/design.md ("Decision rules"), with numbers.

        ``mode`` (or ``generation_config.mode``; default ``"traditional"``): ``"traditional"`` decodes on ``loc_S``
        (softmax, greedy or sampled, every Hugging Face option); in ``"standard"`` and ``"causal"`` mode the step's
        logits are the decision scores (`decisions.decision_scores`) and greedy search takes their argmax.
        Causal mode: ``individual_scope="token"`` draws a fresh individual ε for every position (causal sampling),
        ``"sequence"`` one for the whole text (``individual``: ε (B,C) or (C,) replays one);
        ``causal_temperature``: τ (None: ``config.causal_temperature``). ``numeric_values`` (B,P): the prompt's
        numbers. ``seed`` draws ε (row ``i`` from ``seed + i``, so a prompt's text does not depend on the other
        rows), and in traditional mode seeds torch's global generators for the sampling (their states restored
        after); without one a seed is drawn from torch's global generator.

        A generated ``<NUM>`` carries ``loc_Y`` (in causal mode the individual's, `decisions.individual_number`) into the next
        step. With ``return_dict_in_generate=True`` the output also holds ``numeric_values`` (B, P+T),
        ``numeric_scales`` (B, P+T) (``scale_Y`` of each generated ``<NUM>``, NaN elsewhere) and, in causal mode,
        ``seed`` and (sequence scope) ``individual`` (B,C). A streamer with a ``follow`` method
        (`text_generation.NumericTextStreamer`) reads each token's number and takes over the stop strings. One
        sequence per prompt: ``num_beams`` and ``num_return_sequences`` must be 1. In standard and causal mode the
        model's own ``generation_config`` (the base's sampling defaults and repetition penalty) never applies; a
        ``repetition_penalty`` given to this call does.
        """
        from .generation import MODES, DecodingState, check_seed

        kwargs.pop("numeric_strings", None)  # the tokenizer's surface strings of the prompt's numbers: text only
        configs = (generation_config, self.generation_config)  # this call's, then the model's own
        if mode is None:
            mode = _configured("mode", configs, "traditional")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        instead = {
            "num_beams": "beam search is not supported: decode greedily (num_beams=1) or sample (mode 'causal', or "
                         "do_sample=True in mode 'traditional')",
            "num_return_sequences": "for several sequences of a prompt repeat it in the batch "
                                    "(input_ids.repeat_interleave(n, dim=0), and so attention_mask and numeric_values)",
        }
        for name, hint in instead.items():
            value = kwargs.get(name, _configured(name, configs, 1))
            if value not in (None, 1):
                raise ValueError(f"{name}={value!r}: CausalQwen's generate makes one sequence per prompt; {hint}")
        if mode != "traditional":
            how = "decides by OvR argmax" if mode == "standard" else \
                "decides by its individuals: seed and causal_temperature set them"
            sampled = kwargs.get("do_sample", getattr(generation_config, "do_sample", None))
            if sampled and ("do_sample" in kwargs or generation_config is not None):
                raise ValueError(f"do_sample applies to mode 'traditional' only (mode {mode!r} {how})")
            given = [name for name in SOFTMAX_SAMPLING if kwargs.get(name) is not None]  # this call's, not a config's
            if given:
                verb = "applies" if len(given) == 1 else "apply"
                raise ValueError(f"{', '.join(given)} only {verb} to mode 'traditional', the softmax's sampling (mode "
                                 f"{mode!r} {how})")
            if generation_config is not None and "do_sample" not in kwargs:
                generation_config = copy.deepcopy(generation_config)
                generation_config.do_sample = False
            else:
                kwargs["do_sample"] = False  # also over a base's sampling defaults (model.generation_config)
            # A base's repetition penalty (Qwen's Instruct models: 1.1) would rescale the decision scores of the
            # tokens seen so far: the mode's own decision is taken unless the caller asks for a penalty.
            if generation_config is not None and getattr(generation_config, "repetition_penalty", None) is None:
                generation_config = copy.deepcopy(generation_config)
                generation_config.repetition_penalty = 1.0
            elif generation_config is None:
                kwargs.setdefault("repetition_penalty", 1.0)
        if kwargs.get("inputs_embeds") is not None:
            raise ValueError("generate reads the prompt as input_ids with its numeric_values, not as inputs_embeds")
        if "decoding" in kwargs:  # an assistant's nested generate call carries the caller's DecodingState
            raise ValueError("a CausalQwen model cannot serve as the assistant of assisted generation")
        assisted = [name for name in ("assistant_model", "prompt_lookup_num_tokens", "assistant_early_exit", "use_mtp")
                    if kwargs.get(name, _configured(name, configs)) not in (None, False)]
        if assisted:
            raise ValueError(f"{', '.join(assisted)}: assisted generation (speculative or prompt-lookup decoding) is "
                             "not supported: CausalQwen's decoding state gives every position its number and "
                             "individual one step at a time, and cannot take back rejected candidate tokens")
        input_ids = inputs if inputs is not None else kwargs.get("input_ids")
        _check_prompts(input_ids, kwargs.get("attention_mask"))
        check_seed(seed)
        state = DecodingState.start(
            self, input_ids, numeric_values, mode, individual_scope, causal_temperature, individual, seed
        )
        generation_config = state.add_criteria(generation_config, self.generation_config, kwargs)
        with _seeded_global_generators(seed if mode == "traditional" else None, input_ids.device):
            out = super().generate(inputs, generation_config, decoding=state, **kwargs)
        if isinstance(out, ModelOutput):
            state.extend_to(out.sequences)
            out["numeric_values"] = state.values
            out["numeric_scales"] = state.scales
            if mode == "causal":
                out["seed"] = state.seed
                if state.individual is not None:
                    out["individual"] = state.individual
        return out

    def prepare_inputs_for_generation(self, input_ids, decoding=None, numeric_values=None, **kwargs):
        """Slice the inputs of the next step. Inside `generate` the `generation.DecodingState` (``decoding``) adds the
        step's numbers and decision (the mode, and causal mode's individual); ``numeric_values`` passed directly
        cover the prompt (0 after)."""
        model_inputs = super().prepare_inputs_for_generation(input_ids, **kwargs)
        step_ids = model_inputs.get("input_ids")
        if step_ids is None:
            return model_inputs
        if decoding is not None:
            model_inputs.update(decoding.step_inputs(self, input_ids, step_ids.shape[1]))
        elif numeric_values is not None or self.action.earlier_numbers is not None:
            values = torch.zeros_like(input_ids, dtype=torch.float32 if numeric_values is None else numeric_values.dtype)
            if numeric_values is not None:  # (B,L): the prompt's numbers, 0 after
                width = min(numeric_values.shape[1], input_ids.shape[1])
                values[:, :width] = numeric_values[:, :width]
                model_inputs["numeric_values"] = values[:, -step_ids.shape[1] :]
            if self.action.earlier_numbers is not None:
                model_inputs["earlier_term"] = self.earlier_numbers_term(input_ids, values)[:, -step_ids.shape[1] :]
        return model_inputs

    def _update_model_kwargs_for_generation(self, outputs, model_kwargs, *args, **kwargs):
        """Hugging Face's update, and the number a ``<NUM>`` chosen at this step carries (`DecodingState.remember`)."""
        decoding = model_kwargs.get("decoding")
        if decoding is not None:
            decoding.remember(outputs)
        return super()._update_model_kwargs_for_generation(outputs, model_kwargs, *args, **kwargs)


@contextlib.contextmanager
def _seeded_global_generators(seed: int | None, device: torch.device):
    """Within it, torch's global generators are seeded with ``seed`` (the CPU one and ``device``'s are restored
    after): Hugging Face samples from them, so a seed replays the samples. No seed: nothing changes."""
    if seed is None:
        yield
        return
    accelerators = [device] if device.type not in ("cpu", "meta") else []
    with torch.random.fork_rng(devices=accelerators, device_type=device.type if accelerators else "cuda"):
        torch.manual_seed(seed % 2**64)  # into torch's range, as causal mode's row seeds (generation.row_seed)
        yield


def _configured(name: str, configs: tuple, fallback: object = None) -> object:
    """The generation option ``name`` as Hugging Face's loop reads it: from the first of ``configs`` (this call's
    ``generation_config``, then the model's own) that sets it, else ``fallback``."""
    for config in configs:
        value = getattr(config, name, None) if config is not None else None
        if value is not None:
            return value
    return fallback


def _check_prompts(input_ids: object, attention_mask: object) -> None:
    """``ValueError`` unless ``input_ids`` is (B,P) with ``B ≥ 1``, ``P ≥ 1`` and no row of ``attention_mask`` is all 0
    (a prompt of padding only)."""
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
        found = getattr(input_ids, "shape", input_ids)
        raise ValueError(f"generate needs input_ids of shape (batch, length), got {found!r}")
    if input_ids.shape[0] == 0:
        raise ValueError(f"generate needs at least one prompt, got input_ids of shape {tuple(input_ids.shape)}")
    if input_ids.shape[1] == 0:
        raise ValueError(f"generate needs input_ids of shape (batch, prompt length ≥ 1), got {tuple(input_ids.shape)}"
                         ": the prompt is empty (give it at least one token)")
    if isinstance(attention_mask, Tensor) and attention_mask.dim() == 2:
        empty = (attention_mask.sum(dim=1) == 0).nonzero().flatten().tolist()  # rows that are padding only
        if empty:
            raise ValueError(f"prompt row {empty[0]} is empty (its attention_mask is all 0): give every row at "
                             "least one token")


def _one_cache(cache: Cache | None, past_key_values: Cache | None) -> Cache | None:
    """The KV cache, given as ``cache`` (transformers v5's name) or ``past_key_values`` (the name every Hugging Face
    decoding loop writes, and the output's alias); ``ValueError`` when both are given and differ."""
    if past_key_values is None:
        return cache
    if cache is not None and cache is not past_key_values:
        raise ValueError("give the KV cache once: cache and past_key_values are two different caches")
    return past_key_values


def _keep_positions(logits_to_keep: int | Tensor) -> slice | Tensor:
    if isinstance(logits_to_keep, int):
        return slice(-logits_to_keep, None) if logits_to_keep > 0 else slice(None)
    return logits_to_keep


# Saved folders name these classes in ``auto_map`` and carry this module's source (see the module docstring).
CausalQwenForCausalLM.register_for_auto_class("AutoModelForCausalLM")
if __name__ == "causal_qwen.core.modeling":  # the package itself, not the copy saved beside a model
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.register(CausalQwenConfig, CausalQwenForCausalLM, exist_ok=True)
