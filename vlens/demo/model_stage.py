"""Stage 0 (model summary): architecture numbers of the model under study."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from vlens.demo.report_sections import Section
from vlens.utils.fileio import read_json_file

if TYPE_CHECKING:
    from vlens.core.model import HookedVLM



def recorded_training_sources(folder: Path | None) -> list[str] | None:
    """The data sources a vlens-trained model folder records in its evaluation.json (its last stage's
    mix, e.g. "counting/syndot", "existence"); None when the folder records none (e.g. a hub model)."""
    path = None if folder is None else Path(folder) / "evaluation.json"
    if path is None or not path.is_file():
        return None
    mix = (read_json_file(path).get("data") or {}).get("mix")
    return sorted(mix) if isinstance(mix, dict) and mix else None


def model_summary(model: HookedVLM, model_name: str, folder: Path | None = None) -> dict:
    """Plain numbers describing the model (also the `model` entry of results.json); with the model's
    folder, also the training sources it records (`recorded_training_sources`)."""
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
        "training_sources": recorded_training_sources(folder),
    }


def model_section(summary: dict, image_grid: tuple[int, int] | None, n_image_tokens: int | None = None) -> Section:
    """n_image_tokens: the image's token count where it is not the grid's (CLS, anyres tiles and newlines)."""
    numbers = {k: summary[k] for k in ("n_layers", "n_heads", "d_model", "d_head", "d_vocab", "n_parameters")}
    if image_grid is not None:
        numbers["image tokens"] = n_image_tokens if n_image_tokens is not None else image_grid[0] * image_grid[1]
        numbers["image grid"] = f"{image_grid[0]}x{image_grid[1]}"
    table = [{"field": key, "value": ", ".join(value) if isinstance(value, list) else value}
             for key, value in summary.items() if value is not None]
    return Section(
        key="model",
        title="Model summary",
        explanation=f"{summary['name']}: {summary['summary']}",
        table=table,
        numbers=numbers,
        data=summary,
    )
