"""Stage 0 (model summary): architecture numbers of the model under study."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vlens.demo.report_sections import Section

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM



def model_summary(model: HookedVLM, model_name: str) -> dict:
    """Plain numbers describing the model (also the `model` entry of results.json)."""
    cfg = model.cfg
    n_params = sum(p.numel() for p in model.parameters())
    return {
        "name": model_name,
        "summary": model.summary(),
        "architecture": getattr(cfg, "architecture", None),
        "n_layers": cfg.n_layers,
        "n_heads": cfg.n_heads,
        "n_key_value_heads": cfg.n_key_value_heads,
        "d_model": cfg.d_model,
        "d_head": cfg.d_head,
        "d_mlp": cfg.d_mlp,
        "d_vocab": cfg.d_vocab,
        "n_parameters": n_params,
    }


def model_section(summary: dict, image_grid: tuple[int, int] | None, n_image_tokens: int | None = None) -> Section:
    """n_image_tokens: the image's token count where it is not the grid's (CLS, anyres tiles and newlines)."""
    numbers = {k: summary[k] for k in ("n_layers", "n_heads", "d_model", "d_head", "d_vocab", "n_parameters")}
    if image_grid is not None:
        numbers["image tokens"] = n_image_tokens if n_image_tokens is not None else image_grid[0] * image_grid[1]
        numbers["image grid"] = f"{image_grid[0]}x{image_grid[1]}"
    table = [{"field": key, "value": value} for key, value in summary.items() if value is not None]
    return Section(
        key="model",
        title="Model summary",
        explanation=f"{summary['name']}: {summary['summary']}",
        table=table,
        numbers=numbers,
        data=summary,
    )
