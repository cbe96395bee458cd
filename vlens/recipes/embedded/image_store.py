"""Many training images in little memory: square RGB images kept PNG-compressed.

A synthetic 224 px scene compresses to 2-6 kB as PNG (lossless) against 150 kB raw, so a
recipe stage can pre-render tens of thousands of images; a batch is decoded when it is
drawn (well under a millisecond per image).
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
import torch
from jaxtyping import UInt8
from PIL import Image

from vlens.utils.errors import UserInputError


class ImageStore:
    """uint8 [size, size, 3] images; `store[rows]` decodes them into [len(rows), size, size, 3]."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._blobs: list[bytes] = []

    def append(self, image: UInt8[np.ndarray, "size size 3"]) -> None:
        if image.shape != (self.size, self.size, 3) or image.dtype != np.uint8:
            raise UserInputError(
                f"expected a uint8 [{self.size}, {self.size}, 3] image, got {image.dtype} {image.shape}"
            )
        buffer = io.BytesIO()
        Image.fromarray(image, "RGB").save(buffer, format="PNG", compress_level=1)
        self._blobs.append(buffer.getvalue())

    def __len__(self) -> int:
        return len(self._blobs)

    def image(self, row: int) -> UInt8[np.ndarray, "size size 3"]:
        return np.asarray(Image.open(io.BytesIO(self._blobs[row])).convert("RGB"))

    def __getitem__(self, rows: Sequence[int] | torch.Tensor | int) -> torch.Tensor:
        if isinstance(rows, int):
            return torch.from_numpy(self.image(rows).copy())
        rows = rows.tolist() if isinstance(rows, torch.Tensor) else list(rows)
        return torch.from_numpy(np.stack([self.image(row) for row in rows]))

    def to_tensors(self) -> list[torch.Tensor]:
        """The PNG bytes of each image as uint8 tensors (plain data: saved and read back without pickle)."""
        return [torch.frombuffer(bytearray(blob), dtype=torch.uint8) for blob in self._blobs]

    @classmethod
    def from_tensors(cls, size: int, blobs: Sequence[torch.Tensor]) -> ImageStore:
        """The store `to_tensors` saved (each image is decoded only when drawn)."""
        store = cls(size)
        store._blobs = [bytes(blob.numpy().tobytes()) for blob in blobs]
        return store

    @property
    def nbytes(self) -> int:
        return sum(len(blob) for blob in self._blobs)
