"""A light image+text processor for when HF's `AutoProcessor` cannot be built.

HF's Qwen-VL processors insist on a video processor, which needs torchvision; on machines
without it `AutoProcessor.from_pretrained` fails even for image-only use. `SimpleVLProcessor`
does the same image-only job from the folder's tokenizer and (PIL) image processor: it
expands each image placeholder to the image's token count exactly as HF's processor does and
returns the same keys (input_ids, attention_mask, pixel_values, image_grid_thw,
mm_token_type_ids).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from transformers import BatchFeature

from vlens.utils.errors import UserInputError

logger = logging.getLogger(__name__)


class SimpleVLProcessor:
    """Tokenizer + image processor + chat template, with HF-processor-compatible calls.

    tokens_per_image: function(image_processor_output, index) -> placeholder count; by default
    Qwen's rule prod(image_grid_thw[index]) // merge_size**2.
    """

    def __init__(self, tokenizer: Any, image_processor: Any, chat_template: str | None = None,
                 image_token: str = "<|image_pad|>", tokens_per_image=None):
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.chat_template = chat_template or getattr(tokenizer, "chat_template", None)
        self.image_token = image_token
        self.image_token_id = tokenizer.convert_tokens_to_ids(image_token)
        self._tokens_per_image = tokens_per_image or self._qwen_tokens_per_image

    def _qwen_tokens_per_image(self, image_inputs: dict, index: int) -> int:
        merge = getattr(self.image_processor, "merge_size", 1)
        return int(image_inputs["image_grid_thw"][index].prod()) // merge**2

    def __call__(self, text: str | list[str] | None = None, images: Any = None, return_tensors: str = "pt",
                 padding: bool | str = True, **tokenizer_kwargs: Any) -> BatchFeature:
        texts = [text] if isinstance(text, str) else list(text or [])
        image_inputs: dict = {}
        if images:
            images = images if isinstance(images, (list, tuple)) else [images]
            image_inputs = self.process_images(list(images))
            texts = self._expand_placeholders(texts, image_inputs, len(images))
        encoded = self.tokenizer(texts, padding=padding, return_tensors=return_tensors, **tokenizer_kwargs)
        ids = encoded["input_ids"]
        encoded["mm_token_type_ids"] = (ids == self.image_token_id).to(torch.int)
        return BatchFeature({**encoded, **image_inputs})

    def process_images(self, images: list) -> dict:
        """The image processor's output for a flat list of images (tensors)."""
        return dict(self.image_processor(images=images, return_tensors="pt"))

    def _expand_placeholders(self, texts: list[str], image_inputs: dict, n_images: int) -> list[str]:
        marker = "<<vlens-image>>"  # so an expanded placeholder is not expanded again
        index, out = 0, []
        for text in texts:
            while self.image_token in text:
                if index >= n_images:
                    raise UserInputError(f"The text holds more {self.image_token} placeholders than the "
                                     f"{n_images} images given.")
                text = text.replace(self.image_token, marker * self._tokens_per_image(image_inputs, index), 1)
                index += 1
            out.append(text.replace(marker, self.image_token))
        if index != n_images:
            raise UserInputError(f"Got {n_images} images but the text holds {index} {self.image_token} placeholders: "
                             "give one placeholder per image.")
        return out

    def expand_layouts(self, texts: list[str], layouts: list[str], n_images: int) -> list[str]:
        """Each image placeholder of `texts`, in order, replaced by its image's placeholder text `layouts[i]` (a
        family's rows, tiles and tags around its image tokens); the count must match the images given."""
        marker, index, out = "<<vlens-image>>", 0, []  # so an expanded placeholder is not expanded again
        for text in texts:
            while self.image_token in text:
                if index >= n_images:
                    raise UserInputError(f"The text holds more {self.image_token} placeholders than the "
                                         f"{n_images} images given.")
                text = text.replace(self.image_token, f"{marker}{index}{marker}", 1)
                index += 1
            for i in range(index):
                text = text.replace(f"{marker}{i}{marker}", layouts[i])
            out.append(text)
        if index != n_images:
            raise UserInputError(f"Got {n_images} images but the text holds {index} {self.image_token} placeholders: "
                                 "give one placeholder per image.")
        return out

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tokenize: bool = False, **kwargs: Any):
        if not self.chat_template:
            raise UserInputError("This processor has no chat template; pass chat=False or set chat_template.")
        return self.tokenizer.apply_chat_template(messages, chat_template=self.chat_template,
                                                  add_generation_prompt=add_generation_prompt,
                                                  tokenize=tokenize, **kwargs)

    def decode(self, *args, **kwargs) -> str:
        return self.tokenizer.decode(*args, **kwargs)

    def batch_decode(self, *args, **kwargs) -> list[str]:
        return self.tokenizer.batch_decode(*args, **kwargs)

    def save_pretrained(self, folder: str) -> None:
        self.tokenizer.save_pretrained(folder)
        self.image_processor.save_pretrained(folder)
        if self.chat_template:
            with open(f"{folder}/chat_template.jinja", "w") as fh:
                fh.write(self.chat_template)


def processor_from_folder(processor_class: Any, name_or_path: str, trust_remote_code: bool = False) -> Any:
    """`processor_class.from_pretrained(name_or_path)`, or None (logged) where the folder does not hold one: an
    adapter's `load_processor` for a family whose HF processor needs torchvision."""
    try:
        return processor_class.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, TypeError, UserInputError) as error:
        logger.info("%s unavailable for %s: %s", processor_class.__name__, name_or_path, error)
        return None
