"""How big each stage of `vlens demo` is: the full run and the `--quick` one (<= 5 min on 2 cores)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from vlens.utils.errors import UserInputError
from vlens.zoo.image_sizes import render_size


@dataclass
class DemoSettings:
    """Sizes and seeds of every stage.

    Attributes:
        n_count_images: counting images for the attention, logit lens and geometry stages
            (cycled over `counts`, so each count gets the same number).
        subitizing_per_count: images per count in the counting evaluation (the subitizing test),
            for each style in `subitizing_styles` (`style` first); the report states the smallest
            accuracy gap this many images detect with 80% power.
        counts: the ground-truth counts drawn.
        style: data style of the counting images and pairs ("syndot", "synpoly", "synreal").
        image_size: image side in pixels; None: the square size the model pins (`run_demo` sets it from the loaded
            model: the embedded model's own size; 168 px for a processor with dynamic resolution), and
            `image_side` the embedded model's size where no model is known yet.
        n_pairs: controlled clean/corrupt pairs for visual activation patching.
        lens_samples, lens_steps: task-suite samples and Adam steps for the HeadLens translators
            (used only when no trained lens ships with the model).
        headlens_samples: task-suite samples the heads are scored on.
        ablation_tasks, ablation_examples, ablation_top_k: the cross-task ablation study.
        circuit_pairs, circuit_ig_steps, circuit_target: the counting circuit (EAP-IG scores, the
            smallest circuit whose exact faithfulness reaches the target).
        graph_prompts, graph_tokens, graph_d_tc, graph_k, graph_max_features, graph_count: the attribution graph
            (skip TopK transcoders trained on the first `graph_prompts` counting images for `graph_tokens` tokens,
            `graph_d_tc` features per layer, `graph_k` active; at most `graph_max_features` features attributed; the
            graph's image: the first one of `graph_count` dots the model answers correctly, else of any count).
        max_new_tokens: generation length for the counting evaluation.
        batch_size: examples per forward pass.
        seed: base seed of every generated example.
    """

    n_count_images: int = 150
    subitizing_per_count: int = 40
    subitizing_styles: tuple[str, ...] = ("syndot", "synpoly")  # SynPoly: where the paper's degradation is
    counts: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10)  # the embedded model was trained on 1-10
    style: str = "syndot"
    image_size: int | None = None
    n_pairs: int = 64
    lens_samples: int = 200
    lens_steps: int = 300
    headlens_samples: int = 120
    ablation_tasks: tuple[str, ...] = ("counting", "colour", "shape", "spatial", "arithmetic", "existence")
    ablation_examples: int = 64
    ablation_top_k: int = 8
    circuit_pairs: int = 32
    circuit_ig_steps: int = 5
    circuit_target: float = 0.8
    graph_prompts: int = 96
    graph_tokens: int = 262_144
    graph_count: int = 4
    graph_d_tc: int = 256
    graph_k: int = 8
    graph_max_features: int = 512
    max_new_tokens: int = 6
    batch_size: int = 16
    seed: int = 0
    extra: dict = field(default_factory=dict)

    @classmethod
    def quick(cls) -> DemoSettings:
        """Small enough for well under 5 minutes on 2 CPU cores (stages of 40-48 s of CPU with the embedded model)."""
        return cls(
            n_count_images=100,
            subitizing_per_count=20,
            n_pairs=32,
            lens_samples=64,
            lens_steps=100,
            headlens_samples=64,
            ablation_tasks=("counting", "colour", "shape", "spatial", "arithmetic"),
            ablation_examples=24,
            ablation_top_k=6,
            circuit_pairs=12,
            circuit_ig_steps=3,
            graph_prompts=48,
            graph_tokens=65_536,
            graph_max_features=256,
        )

    def check(self) -> None:
        for name in ("n_count_images", "subitizing_per_count", "n_pairs", "lens_samples", "headlens_samples", "ablation_examples",
                     "ablation_top_k", "max_new_tokens", "batch_size", "image_size", "circuit_pairs",
                     "circuit_ig_steps", "graph_prompts", "graph_tokens", "graph_d_tc", "graph_k", "graph_max_features"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise UserInputError(f"DemoSettings.{name} must be >= 1, got {getattr(self, name)}")
        if not self.counts or min(self.counts) < 0:
            raise UserInputError(f"DemoSettings.counts must be non-negative counts, got {self.counts}")
        if not 0 < self.circuit_target <= 1:
            raise UserInputError(f"DemoSettings.circuit_target must be in (0, 1], got {self.circuit_target}")
        if self.graph_k > self.graph_d_tc:
            raise UserInputError(f"DemoSettings.graph_k ({self.graph_k}) must be at most graph_d_tc ({self.graph_d_tc})")
        if len(self.ablation_tasks) < 2:
            raise UserInputError("the ablation Jaccard needs at least two tasks in DemoSettings.ablation_tasks")

    @property
    def image_side(self) -> int:
        """`image_size`, or the embedded model's own size where it is None."""
        return render_size(image_size=self.image_size)

    def for_model(self, model) -> DemoSettings:
        """These settings with `image_size` set: as given, else the square size `model` pins, else 168 px."""
        return replace(self, image_size=render_size(model, self.image_size))

    def counting_styles(self) -> list[str]:
        """The styles of the counting evaluation: `style` first, then the other `subitizing_styles`."""
        return [self.style] + [s for s in self.subitizing_styles if s != self.style]

    def to_dict(self) -> dict:
        data = asdict(self)
        data["counts"] = list(self.counts)
        data["ablation_tasks"] = list(self.ablation_tasks)
        data["subitizing_styles"] = list(self.subitizing_styles)
        return data
