"""Generation backends: one small protocol, one adapter per kind of model.

The evaluation loop only needs "images + prompts -> generated texts"; the adapters hide
whether that goes through a :class:`vlens.HookedVLM` (with hooks such as head temperatures
or ablations kept active during generation) or a plain Hugging Face model + processor.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Protocol

import torch
from PIL import Image

from vlens.core.answers import answer_ids, answer_logprobs, teacher_force
from vlens.core.processing import chat_messages, image_refusal, left_padding
from vlens.core.prompt_text import escape_special_tokens
from vlens.core.runtime import module_device
from vlens.utils.errors import UserInputError


class GenerationBackend(Protocol):
    """Greedy (by default) generation for a batch of image + question prompts."""

    name: str

    def generate(
        self, images: Sequence[Sequence[Image.Image]], prompts: Sequence[str], max_new_tokens: int
    ) -> list[str]:
        """One decoded answer (new tokens only, special tokens removed) per prompt."""
        ...


class HookedVLMBackend:
    """Generate with a :class:`vlens.HookedVLM`; ``fwd_hooks`` stay active while generating.

    Args:
        model: a HookedVLM (``vlens.load()`` or ``HookedVLM.from_pretrained``).
        fwd_hooks: ``[(hook_name, fn), ...]`` applied to every forward pass, e.g. the
            hooks of an adaptive head temperature or a mean ablation.
        chat: wrap prompts in the model's chat template (how instruction models are asked).
        generate_kwargs: passed on to ``model.generate`` (default greedy: do_sample=False).
    """

    name = "hooked"

    def __init__(
        self, model, fwd_hooks: Sequence[tuple] = (), chat: bool = True, generate_kwargs: dict | None = None
    ):
        self.model = model
        self.fwd_hooks = list(fwd_hooks)
        self.chat = chat
        self.generate_kwargs = {"do_sample": False, **(generate_kwargs or {})}

    def image_refusal(self, image: Image.Image) -> str | None:
        """Why the model's processor would refuse this image (None: it takes it)."""
        return image_refusal(self.model.processor, image)

    def generate(
        self, images: Sequence[Sequence[Image.Image]], prompts: Sequence[str], max_new_tokens: int
    ) -> list[str]:
        # One image per prompt is the common case; several images go as that prompt's list.
        per_prompt = [imgs[0] if len(imgs) == 1 else list(imgs) for imgs in images]
        inputs = self.model.prepare(images=per_prompt, prompts=list(prompts), chat=self.chat)
        with torch.no_grad():  # generate keeps fwd_hooks on for the prompt and every new token
            out = self.model.generate(
                inputs, max_new_tokens=max_new_tokens, fwd_hooks=self.fwd_hooks, **self.generate_kwargs
            )
        # rows whose logits were NaN/inf: their text is meaningless (read by the evaluation loop)
        self.last_non_finite = out.non_finite.tolist() if out.non_finite is not None else [False] * len(prompts)
        return [text.strip() for text in out.texts]

    def score_answers(self, images: Sequence[Sequence[Image.Image]], prompts: Sequence[str],
                      answers: Sequence[str], ids: Sequence[str]) -> list[tuple[list[int] | None, float | None]]:
        """Per prompt: the answer's tokens and its teacher-forced log-probability (vlens.core.answers),
        with ``fwd_hooks`` active, as in `generate`. An answer the tokenizer cannot express (a
        word-level vocabulary without "37") gets (None, None) and a warning naming the example:
        the generated answer is still parsed and scored."""
        tokens: list[list[int] | None] = []
        for answer, example in zip(answers, ids, strict=True):
            try:
                tokens.append(answer_ids(self.model, answer, example=example, chat=self.chat))
            except ValueError as error:
                warnings.warn(f"not scoring the target's log-probability: {error}", stacklevel=2)
                tokens.append(None)
        rows = [i for i, t in enumerate(tokens) if t is not None]
        out: list[tuple[list[int] | None, float | None]] = [(None, None)] * len(tokens)
        if not rows:
            return out
        kept = [t for t in tokens if t is not None]  # the rows' answers
        per_prompt = [images[i][0] if len(images[i]) == 1 else list(images[i]) for i in rows]
        inputs = teacher_force(self.model, self.model.prepare(images=per_prompt, prompts=[prompts[i] for i in rows],
                                                              chat=self.chat), kept)
        longest = max(len(t) for t in kept)
        with torch.no_grad():  # unembed only the answer positions (left padding: the last columns)
            resid = self.model.run_with_hooks(inputs, fwd_hooks=self.fwd_hooks, return_type="resid")
            logits = self.model.unembed(resid[:, -longest:].to(module_device(self.model.unembed.lm_head)))
        logprob, _ = answer_logprobs(logits, kept)
        for i, t, lp in zip(rows, kept, logprob.tolist(), strict=True):
            out[i] = (t, float(lp))
        return out


class HFBackend:
    """Generate with a Hugging Face image-text-to-text model and its processor.

    Prompts go through ``processor.apply_chat_template`` (one ``{"type": "image"}`` per
    image, then the text; ``text_first``: the text, then the images), are left-padded into
    one batch, and only the new tokens are decoded.
    """

    name = "hf"

    def __init__(self, model, processor, generate_kwargs: dict | None = None, text_first: bool = False):
        if getattr(processor, "chat_template", None) is None:
            raise UserInputError(
                "the processor has no chat_template; load one that has (or set processor.chat_template)"
            )
        self.model = model
        self.processor = processor
        self.generate_kwargs = {"do_sample": False, **(generate_kwargs or {})}
        self.text_first = text_first  # the question before the image(s) in the user turn

    def image_refusal(self, image: Image.Image) -> str | None:
        """Why the processor would refuse this image (None: it takes it)."""
        return image_refusal(self.processor, image)

    def generate(
        self, images: Sequence[Sequence[Image.Image]], prompts: Sequence[str], max_new_tokens: int
    ) -> list[str]:
        tokenizer = self.processor.tokenizer
        texts = [  # dataset text is escaped: special-token strings in it cannot forge chat turns
            self.processor.apply_chat_template(chat_messages(escape_special_tokens(tokenizer, prompt), len(imgs),
                                                             text_first=self.text_first),
                                               add_generation_prompt=True, tokenize=False)
            for imgs, prompt in zip(images, prompts, strict=True)
        ]
        with left_padding(self.processor.tokenizer):  # images flat, in prompt order: what HF VLM processors take
            batch = self.processor(
                text=texts, images=[img for imgs in images for img in imgs], return_tensors="pt", padding=True
            )
        batch = batch.to(self.model.device)
        with torch.no_grad():
            tokens = self.model.generate(**batch, max_new_tokens=max_new_tokens, **self.generate_kwargs)
        new_tokens = tokens[:, batch["input_ids"].shape[1] :]
        return [text.strip() for text in self.processor.batch_decode(new_tokens, skip_special_tokens=True)]
