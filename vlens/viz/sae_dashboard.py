"""An offline, self-contained HTML dashboard of SAE features (no script, images inlined as PNG).

Takes plain data: the ``features`` list of `vlens.sae.features.FeatureViews.to_dict()` and the
examples' images by index; each feature gets a card with its firing frequencies, the tokens it
promotes and suppresses, its top images with the activation drawn over the image patches, and its
top text positions in context.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from vlens.viz.image_attention import overlay_attention

STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;background:#fafafa}
h1{font-size:1.4em} .meta{color:#555;margin-bottom:1em}
.feature{background:#fff;border:1px solid #ddd;border-radius:6px;padding:.8em 1em;margin:0 0 1em 0}
.feature h2{font-size:1.1em;margin:.1em 0 .4em 0} .stats{color:#555;font-size:.9em}
.images{display:flex;flex-wrap:wrap;gap:.5em;margin:.5em 0} figure{margin:0;text-align:center;font-size:.8em}
figure img{width:112px;height:112px;image-rendering:pixelated;border:1px solid #ccc}
.tokens span{display:inline-block;margin:1px 2px;padding:0 3px;border-radius:3px;background:#eef}
.ctx{font-family:ui-monospace,monospace;font-size:.85em;margin:.15em 0} .ctx mark{background:#fc6;padding:0 2px}
.neg span{background:#fee} table{border-collapse:collapse}
"""


def png_data_uri(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _tokens(pairs: Sequence[Sequence[Any]], css: str = "tokens") -> str:
    cells = "".join(f"<span title='{value:+.3f}'>{html.escape(str(token))}</span>" for token, value in pairs)
    return f"<div class='{css}'>{cells}</div>"


def _image_hits(feature: Mapping[str, Any], images: Mapping[int, Image.Image], vmax: float | None) -> str:
    parts = []
    for hit in feature.get("top_images", []):
        image = images.get(int(hit["example"]))
        if image is None:
            continue
        rows, cols = hit["grid"]
        drawn = overlay_attention(image.convert("RGB"), torch.tensor(hit["cells"]), (rows, cols), alpha=0.55,
                                  vmin=0.0, vmax=vmax if vmax is not None else max(hit["cells"]) or 1.0)
        parts.append(f"<figure><img src='{png_data_uri(drawn)}' alt='example {hit['example']}'>"
                     f"<figcaption>#{hit['example']} max {hit['max_activation']:.2f}</figcaption></figure>")
    return f"<div class='images'>{''.join(parts)}</div>" if parts else "<div class='stats'>no image token fires it</div>"


def _text_hits(feature: Mapping[str, Any]) -> str:
    lines = []
    for hit in feature.get("top_text", []):
        tokens = [html.escape(str(t)) for t in hit["context"]]
        tokens[hit["focus"]] = f"<mark>{tokens[hit['focus']]}</mark>"
        lines.append(f"<div class='ctx'>{hit['activation']:.2f} · #{hit['example']} pos {hit['position']}: "
                     f"{' '.join(tokens)}</div>")
    return "".join(lines) or "<div class='stats'>no text token fires it</div>"


def feature_card(feature: Mapping[str, Any], images: Mapping[int, Image.Image]) -> str:
    head = (f"<h2>feature {feature['feature']}</h2><div class='stats'>fires on {100 * feature['frequency']:.2f}% "
            f"of tokens (image {100 * feature['image_frequency']:.2f}%, text {100 * feature['text_frequency']:.2f}%)</div>")
    tokens = ""
    if feature.get("promoted"):
        tokens = ("<div class='stats'>promotes (W_dec · W_U)</div>" + _tokens(feature["promoted"])
                  + "<div class='stats'>suppresses</div>" + _tokens(feature["suppressed"], "tokens neg"))
    return (f"<section class='feature' id='f{feature['feature']}'>{head}{tokens}"
            f"<div class='stats'>top images (activation over the image patches)</div>{_image_hits(feature, images, None)}"
            f"<div class='stats'>top text positions</div>{_text_hits(feature)}</section>")


def dashboard_html(features: Sequence[Mapping[str, Any]], images: Mapping[int, Image.Image], title: str,
                   description: str = "") -> str:
    """The whole page."""
    index = " ".join(f"<a href='#f{f['feature']}'>{f['feature']}</a>" for f in features)
    cards = "".join(feature_card(f, images) for f in features)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>"
            f"<div class='meta'>{html.escape(description)}</div><div class='meta'>features: {index}</div>"
            f"{cards}</body></html>")


def write_dashboard(path: str | Path, features: Sequence[Mapping[str, Any]], images: Mapping[int, Image.Image],
                    title: str, description: str = "") -> Path:
    path = Path(path)
    path.write_text(dashboard_html(features, images, title, description), encoding="utf-8")
    return path
