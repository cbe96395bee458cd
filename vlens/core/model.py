"""`HookedVLM`: a Hugging Face vision-language model with TransformerLens hook points.

The language decoder is rebuilt from our own components around the HF parameters (moved,
not copied); the vision tower stays HF's, wrapped with hooks. Logits equal HF's.
"""

from __future__ import annotations

import copy
import importlib.util
from collections.abc import Sequence
from contextlib import contextmanager, nullcontext
from typing import Any, Literal, cast, overload

import torch
from jaxtyping import Float
from torch import Tensor

from vlens.core.answer_tokens import (
    answer_ids,
    answer_logprobs,
    append_tokens,
    first_difference,
    teacher_force,
)
from vlens.core.architectures import resolve_adapter
from vlens.core.architectures.base import ArchitectureAdapter, HFModule
from vlens.core.cache import VLMActivationCache
from vlens.core.components.attention import KVCache
from vlens.core.components.block import BlockList
from vlens.core.config import VLMConfig
from vlens.core.devices import configure_resolution, resolve_device, resolve_dtype, sync_resolution
from vlens.core.generation import GenerationOutput, generate
from vlens.core.generation_cache import NamesFilter
from vlens.core.hooks import HookedRootModule, HookPoint, check_hook_pairs, new_context_level
from vlens.core.inputs import VLMInputs
from vlens.core.loading import load_hf_model_and_processor
from vlens.core.loss import next_token_loss, next_token_targets
from vlens.core.processing import coerce_inputs, prepare_inputs
from vlens.core.runtime import RunState, build_masks, module_device
from vlens.core.splicing import SpliceMixin
from vlens.core.tl_surface import TransformerLensSurface
from vlens.core.token_labels import str_tokens
from vlens.core.weights import WeightsMixin
from vlens.utils.errors import UserInputError
from vlens.utils.provenance import note_model
from vlens.viz.attention_page import image_token_labels

# an adapter, its class, or a registered family / HF class name (None: the one registered for the model)
AdapterSpec = ArchitectureAdapter | type[ArchitectureAdapter] | str | None

ReturnType = Literal["logits", "loss", "both", "resid"] | None


class HookedVLM(WeightsMixin, TransformerLensSurface, SpliceMixin, HookedRootModule):
    """A vision-language model whose decoder exposes every TransformerLens hook.

    Build one with `HookedVLM.from_pretrained(path_or_hub_id)`, `HookedVLM.from_hf(hf_model,
    processor=processor)` or `vlens.load()` (the embedded tiny model). `model.hook_dict` lists the hook names.
    TransformerLens's tools work on it (README, "Coming from TransformerLens"); the weight views
    and TransformerLens methods live in `vlens.core.weights` and `vlens.core.tl_surface`.

    Attributes:
        cfg: `VLMConfig` (TransformerLens field names).
        embed, vision, rotary, blocks, ln_final, unembed: the model's parts. `ln_final` only
            normalizes; `unembed` applies the final norm's HF weight, then lm_head.
        hf_model: the HF model (shares every parameter with this one).
        processor: the HF processor, if known (needed by `prepare` and `generate` texts).
    """

    hf_model: HFModule  # a plain attribute (set in __init__), not a submodule

    def __init__(self, hf_model: HFModule, processor: Any = None, adapter: AdapterSpec = None):
        super().__init__()
        self.adapter = resolve_adapter(adapter, hf_model)
        self.cfg: VLMConfig = self.adapter.build_config(hf_model)
        parts = self.adapter.build_decoder(hf_model, self.cfg)
        self.embed = parts.embed
        self.hook_embed = HookPoint()  # [batch, pos, d_model]
        self.vision = self.adapter.build_vision(hf_model)
        self.hook_inputs_embeds = HookPoint()  # [batch, pos, d_model]
        self.rotary = parts.rotary
        self.blocks = BlockList(parts.blocks)
        self.ln_final = parts.ln_final
        self.unembed = parts.unembed
        # a plain attribute, not a submodule: its parameters are already ours
        self.__dict__["hf_model"] = hf_model
        self.processor = processor
        self.setup()
        self.eval()
        note_model(self)  # the provenance of what is computed with it (vlens.utils.provenance)

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_hf(cls, hf_model: HFModule, adapter: AdapterSpec = None, processor: Any = None) -> HookedVLM:
        """Wrap an already-built HF `...ForConditionalGeneration` (parameters are shared).

        adapter: the family's `ArchitectureAdapter` (an instance, a class, or a registered family
            name such as "llava"); default: the one registered for the model's class
            (`vlens.register_adapter`).
        processor: the HF processor (needed by `prepare` and for texts in `generate`).
        """
        if adapter is not None and not isinstance(adapter, (str, type, ArchitectureAdapter)):
            raise UserInputError(f"HookedVLM.from_hf(hf_model, adapter=None, processor=None): the second argument is "
                                 f"the adapter, got a {type(adapter).__name__}; pass the processor as processor=...")
        return cls(hf_model, processor=processor, adapter=adapter)

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        trust_remote_code: bool = False,
        load_processor: bool = True,
        device_map: str | dict[str, Any] | None = None,
        max_memory: dict[Any, int | str] | None = None,
        offload_folder: str | None = None,
        min_pixels: int | None = None,
        max_pixels: int | None = None,
        image_size: int | None = None,
        adapter: AdapterSpec = None,
        **hf_kwargs: Any,
    ) -> HookedVLM:
        """Load an HF checkpoint (local folder or hub id) and its processor, safetensors only.

        device / dtype: default ``cuda`` when available, else ``cpu``; bf16 on a GPU, fp32 on the
        CPU (`vlens.core.devices`); dtype may be a name ("bfloat16"). min_pixels / max_pixels /
        image_size: the processor's image resolution (`vlens.core.devices.configure_resolution`).

        A checkpoint missing some of the model's tensors raises `vlens.core.loading.MissingWeightsError`
        (HF would fill them with random values); pass ``allow_missing=True`` to accept that.

        device_map: place one model across devices with HF/accelerate ("auto", "balanced",
            "sequential", or {module name: device | "cpu" | "disk"}); each block runs where it
            was placed and the residual stream moves between blocks. Entries "cpu" (next to GPU
            entries) and "disk" are offloaded: accelerate streams their weights to the execution
            device on each call. Needs `accelerate` (extra `distributed`). Not with `device`.
        max_memory: per-device budget for "auto" maps, e.g. {0: "70GiB", 1: "70GiB", "cpu": "200GiB"}.
        offload_folder: where "disk" entries are kept when the checkpoint cannot be read in place.
        adapter: the family's adapter (instance, class or registered family name) instead of the one
            registered for the checkpoint's `architectures`.
        """
        if device_map is None:
            device = resolve_device(device)
        dtype = resolve_dtype(dtype, device if device_map is None else None)
        if device_map is not None and device is not None:
            raise UserInputError("give either device (one device) or device_map (a placement across devices), not both")
        if device_map is not None and importlib.util.find_spec("accelerate") is None:
            raise ImportError("device_map places the model with accelerate, which is not installed: "
                              "pip install 'vlens[distributed]'")
        for name, value in (("device_map", device_map), ("max_memory", max_memory), ("offload_folder", offload_folder)):
            if value is not None:
                hf_kwargs[name] = value
        hf_model, processor = load_hf_model_and_processor(
            name_or_path, dtype=dtype, trust_remote_code=trust_remote_code,
            load_processor=load_processor, adapter=adapter, **hf_kwargs,
        )
        if processor is not None and (min_pixels, max_pixels, image_size) != (None, None, None):
            configure_resolution(processor, min_pixels, max_pixels, image_size)
            sync_resolution(hf_model, processor)  # anyres models read the tiling resolutions too
        model = cls(hf_model, processor=processor, adapter=adapter)
        if device is not None:
            model.to(device)
        return model

    @property
    def device_map(self) -> dict[str, Any] | None:
        """HF's placement of the model's modules when loaded with a device_map (else None)."""
        return getattr(self.hf_model, "hf_device_map", None)

    @property
    def input_device(self) -> torch.device:
        """Where inputs go: the token embedding's device (where each forward starts)."""
        return module_device(self.embed)

    def to(self, *args, **kwargs) -> HookedVLM:  # keep cfg.device/dtype truthful
        placement = self.device_map
        if placement is not None:  # accelerate's hooks keep each module's execution device: moving breaks them
            raise UserInputError(f"this model was placed across devices by device_map "
                             f"({sorted(set(map(str, placement.values())))}); it cannot be moved as a whole. "
                             "Load it again with device=... instead of device_map.")
        super().to(*args, **kwargs)
        weight = self.unembed.lm_head.weight
        self.cfg.device, self.cfg.dtype = str(weight.device), weight.dtype
        return self

    # ------------------------------------------------------------------ inputs
    @property
    def processor(self) -> Any:
        """The HF processor (None: none known); setting it also tells the adapter (`bind_processor`)."""
        return self.__dict__.get("_processor")

    @processor.setter
    def processor(self, processor: Any) -> None:
        self.__dict__["_processor"] = processor
        self.adapter.bind_processor(processor)

    @property
    def tokenizer(self):
        if self.processor is None:
            raise UserInputError("This model has no processor: pass one to HookedVLM.from_hf(hf_model, processor=processor).")
        return getattr(self.processor, "tokenizer", self.processor)

    def prepare(
        self,
        images: Any = None,
        prompts: str | Sequence[str] = (),
        chat: bool = True,
        allow_urls: bool = False,
        answers: str | Sequence[str | Sequence[int]] | None = None,
        videos: Any = None,
        fps: float = 2.0,
    ) -> VLMInputs:
        """Processor + chat format -> `VLMInputs` (left-padded batch, with token regions).

        images: one image per prompt, a list of images per prompt, or None for text only. An
            image is a PIL image (16-bit, float, palette and alpha modes are scaled / composited
            to 8-bit RGB, see `vlens.utils.images`), a local file path, or a numpy array / tensor.
        allow_urls: fetch "http(s)://" images (refused by default: nothing is downloaded unasked).
        answers: an answer prefix to teacher-force after each prompt (one text, or one per prompt;
            token-id lists are taken as they are): its tokens are those it gets continuing the
            generation prompt (`vlens.core.answers`, rule 1), appended after the prompt, so the
            last position (``regions.final``) predicts the token after the prefix. E.g.
            ``answers=["1"]`` and reading "2" vs "3" there contrasts "12" with "13" on a tokenizer
            that splits digits. `answer_logit_diff` does this for whole answers.
        videos: one entry per prompt: a video (a list of frames as PIL images / paths / [H, W, 3] arrays,
            or an array [frames, H, W, 3]), a list of videos, or None (families that take video:
            docs/video.md). Each video is one entry of ``regions.images`` (after the prompt's images);
            ``regions.frames`` holds each frame's (temporal patch's) token positions.
        fps: the frame rate the given frames were sampled at (their times; Qwen's time positions).
        """
        inputs = prepare_inputs(self, images=images, prompts=prompts, chat=chat, allow_urls=allow_urls,
                                videos=videos, fps=fps)
        if answers is None:
            return inputs
        rows = [answers] * inputs.batch_size if isinstance(answers, str) else list(answers)
        if len(rows) != inputs.batch_size:
            raise UserInputError(f"prepare: {len(rows)} answers for {inputs.batch_size} prompts; pass one answer "
                                 "prefix per prompt (or one string for all).")
        ids = [answer_ids(self, a, example=f"prompt {i}", chat=chat) if isinstance(a, str) else [int(t) for t in a]
               for i, a in enumerate(rows)]
        return append_tokens(self, inputs, ids)

    def answer_logit_diff(self, inputs: VLMInputs, correct: str | Sequence[str], incorrect: str | Sequence[str],
                          mode: Literal["logprob", "first_token"] = "logprob",
                          fwd_hooks: Sequence = (), chat: bool = True) -> Float[Tensor, "batch"]:
        """How much more the model favours `correct` than `incorrect` as the answer, per row [batch].

        Answers may be several tokens ("12" is "1", "2" for Qwen); each is tokenised as it continues
        the generation prompt (`vlens.core.answers`, rule 1; one string for every row or one per row).

        mode: "logprob" (default): ``log P(correct) - log P(incorrect)``, each the teacher-forced sum
            ``sum_j log p(a_j | prompt, a_<j)`` (two forwards, one per answer; rule 3). For
            one-token answers it equals the logit difference exactly.
            "first_token": the logit difference at the first token where the answers differ, their
            shared prefix teacher-forced (one forward; rule 2, what vlens's patching metrics read):
            "12" vs "13" -> logit["2"] - logit["3"] after forcing "1".
        fwd_hooks: TransformerLens (name, fn) pairs active during the forwards.
        chat: the answers continue the chat format's generation prompt (False: inputs prepared with
            ``chat=False``; the answers are tokenised on their own).
        """
        if mode not in ("logprob", "first_token"):
            raise UserInputError(f"answer_logit_diff: mode must be 'logprob' or 'first_token', got {mode!r}.")
        n = inputs.batch_size
        goods = [correct] * n if isinstance(correct, str) else list(correct)
        bads = [incorrect] * n if isinstance(incorrect, str) else list(incorrect)
        if len(goods) != n or len(bads) != n:
            raise UserInputError(f"answer_logit_diff: {len(goods)} correct and {len(bads)} incorrect answers for a "
                                 f"batch of {n}; pass one string for all rows or one per row.")
        good_ids = [answer_ids(self, a, example=f"row {i}", chat=chat) for i, a in enumerate(goods)]
        bad_ids = [answer_ids(self, a, example=f"row {i}", chat=chat) for i, a in enumerate(bads)]
        with torch.no_grad():
            if mode == "logprob":
                scores = []
                for ids in (good_ids, bad_ids):
                    logits = self.run_with_hooks(teacher_force(self, inputs, ids), fwd_hooks=list(fwd_hooks))
                    scores.append(answer_logprobs(logits, ids)[0])
                return scores[0] - scores[1]
            pairs = [first_difference(self, a, b, example=f"row {i}")
                     for i, (a, b) in enumerate(zip(good_ids, bad_ids, strict=True))]
            logits = self.run_with_hooks(append_tokens(self, inputs, [p[0] for p in pairs]),
                                         fwd_hooks=list(fwd_hooks))[:, -1].float()
            rows = torch.arange(n, device=logits.device)
            good = torch.tensor([p[1] for p in pairs], device=logits.device)
            bad = torch.tensor([p[2] for p in pairs], device=logits.device)
            return (logits[rows, good] - logits[rows, bad]).cpu()

    def coerce_inputs(self, inputs: Any = None, **hf_kwargs: Any) -> VLMInputs:
        """Accept `VLMInputs`, a processor output (dict / BatchFeature), token ids, HF keywords, or text.

        Text (a string or a list of strings) is tokenised as TransformerLens does, by `to_tokens`
        (no chat template, no image, ``cfg.default_prepend_bos``; a batch padded on the tokenizer's
        side, padding masked), so ``model("some text", return_type="loss")`` runs the text alone.
        """
        if isinstance(inputs, str) or (isinstance(inputs, (list, tuple)) and inputs
                                       and all(isinstance(item, str) for item in inputs)):
            texts = [inputs] if isinstance(inputs, str) else list(inputs)
            tokens = self.to_tokens(texts)
            width = tokens.shape[1]
            lengths = [self.to_tokens(text, move_to_device=False).shape[1] for text in texts]
            left = getattr(self.tokenizer, "padding_side", "right") == "left"
            mask = [[0] * (width - n) + [1] * n if left else [1] * n + [0] * (width - n) for n in lengths]
            hf_kwargs.setdefault("attention_mask", torch.tensor(mask, dtype=torch.long, device=tokens.device))
            inputs = tokens
        return coerce_inputs(self, inputs, **hf_kwargs)

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        inputs: Any = None,
        return_type: ReturnType = "logits",
        stop_at_layer: int | None = None,
        loss_per_token: bool = False,
        labels: Tensor | None = None,
        **hf_kwargs: Any,
    ) -> Float[Tensor, "batch pos d_vocab"] | Tensor | tuple[Tensor, Tensor] | None:
        """Logits [batch, pos, d_vocab] for `VLMInputs` or the HF keyword form.

        return_type: "logits"; "loss" (next-token loss, see `vlens.core.loss`: every next text token,
            or the tokens `labels` marks); "both" for (logits, loss); "resid" for the final
            residual after the final norm (what lm_head reads); None for nothing.
        stop_at_layer: return the residual stream entering that block instead.
        loss_per_token: the loss as [batch, pos - 1] (0 where nothing is predicted).
        labels: [batch, pos] HF-style targets (-100 = ignore) for the loss.
        """
        if return_type not in ("logits", "loss", "both", "resid", None):
            raise UserInputError(f"Unknown return_type {return_type!r}: use 'logits', 'loss', 'both', 'resid' or None.")
        run_inputs = self.coerce_inputs(inputs, **hf_kwargs)
        state = self.start_run(run_inputs)
        resid = self.run_blocks(state.resid, state, 0, stop_at_layer)
        if stop_at_layer is not None:
            return resid
        if return_type not in ("loss", "both"):
            return self.finish(resid, return_type)

        logits = self.finish(resid, "logits")
        placeholders = tuple(t for t in (self.cfg.image_token_id, self.cfg.video_token_id) if t is not None)
        targets = next_token_targets(run_inputs.input_ids, run_inputs.attention_mask, placeholders, labels)
        loss = next_token_loss(logits, targets, per_token=loss_per_token)
        return (logits, loss) if return_type == "both" else loss

    def start_run(self, inputs: VLMInputs, kv_cache: KVCache | None = None) -> RunState:
        """Embed tokens, encode and merge images, build positions and masks.

        `inputs` as `prepare` / `coerce_inputs` return them (already checked by the adapter).
        """
        cfg = self.cfg
        home = self.input_device
        if inputs.input_ids.device != home:  # e.g. a model split by a device map starts on its first device
            inputs = inputs.to(home)
        ids = inputs.input_ids
        resid = self.hook_embed(self.embed(ids))
        deepstack: dict[int, tuple[Tensor, Tensor]] = {}
        image_mask = ids == cfg.image_token_id if cfg.image_token_id is not None else None
        if image_mask is not None and cfg.video_token_id is not None and inputs.pixel_values_videos is not None:
            # videos' tokens take their features too: one [n_image_tokens, d_model] tensor over both, in order
            # (without video inputs a video token is a plain token, as in HF, e.g. one a random model generated)
            image_mask = image_mask | (ids == cfg.video_token_id)
        if inputs.pixel_values is not None or inputs.pixel_values_videos is not None:
            if image_mask is None:
                raise UserInputError("These inputs carry images but the model's config names no image token "
                                 "(cfg.image_token_id is None), so there is nowhere to put them.")
            features = self.adapter.encode_images(self.vision, inputs)
            n_placeholders = int(image_mask.sum())
            if n_placeholders != features.embeds.shape[0]:
                raise UserInputError(
                    f"Image placeholders and image features do not match: the prompt holds {n_placeholders} "
                    f"image / video tokens but the vision tower produced {features.embeds.shape[0]} features. Build "
                    "inputs with model.prepare(...) or the model's processor, which expands each image "
                    "placeholder to the image's token count."
                )
            resid = resid.masked_scatter(image_mask.unsqueeze(-1), features.embeds.to(resid.device, resid.dtype))
            deepstack = {layer: (image_mask, feats) for layer, feats in enumerate(features.deepstack)}
        elif image_mask is not None and bool(image_mask.any()):
            raise UserInputError(
                f"The prompt holds {int(image_mask.sum())} image / video placeholder tokens but no pixel_values "
                "(pixel_values_videos) were given. Pass the images (model.prepare(images=..., prompts=...)) or "
                "remove the placeholders."
            )
        resid = self.hook_inputs_embeds(resid)
        position_ids, deltas = self.adapter.position_ids(self.hf_model, inputs)
        cos, sin = self.rotary(resid, position_ids)
        masks = build_masks(inputs.attention_mask, ids.shape[0], ids.shape[1], 0, resid.dtype, resid.device,
                            blocks=self.adapter.attention_blocks(cfg, inputs))
        return RunState(resid=resid, cos=cos, sin=sin, masks=masks, position_ids=position_ids,
                        rope_deltas=deltas, deepstack=deepstack, kv_cache=kv_cache)

    def run_blocks(
        self,
        resid: Float[Tensor, "batch pos d_model"],
        state: RunState,
        start_at_layer: int = 0,
        stop_at_layer: int | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        """Run blocks [start_at_layer, stop_at_layer) on a residual stream.

        Each block runs on its own device (one device, or where a device map placed it): the residual
        and the run state move there first.
        """
        for block in self.blocks[start_at_layer:stop_at_layer]:
            device = module_device(block)
            if resid.device != device:
                resid = resid.to(device)
            local = state.on(device)
            resid = block(resid, local.cos, local.sin, local.masks, local.kv_cache,
                          deepstack=local.deepstack.get(block.layer))
        return resid

    @overload
    def finish(self, resid: Tensor, return_type: Literal["logits", "resid"] = "logits") -> Tensor: ...
    @overload
    def finish(self, resid: Tensor, return_type: None) -> None: ...
    @overload
    def finish(self, resid: Tensor, return_type: str | None) -> Tensor | None: ...
    def finish(self, resid: Tensor, return_type: str | None = "logits") -> Tensor | None:
        """Final norm and unembedding (the norm's weight is applied by `unembed`, see `vlens.core.weights`).

        return_type: "logits"; "resid" for ``ln_final_w * ln_final(resid)`` (lm_head's input); None.
        """
        if return_type is None:
            return None
        # the norm has no weight of its own: it runs where lm_head does, as does its HF weight
        normalized = self.ln_final(resid.to(module_device(self.unembed.lm_head)))
        if return_type == "resid":
            return self.unembed.apply_norm_weight(normalized)
        if return_type == "logits":
            return self.unembed(normalized)
        raise UserInputError(f"Unknown return_type {return_type!r}: use 'logits', 'resid' or None.")

    # ------------------------------------------------------------------ persistence
    def __reduce_ex__(self, protocol: Any) -> Any:
        raise UserInputError(
            "A HookedVLM is not pickled (torch.save(model) / pickle): it wraps the HF model, its processor and "
            "hook functions, and torch.load (weights_only=True) would refuse it. Save the HF folder instead: "
            "model.hf_model.save_pretrained(folder) and model.processor.save_pretrained(folder), then "
            "HookedVLM.from_pretrained(folder); or torch.save(model.state_dict(), path) for the weights alone "
            "(load_state_dict into a model built the same way)."
        )

    def __deepcopy__(self, memo: dict) -> HookedVLM:  # what copy.deepcopy did before pickling was refused
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        new.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return new

    @contextmanager
    def hooks(self, fwd_hooks: Sequence = (), bwd_hooks: Sequence = (), reset_hooks_end: bool = True,
              clear_contexts: bool = False):
        """Temporary hooks (TransformerLens semantics: removed on exit, also on error).

        Unknown hook names, and name filters that match no hook point, fail before anything runs,
        with the closest existing names. The forward hooks run only in this thread (another thread's
        forward on the same model does not see them) and leaving the context removes only them
        (`vlens.core.hooks`).
        """
        fwd_hooks, bwd_hooks = check_hook_pairs(fwd_hooks, "fwd_hooks"), check_hook_pairs(bwd_hooks, "bwd_hooks")
        for name, _ in [*fwd_hooks, *bwd_hooks]:
            self.check_hook_filter(name, "hook name")
        level = new_context_level()  # unique: another thread's context never removes these hooks
        try:
            for name, hook in fwd_hooks:
                self.add_hook(name, hook, dir="fwd", level=level)
            for name, hook in bwd_hooks:
                self.add_hook(name, hook, dir="bwd", level=level)
            yield self
        finally:
            if reset_hooks_end:
                self.reset_hooks(clear_contexts, including_permanent=False, level=level)

    def run_with_cache(self, *model_args: Any, return_cache_object: bool = True, remove_batch_dim: bool = False,
                       incl_bwd: bool = False, attn_scores: bool = False, **kwargs: Any):
        """Run and cache activations: (output, `VLMActivationCache`, a TransformerLens ActivationCache).

        Same keywords as TransformerLens (names_filter, device, remove_batch_dim, incl_bwd, pos_slice).
        Every hook (no names_filter) means every hook but ``hook_attn_scores``: the scores hold
        the same information as ``hook_pattern`` (its logarithm up to a per-row constant) at the same
        [batch, n_heads, pos, pos] size, the largest entries of the cache. Ask for them with
        ``attn_scores=True`` or by naming them in `names_filter`.
        incl_bwd=True needs return_type="loss": the loss is backpropagated and every hook's gradient
        is cached as "<name>_grad" (also when the weights are frozen: the residual stream then
        starts the graph). Hooks are removed when it returns, also on error. saes={hook: sae}
        (with positions=, use_error_term=) splices SAEs for this call (`vlens.core.splicing`).
        """
        if kwargs.get("saes") is not None:
            saes, positions = kwargs.pop("saes"), kwargs.pop("positions", "all")
            use_error_term = kwargs.pop("use_error_term", False)
            inputs = self.coerce_inputs(model_args[0]) if model_args else None
            with self.saes(saes, positions=positions, use_error_term=use_error_term, inputs=inputs):
                return self.run_with_cache(*((inputs,) + model_args[1:] if model_args else ()),
                                           return_cache_object=return_cache_object,
                                           remove_batch_dim=remove_batch_dim, incl_bwd=incl_bwd,
                                           attn_scores=attn_scores, **kwargs)
        kwargs.pop("saes", None)
        if kwargs.get("names_filter") is None and not attn_scores:
            kwargs["names_filter"] = _not_attn_scores
        with self.backward_ready(model_args, kwargs) if incl_bwd else nullcontext():
            out, cache_dict = super().run_with_cache(*model_args, remove_batch_dim=remove_batch_dim,
                                                     incl_bwd=incl_bwd, **kwargs)
        if not return_cache_object:
            return out, cache_dict
        return out, VLMActivationCache(cache_dict, self, has_batch_dim=not remove_batch_dim)

    # ------------------------------------------------------------------ generation
    def generate(self, inputs: Any = None, max_new_tokens: int = 16, do_sample: bool = False,
                 temperature: float = 1.0, top_p: float | None = 1.0, top_k: int | None = None,
                 fwd_hooks: Sequence = (), seed: int | None = None, verbose: bool = False,
                 stop_at_eos: bool = True, eos_token_id: int | Sequence[int] | None = None,
                 return_type: Literal["input", "output", "str", "tokens"] | None = "input",
                 use_past_kv_cache: bool = True, freq_penalty: float = 0.0, repetition_penalty: float = 1.0,
                 prepend_bos: bool | None = None, padding_side: Literal["left", "right"] | None = None,
                 return_cache: bool = False, names_filter: NamesFilter = None,
                 cache_device: str | torch.device | None = None,
                 **hf_kwargs: Any) -> GenerationOutput | Tensor | str | list[str]:
        """Autoregressive decoding with a KV cache (M-RoPE deltas handled); TransformerLens's keywords.

        inputs: `VLMInputs` (from `prepare`), a processor output, HF keywords, token ids
            [batch, pos] or text (a string or a list: text alone, tokenised by `to_tokens` with
            `prepend_bos`; a batch is left-padded, as TransformerLens forces for generation).
        Sampling and stopping (do_sample, temperature, top_k, top_p, freq_penalty,
        repetition_penalty, stop_at_eos, eos_token_id, use_past_kv_cache, verbose, seed,
        fwd_hooks): `vlens.core.generation.generate`. The default is greedy (HF's default;
        TransformerLens samples unless ``do_sample=False``).
        return_type: "input" (default) answers in the form of the input, as TransformerLens does:
            text -> text (prompt and continuation: a string, or a list for a list), token ids ->
            token ids [batch, pos + new], anything else -> `GenerationOutput`; "output" is always
            `GenerationOutput`; "tokens" the ids [batch, pos + new]; "str" the decoded sequence
            (prompt and continuation, special tokens kept, as TransformerLens decodes), a list per row.
        saes={hook: sae} (with positions=, use_error_term=) splices SAEs into the prompt and every step.
        return_cache: also cache the activations of the prompt and of every new token, one
            `VLMActivationCache` over prompt + new tokens in ``out.cache`` (a `GenerationOutput` is then
            returned whatever `return_type`); names_filter / cache_device: which hooks, kept where.
            A hook reads the decoding step in ``hook.ctx["step"]`` (-1: the prompt; see
            `vlens.core.generation.generate`).
        """
        if return_cache and return_type not in ("input", "output"):
            raise UserInputError(f"generate(return_cache=True) returns a GenerationOutput (out.cache); return_type "
                                 f"{return_type!r} has no room for the cache. Leave return_type out.")
        if return_type not in ("input", "output", "str", "tokens", None):
            raise UserInputError(f"generate: return_type must be 'input', 'output', 'str' or 'tokens', got "
                                 f"{return_type!r}.")
        saes = hf_kwargs.pop("saes", None)
        positions, use_error_term = hf_kwargs.pop("positions", "all"), hf_kwargs.pop("use_error_term", False)
        single_text = isinstance(inputs, str)
        text_input = single_text or (isinstance(inputs, (list, tuple)) and bool(inputs)
                                                 and all(isinstance(item, str) for item in inputs))
        tokens_input = isinstance(inputs, Tensor)
        if text_input:
            texts = [inputs] if isinstance(inputs, str) else list(inputs)
            rows = [self.to_tokens(text, prepend_bos=prepend_bos, move_to_device=False)[0] for text in texts]
            width = max(len(row) for row in rows)
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
            ids = torch.full((len(rows), width), pad, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for i, row in enumerate(rows):  # left padding: every row's next token is in the last column
                ids[i, width - len(row):], mask[i, width - len(row):] = row, 1
            inputs, hf_kwargs = ids, {**hf_kwargs, "attention_mask": mask}
        elif padding_side is not None or prepend_bos is not None:
            raise UserInputError("generate: prepend_bos / padding_side apply to text input only; these inputs are "
                                 "already tokens.")
        run_inputs = self.coerce_inputs(inputs, **hf_kwargs)
        with self.saes(saes, positions=positions, use_error_term=use_error_term, inputs=run_inputs) if saes \
                else nullcontext():
            out = generate(self, run_inputs, max_new_tokens=max_new_tokens, do_sample=do_sample,
                           temperature=temperature, top_p=top_p, top_k=top_k, fwd_hooks=fwd_hooks, seed=seed,
                           verbose=verbose, stop_at_eos=stop_at_eos, eos_token_id=eos_token_id,
                           use_past_kv_cache=use_past_kv_cache, freq_penalty=freq_penalty,
                           repetition_penalty=repetition_penalty, return_cache=return_cache,
                           names_filter=names_filter, cache_device=cache_device)
        if return_cache:
            return out
        if return_type == "input":
            return_type = "str" if text_input else "tokens" if tokens_input else "output"
        if return_type == "tokens":
            return out.sequences
        if return_type == "str":
            decoded = [self.tokenizer.decode(row[keep.bool()].tolist() + (_until_end(new.tolist(), eos_token_id, self.cfg)
                                                                           if stop_at_eos else new.tolist()))
                       for row, keep, new in zip(run_inputs.input_ids, run_inputs.attention_mask, out.tokens,
                                                 strict=True)]
            return decoded[0] if single_text else decoded
        return out

    # ------------------------------------------------------------------ TransformerLens conveniences
    # (more in vlens.core.tl_surface and vlens.core.weights, mixed in above)
    def to_string(self, tokens: Tensor | Sequence[int]) -> str | list[str]:
        if isinstance(tokens, Tensor) and tokens.ndim == 2:
            return [self.tokenizer.decode(row) for row in tokens]
        return self.tokenizer.decode(tokens)

    def to_str_tokens(self, tokens: str | int | Tensor | Sequence, prepend_bos: bool | None = None,
                      padding_side: Literal["left", "right"] | None = None) -> list[str] | list[list[str]]:
        """Each token decoded on its own, as TransformerLens does (' many', '\\n', not 'Ġmany', 'Ċ').

        Takes a string (tokenised by `to_tokens` with `prepend_bos` / `padding_side`, TransformerLens's
        meaning: None is ``cfg.default_prepend_bos``, False for Qwen, whose tokenizer has no BOS), a
        list of strings (one list each), an int, a list of ids, a 1-D tensor (-> list[str]) or a 2-D
        tensor / list of lists (-> one list per row); for ids `prepend_bos` and `padding_side` are
        ignored, as in TransformerLens. `VLMInputs` give one list per row with each image token
        labelled by image and grid cell, ``<img0[r2,c3]>`` (`vlens.viz.image_token_labels`).
        """
        if isinstance(tokens, VLMInputs):  # one list per row, image tokens as <img0[r2,c3]> (their grid cell)
            rows = []
            for row in range(tokens.input_ids.shape[0]):
                text = cast(list[str], str_tokens(self.tokenizer, tokens.input_ids[row]))  # a 1-D row
                labels = image_token_labels(self, tokens, row)
                images = {int(p) for image in (tokens.regions.images[row] if tokens.regions else []) for p in image}
                rows.append([f"<{labels[p]}>" if p in images else text[p] for p in range(len(text))])
            return rows
        if isinstance(tokens, str):
            return str_tokens(self.tokenizer, self.to_tokens(tokens, prepend_bos=prepend_bos,
                                                             padding_side=padding_side, move_to_device=False)[0])
        if isinstance(tokens, (list, tuple)) and tokens and all(isinstance(item, str) for item in tokens):
            return [cast(list[str], self.to_str_tokens(item, prepend_bos, padding_side)) for item in tokens]
        return str_tokens(self.tokenizer, tokens)

    def to_single_token(self, text: str) -> int:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            raise UserInputError(f"{text!r} is {len(ids)} tokens ({ids}), not one.")
        return ids[0]

    def summary(self) -> str:
        """One line: architecture, sizes and the number of hook points."""
        c = self.cfg
        return (f"HookedVLM({c.architecture}: {c.n_layers} layers, d_model={c.d_model}, "
                f"{c.n_heads} heads ({c.n_key_value_heads} kv), d_head={c.d_head}, "
                f"{len(self.hook_dict)} hook points)")


def _not_attn_scores(name: str) -> bool:
    """run_with_cache's default filter: every hook point but the attention scores."""
    return not name.endswith("hook_attn_scores")


def _until_end(new: list[int], eos_token_id: int | Sequence[int] | None, cfg: VLMConfig) -> list[int]:
    """A row's new tokens up to its first end token (kept), without the padding after it."""
    ends = {eos_token_id} if isinstance(eos_token_id, int) else set(eos_token_id or cfg.eos_token_ids or [])
    cut = next((i + 1 for i, token in enumerate(new) if token in ends), len(new))
    return new[:cut]


HookedVisionLanguageModel = HookedVLM
