"""The SAE module every architecture shares: parameters, input processing, decoding, forward.

Shapes follow SAELens: ``W_enc [d_in, d_sae]``, ``W_dec [d_sae, d_in]``, ``b_enc [d_sae]``,
``b_dec [d_in]``. An architecture only says how pre-activations become feature activations
(`activate`). Inputs may carry any leading dimensions (``[..., d_in]``).
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor, nn

from vlens.sae.config import SAEConfig, torch_dtype


class SAE(nn.Module):
    """A sparse autoencoder: ``acts = activate(normalize(x) - b_dec @ W_enc + b_enc)``, ``x_hat = acts @ W_dec + b_dec``.

    `encode` and `decode` run the config's input normalization ("constant_norm_rescale",
    "layer_norm") the way SAELens does: `encode` remembers the statistics of its input and
    `decode` undoes them, so call them in that order (or use `forward`).
    """

    cfg: SAEConfig

    def __init__(self, cfg: SAEConfig):
        super().__init__()
        self.cfg = cfg
        dtype, device = torch_dtype(cfg.dtype), torch.device(cfg.device)
        self.W_enc = nn.Parameter(torch.zeros(cfg.d_in, cfg.d_sae, dtype=dtype, device=device))
        self.W_dec = nn.Parameter(torch.zeros(cfg.d_sae, cfg.d_in, dtype=dtype, device=device))
        self.b_enc = nn.Parameter(torch.zeros(cfg.d_sae, dtype=dtype, device=device))
        self.b_dec = nn.Parameter(torch.zeros(cfg.d_in, dtype=dtype, device=device))
        self._norm: tuple[Tensor, Tensor] | None = None

    # ------------------------------------------------------------------ the architecture's part
    @abstractmethod
    def activate(self, pre: Float[Tensor, "... d_sae"]) -> Float[Tensor, "... d_sae"]:
        """Feature activations from pre-activations."""

    # ------------------------------------------------------------------ shared
    @property
    def dtype(self) -> torch.dtype:
        return self.W_enc.dtype

    def normalize(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_in"]:
        """The config's run-time normalization of the input (remembered for `decode`)."""
        mode = self.cfg.normalize_activations
        if mode == "constant_norm_rescale":
            scale = (self.cfg.d_in ** 0.5) / x.norm(dim=-1, keepdim=True)
            self._norm = (torch.zeros_like(scale), 1 / scale)
            return x * scale
        if mode == "layer_norm":
            mu = x.mean(dim=-1, keepdim=True)
            std = (x - mu).std(dim=-1, keepdim=True)
            self._norm = (mu, std)
            return (x - mu) / (std + 1e-5)
        return x

    def denormalize(self, x_hat: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_in"]:
        if self.cfg.normalize_activations in ("constant_norm_rescale", "layer_norm"):
            if self._norm is None:
                raise RuntimeError("decode() of a normalizing SAE needs encode() on the same input first.")
            shift, scale = self._norm
            return x_hat * scale + shift
        return x_hat

    def pre_acts(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_sae"]:
        """Pre-activations ``(normalize(x) - b_dec) @ W_enc + b_enc`` (b_dec only if apply_b_dec_to_input)."""
        x = self.normalize(x.to(self.dtype))
        if self.cfg.apply_b_dec_to_input:
            x = x - self.b_dec
        return x @ self.W_enc + self.b_enc

    def encode(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_sae"]:
        """Feature activations of an input."""
        return self.activate(self.pre_acts(x))

    def decode(self, acts: Float[Tensor, "... d_sae"]) -> Float[Tensor, "... d_in"]:
        """The reconstruction ``acts @ W_dec + b_dec`` (then the normalization undone)."""
        return self.denormalize(self.decode_weights(acts) @ self.W_dec + self.b_dec)

    def decode_weights(self, acts: Float[Tensor, "... d_sae"]) -> Float[Tensor, "... d_sae"]:
        """What multiplies W_dec (TopK with rescale_acts_by_decoder_norm divides by the row norms)."""
        return acts

    def forward(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_in"]:
        """The reconstruction of `x`."""
        return self.decode(self.encode(x))

    def extra_repr(self) -> str:
        return f"{self.cfg.architecture}: d_in={self.cfg.d_in}, d_sae={self.cfg.d_sae}, hook={self.cfg.hook_name}"

    # ------------------------------------------------------------------ helpers
    @torch.no_grad()
    def initialize(self, generator: torch.Generator | None = None, decoder_norm: float = 0.1) -> SAE:
        """SAELens-style initialisation: decoder rows uniform on the sphere of radius `decoder_norm`,
        encoder its transpose, biases zero."""
        w = torch.randn(self.cfg.d_sae, self.cfg.d_in, generator=generator, dtype=torch.float32)
        w = w / w.norm(dim=-1, keepdim=True) * decoder_norm
        self.W_dec.copy_(w)
        self.W_enc.copy_(w.T)
        self.b_enc.zero_()
        self.b_dec.zero_()
        return self

    def state(self) -> dict[str, Tensor]:
        """The parameters under SAELens's names (what `sae_weights.safetensors` holds)."""
        return {name: value.detach().contiguous() for name, value in self.state_dict().items()}

    def load_state(self, state: dict[str, Any]) -> None:
        self.load_state_dict({k: v.to(self.dtype) for k, v in state.items()})
