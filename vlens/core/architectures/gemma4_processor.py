"""Gemma 4's image + text processing without torchvision (HF's `Gemma4Processor` needs its video processor,
which needs torchvision): Gemma 4's PIL image processor and the tokenizer, each `<|image|>` expanded to
``<|image>`` + the image's soft tokens + ``<image|>`` exactly as HF's processor does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from transformers import BatchFeature

from vlens.core.architectures.simple_processor import SimpleVLProcessor
from vlens.utils.errors import UserInputError


class Gemma4ImageTextProcessor(SimpleVLProcessor):
    """`Gemma4Processor`'s image and text job: pixel_values [n_images, max_patches, 3 * patch ** 2],
    image_position_ids [n_images, max_patches, 2] ((-1, -1) at padding), input_ids with each image's
    placeholders between its begin / end tokens, mm_token_type_ids (1 at soft tokens)."""

    def __init__(self, tokenizer: Any, image_processor: Any, chat_template: str | None = None,
                 image_token: str = "<|image|>", boi_token: str = "<|image>", eoi_token: str = "<image|>"):
        super().__init__(tokenizer, image_processor, chat_template=chat_template, image_token=image_token)
        self.boi_token, self.eoi_token = boi_token, eoi_token

    def __call__(self, text: str | list[str] | None = None, images: Any = None, return_tensors: str = "pt",
                 padding: bool | str = True, **tokenizer_kwargs: Any) -> BatchFeature:
        if isinstance(images, (list, tuple)) and any(isinstance(row, (list, tuple)) for row in images):
            images = [image for row in images for image in (row if isinstance(row, (list, tuple)) else [row])]
        out = super().__call__(text=text, images=images or None, return_tensors=return_tensors, padding=padding,
                               **tokenizer_kwargs)
        out.pop("num_soft_tokens_per_image", None)  # HF's processor returns it to nobody either
        out["mm_token_type_ids"] = out["mm_token_type_ids"].long()  # HF's dtype
        return out

    def _expand_placeholders(self, texts: list[str], image_inputs: dict, n_images: int) -> list[str]:
        counts = [int(n) for n in image_inputs["num_soft_tokens_per_image"]]
        marker = "<<vlens-image>>"  # so an expanded image's soft tokens are not expanded again
        index, out = 0, []
        for text in texts:
            while self.image_token in text:
                if index >= n_images:
                    raise UserInputError(f"The text holds more {self.image_token} placeholders than the "
                                         f"{n_images} images given.")
                text = text.replace(self.image_token, self.boi_token + marker * counts[index] + self.eoi_token, 1)
                index += 1
            out.append(text.replace(marker, self.image_token))
        if index != n_images:
            raise UserInputError(f"Got {n_images} images but the text holds {index} {self.image_token} placeholders: "
                                 "give one placeholder per image.")
        return out

    def save_pretrained(self, folder: str) -> None:
        super().save_pretrained(folder)
        settings = {"processor_class": "Gemma4Processor", "image_token": self.image_token,
                    "boi_token": self.boi_token, "eoi_token": self.eoi_token}
        Path(folder, "processor_config.json").write_text(json.dumps(settings, indent=2))

    @classmethod
    def from_pretrained(cls, folder: str, **kwargs: Any) -> Gemma4ImageTextProcessor:
        """From a saved folder: its tokenizer, Gemma 4 PIL image processor, chat template and image tokens."""
        from transformers import AutoTokenizer, Gemma4ImageProcessorPil

        tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
        image_processor = Gemma4ImageProcessorPil.from_pretrained(folder)
        path = Path(folder, "processor_config.json")
        settings = json.loads(path.read_text()) if path.is_file() else {}
        template_path = Path(folder, "chat_template.jinja")
        template = template_path.read_text() if template_path.is_file() else None
        return cls(tokenizer, image_processor, chat_template=template,
                   **{k: settings[k] for k in ("image_token", "boi_token", "eoi_token") if k in settings})
