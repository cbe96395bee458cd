"""Stage 1 (data): the counting images every later stage reads, and a montage of examples."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from PIL import Image, ImageDraw

from vlens.data import render_syndot, render_synpoly, render_synreal
from vlens.demo.report_sections import Section
from vlens.demo.settings import DemoSettings
from vlens.utils.errors import UserInputError


@dataclass
class CountingSample:
    """One generated counting image with its question and true count."""

    image: Image.Image
    question: str
    count: int
    record: dict

    @property
    def answer(self) -> str:
        return str(self.record.get("answer", self.count))


def counting_samples(settings: DemoSettings, style: str | None = None, n: int | None = None) -> list[CountingSample]:
    """`n` images (default `settings.n_count_images`) of `style` (default `settings.style`), counts
    cycling over `settings.counts` (equal numbers each); the same seeds for every `n`, so a
    longer list starts with the shorter one."""
    renderers: dict[str, Callable[..., tuple[Image.Image, dict]]] = {"syndot": render_syndot, "synpoly": render_synpoly, "synreal": render_synreal}
    style = style or settings.style
    if style not in renderers:
        raise UserInputError(f"unknown style {style!r}: use one of {sorted(renderers)}")
    render = renderers[style]
    samples = []
    for i in range(settings.n_count_images if n is None else n):
        count = settings.counts[i % len(settings.counts)]
        image, record = render(count=count, seed=settings.seed + i, size=settings.image_side)
        samples.append(CountingSample(image, record["question"], int(record["count"]), record))
    return samples


def montage(samples: list[CountingSample], n: int = 8, tile: int = 112) -> Image.Image:
    """The first `n` images side by side, each captioned with its true count."""
    chosen = samples[:n]
    caption, gap = 16, 4
    canvas = Image.new("RGB", (len(chosen) * (tile + gap) + gap, tile + caption + 2 * gap), "white")
    draw = ImageDraw.Draw(canvas)
    for i, sample in enumerate(chosen):
        left = gap + i * (tile + gap)
        draw.text((left + 2, gap), f"count {sample.count}", fill="black")
        canvas.paste(sample.image.convert("RGB").resize((tile, tile)), (left, gap + caption))
    return canvas


def data_section(samples: list[CountingSample], settings: DemoSettings) -> Section:
    per_count = {c: sum(s.count == c for s in samples) for c in sorted({s.count for s in samples})}
    return Section(
        key="data",
        title="Data: generated counting images",
        explanation=(f"{len(samples)} {settings.style} images at {settings.image_side}px, counts "
                     f"{min(per_count)}-{max(per_count)} in equal numbers; the first few are shown with their true count."),
        image=montage(samples),
        numbers={"images": len(samples), "style": settings.style, "image size": settings.image_side,
                 "distinct counts": len(per_count)},
        data={"images_per_count": per_count, "questions": sorted({s.question for s in samples})},
    )
