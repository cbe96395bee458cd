"""`VerificationResult`: what `vlens verify` found, and its row of the verified-models table.

The row (`VerificationResult.row()`, written as ``verified.json``) is the verified-models format,
one flat JSON object (docs/verified-models.md):

    model, architecture, family, dtype, device, transformers, torch, vlens, date,
    logits_max_abs, logits_max_rel, top1_agreement, generate_identical, hooks_checked,
    time_ratio, memory_ratio, video_checked, skipped, passed, failed
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from vlens.utils.results import Result, own_fields
from vlens.viz.optional import require_plotly

ROW_FILE = "verified.json"
ROW_KEYS = ("model", "architecture", "family", "dtype", "device", "transformers", "torch", "vlens", "date",
            "logits_max_abs", "logits_max_rel", "top1_agreement", "generate_identical", "hooks_checked",
            "time_ratio", "memory_ratio", "video_checked", "skipped", "passed", "failed")


@dataclass
class CheckRecord:
    """One check on one case: status "pass" / "fail" / "skip", its figures, and a line saying why."""

    check: str
    case: str
    status: str
    figures: dict[str, Any] = field(default_factory=dict)
    detail: str = ""


@dataclass
class VerificationResult(Result):
    """model: the spec verified; checks: every `CheckRecord`; tolerances: the dtype's (see `TOLERANCES`)."""

    kind: ClassVar[str] = "verification"

    model: str
    architecture: str
    family: str
    dtype: str
    device: str
    versions: dict[str, str]
    date: str
    tolerances: dict[str, float]
    checks: list[CheckRecord]

    @property
    def passed(self) -> bool:
        return not self.failed_checks()

    def failed_checks(self) -> list[str]:
        """The names of the failed checks ("logits/one_image", "load", ...), in order."""
        return [f"{c.check}/{c.case}" if c.case else c.check for c in self.checks if c.status == "fail"]

    def to_dict(self) -> dict:
        return {"model": self.model, "architecture": self.architecture, "family": self.family, "dtype": self.dtype,
                "device": self.device, "versions": self.versions, "date": self.date, "tolerances": self.tolerances,
                "checks": [asdict(c) for c in self.checks], "passed": self.passed, "row": self.row()}

    @classmethod
    def from_dict(cls, data: dict) -> VerificationResult:
        fields = own_fields(cls, data)
        fields["checks"] = [CheckRecord(**c) for c in data.get("checks", [])]
        return cls(**fields)

    def _figures(self, check: str) -> list[dict]:
        return [c.figures for c in self.checks if c.check == check and c.status != "skip"]

    def row(self) -> dict[str, Any]:
        """The verified-models row (see the module doc): the worst figure over the cases."""
        logits = self._figures("logits")
        generation = [c for c in self.checks if c.check == "generate" and c.status != "skip"]
        hooks = self._figures("hooks")
        cost = self._figures("cost")
        video = [c for c in self.checks if c.case == "video"]
        return {
            "model": self.model, "architecture": self.architecture, "family": self.family, "dtype": self.dtype,
            "device": self.device, "transformers": self.versions.get("transformers", ""),
            "torch": self.versions.get("torch", ""), "vlens": self.versions.get("vlens", ""), "date": self.date,
            "logits_max_abs": max((f["max_abs"] for f in logits), default=None),
            "logits_max_rel": max((f["max_rel"] for f in logits), default=None),
            "top1_agreement": min((f["top1_agreement"] for f in logits), default=None),
            "generate_identical": all(bool(c.figures.get("identical")) for c in generation) if generation else None,
            "hooks_checked": sum(int(f.get("checked", 0)) for f in hooks) if hooks else None,
            "time_ratio": cost[0].get("time_ratio") if cost else None,
            "memory_ratio": cost[0].get("memory_ratio") if cost else None,
            # the video case ran (its checks count in passed / failed); None where it was not asked for
            "video_checked": (any(c.status != "skip" for c in video) if video else None),
            "skipped": {c.case if c.check == "inputs" else f"{c.check}/{c.case}": c.detail
                        for c in self.checks if c.status == "skip" and c.case},
            "passed": self.passed, "failed": self.failed_checks(),
        }

    def table_rows(self) -> list[list[str]]:
        """[check, case, status, figures, detail] per check, for the printed table."""
        def show(value: Any) -> str:
            return f"{value:.3g}" if isinstance(value, float) else str(value)

        return [[c.check, c.case or "-", c.status.upper(), ", ".join(f"{k}={show(v)}" for k, v in c.figures.items()),
                 c.detail] for c in self.checks]

    def plot(self) -> Any:
        """A plotly table of the checks."""
        go = require_plotly()
        rows = self.table_rows()
        columns = [[row[i] for row in rows] for i in range(5)]
        figure = go.Figure(go.Table(header={"values": ["check", "case", "status", "figures", "detail"]},
                                    cells={"values": columns, "align": "left"}))
        figure.update_layout(title=f"vlens verify {self.model} ({self.dtype}, {self.device}): "
                                   f"{'PASSED' if self.passed else 'FAILED ' + ', '.join(self.failed_checks())}")
        return figure

    def save(self, path: str | Path) -> Path:
        """results.json, and the verified-models row as verified.json beside it when `path` is a folder."""
        written = super().save(path)
        if Path(path).suffix != ".json":
            (written.parent / ROW_FILE).write_text(json.dumps(self.row(), indent=1) + "\n", encoding="utf-8")
        return written
