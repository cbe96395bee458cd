"""Synthetic data for counting-circuit analysis: SynDot, SynPoly, SynReal-lite,
controlled pairs, task suites and imagefolder I/O.

    img, rec = render_syndot(count=3, seed=0, size=224)
    pair = make_pair(n_clean=3, n_corrupt=5, seed=0, style="syndot")
    img, rec = make_task_sample("spatial", seed=0, style="synpoly")
    write_imagefolder([(img, rec)], "out/")  ;  records = read_imagefolder("out/")
"""

from vlens.data.generators import render_syndot, render_synpoly, render_synreal
from vlens.data.imagefolder import ImageRecord, read_imagefolder, record_image, write_imagefolder
from vlens.data.layout import LayoutError
from vlens.data.pairs import PAIR_KINDS, Pair, make_pair
from vlens.data.palette import COLOR_PALETTE, OBJECT_COLORS, REAL_SHAPES, SHAPES, plural
from vlens.data.styles import STYLES
from vlens.data.tasks import make_task_sample, task_templates
from vlens.data.templates import PUNCTUATION, TASKS, TEMPLATES, all_template_words
from vlens.data.video import VideoPair, make_video_pair, video_array

__all__ = [
    "COLOR_PALETTE",
    "OBJECT_COLORS",
    "PAIR_KINDS",
    "PUNCTUATION",
    "REAL_SHAPES",
    "SHAPES",
    "STYLES",
    "TASKS",
    "TEMPLATES",
    "ImageRecord",
    "LayoutError",
    "Pair",
    "VideoPair",
    "all_template_words",
    "make_pair",
    "make_task_sample",
    "make_video_pair",
    "plural",
    "read_imagefolder",
    "record_image",
    "render_syndot",
    "render_synpoly",
    "render_synreal",
    "task_templates",
    "video_array",
    "write_imagefolder",
]
