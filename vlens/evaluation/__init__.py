"""Evaluation on local copies of counting and multiple-choice sets (lmms-eval conventions).

```python
import vlens
from vlens.evaluation import EvalSettings, HookedVLMBackend, evaluate, read_pixmo, write_report
data = read_pixmo("pixmo_count_test.parquet", image_dir="images/", skip_missing=True)
result = evaluate(HookedVLMBackend(model, fwd_hooks=temperature_hooks), data, EvalSettings(max_new_tokens=8),
                  options=vlens.SweepOptions(batch_size=16))
write_report(result, "out/pixmo", model_name="Qwen2.5-VL-7B + temperature")
```
"""

from vlens.evaluation.backends import GenerationBackend, HFBackend, HookedVLMBackend
from vlens.evaluation.datasets import read_countbenchqa, read_counting_imagefolder, read_mcq, read_pixmo
from vlens.evaluation.examples import EvalDataset, EvalExample, MissingImageError, SkippedExample, open_image
from vlens.evaluation.formats import FORMATS, EvalFormat, format_prompt, get_format
from vlens.evaluation.metrics import (
    ChoiceMetrics,
    CountingMetrics,
    choice_metrics,
    confusion_matrix,
    counting_metrics,
    subitizing_limit,
)
from vlens.evaluation.parsing import (
    ANSWER_PARSERS,
    NUMBER_WORDS,
    parse_choice,
    parse_count,
    parse_count_strict,
)
from vlens.evaluation.plots import plot_confusion_matrix
from vlens.evaluation.report import load_predictions, write_report
from vlens.evaluation.runner import EvalResult, EvalSettings, Prediction, evaluate, score_predictions

__all__ = [
    "ANSWER_PARSERS",
    "FORMATS",
    "NUMBER_WORDS",
    "ChoiceMetrics",
    "CountingMetrics",
    "EvalDataset",
    "EvalExample",
    "EvalFormat",
    "EvalResult",
    "EvalSettings",
    "GenerationBackend",
    "HFBackend",
    "HookedVLMBackend",
    "MissingImageError",
    "Prediction",
    "SkippedExample",
    "choice_metrics",
    "confusion_matrix",
    "subitizing_limit",
    "counting_metrics",
    "evaluate",
    "format_prompt",
    "get_format",
    "load_predictions",
    "open_image",
    "parse_choice",
    "parse_count",
    "parse_count_strict",
    "plot_confusion_matrix",
    "read_countbenchqa",
    "read_counting_imagefolder",
    "read_mcq",
    "read_pixmo",
    "score_predictions",
    "write_report",
]
