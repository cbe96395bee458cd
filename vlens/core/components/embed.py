"""Token embedding around the HF `nn.Embedding`."""

from __future__ import annotations

from jaxtyping import Float, Int
from torch import Tensor, nn


class Embed(nn.Module):
    """Token embedding; `W_E` is the HF embedding matrix itself, [d_vocab, d_model]."""

    def __init__(self, embedding: nn.Embedding):
        super().__init__()
        self.embedding = embedding

    @property
    def W_E(self) -> Float[Tensor, "d_vocab d_model"]:
        return self.embedding.weight

    def forward(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        return self.embedding(tokens)


class ScaledEmbed(Embed):
    """A token embedding whose HF module multiplies the rows it looks up by a constant (Gemma: sqrt(d_model),
    cast to the weight dtype first, as HF does; in bf16 sqrt(3072) becomes 55.5).

    `W_E` is the effective matrix ``weight * scale`` (computed on access, TransformerLens's convention for
    Gemma), so ``W_E[tokens]`` is `hook_embed`. `placeholder_id`: an image placeholder id outside the
    vocabulary, looked up as id 0 (HF replaces it before embedding; the image features overwrite it).
    """

    def __init__(self, embedding: nn.Embedding, placeholder_id: int | None = None):
        super().__init__(embedding)
        self.placeholder_id = placeholder_id

    @property
    def scale(self) -> Tensor:
        """The multiplier, in the weight's dtype (HF's ``embed_scale.to(weight.dtype)``)."""
        scale: Tensor = self.embedding.get_buffer("embed_scale")  # HF's non-persistent buffer
        return scale.to(device=self.embedding.weight.device, dtype=self.embedding.weight.dtype)

    @property
    def W_E(self) -> Float[Tensor, "d_vocab d_model"]:
        return self.embedding.weight * self.scale

    def forward(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        if self.placeholder_id is not None and self.placeholder_id >= self.embedding.num_embeddings:
            tokens = tokens.masked_fill(tokens == self.placeholder_id, 0)
        return self.embedding(tokens)  # HF's module applies the scale
