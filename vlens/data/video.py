"""Controlled video pairs for counting: objects appear one after another across the frames.

A video pair is a `make_pair` count pair played out in time: every object of the two scenes'
shared layout gets an appearance frame, and frame f shows the objects that have appeared by then
(each stays where it appeared). The clean and the corrupt video show the same objects at the same
frames except the ones that differ (``changed``): a clean video of 3 dots and a corrupt one of 4
are identical until the frame where the fourth dot appears in the corrupt one. The answer is the
count on the last frame (every object has appeared by then). Same arguments and seed -> the same
pixels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

from vlens.data.pairs import make_pair
from vlens.data.scene import render_scene, stream
from vlens.data.styles import get_style
from vlens.utils.errors import UserInputError

APPEARANCE_STREAM = 41  # the generator stream of the appearance frames (vlens.data.scene.stream)


@dataclass(frozen=True)
class VideoPair:
    """A clean / corrupt pair of videos (lists of RGB frames of one size).

    clean_record / corrupt_record: the last frame's record (as `make_pair`'s: objects with their "id",
    "count", "question", "answer"), each object with its "appears" frame, plus "frames" and "fps".
    changed: ids of the objects only one of the videos shows.
    """

    clean_frames: list[Image.Image]
    corrupt_frames: list[Image.Image]
    clean_record: dict
    corrupt_record: dict
    pair_id: str
    changed: list[int]
    fps: float
    kind: str = "count"

    def counts_per_frame(self, role: str = "clean") -> list[int]:
        """How many objects frame f shows, per frame (the last one is the answer)."""
        record = self.clean_record if role == "clean" else self.corrupt_record
        frames = int(record["frames"])
        return [sum(1 for o in record["objects"] if o["appears"] <= f) for f in range(frames)]


def make_video_pair(n_clean: int, n_corrupt: int, frames: int = 4, seed: int = 0, style: str = "syndot",
                    size: int = 112, fps: float = 2.0, pair_id: str | None = None) -> VideoPair:
    """A counting pair of `frames`-frame videos whose objects appear across the frames.

    Args:
        n_clean, n_corrupt: the objects each video ends with (they differ).
        frames: frames per video (>= 1). Object k's appearance frame is drawn uniformly from
            0 .. frames - 1, except that the first frame shows at least one object of the shared ones
            when there is any.
        seed: non-negative integer; same arguments and seed -> identical videos.
        style, size: the scene's style and square frame side in pixels (`make_pair`'s).
        fps: the frame rate recorded with the pair (what `model.prepare(..., fps=)` takes).

    Returns:
        :class:`VideoPair`; the prompt is the record's "question", the answers the final counts.
    """
    if isinstance(frames, bool) or not isinstance(frames, int) or frames < 1:
        raise UserInputError(f"frames must be a positive integer, got {frames!r}")
    if not fps > 0:
        raise UserInputError(f"fps must be positive, got {fps!r}")
    pair = make_pair(n_clean, n_corrupt, seed, style=style, size=size, kind="count",
                     pair_id=pair_id if pair_id is not None else f"{style}-video-{seed}")
    rng = stream(seed, APPEARANCE_STREAM)
    union = {o["id"]: o for o in pair.clean_record["objects"] + pair.corrupt_record["objects"]}
    ids = sorted(union)
    appears = {i: int(rng.integers(frames)) for i in ids}
    shared = [i for i in ids if i not in pair.changed]
    if shared and min(appears[i] for i in shared) > 0:
        appears[shared[0]] = 0  # the video opens on something to count
    the_style = get_style(style)
    background = pair.clean_record["background"]
    out = []
    for record in (pair.clean_record, pair.corrupt_record):
        objects = [{k: v for k, v in o.items() if k not in ("bbox", "mask")} for o in record["objects"]]
        videos = []
        for f in range(frames):
            image, _ = render_scene(the_style, [o for o in objects if appears[o["id"]] <= f], size, background, seed)
            videos.append(image)
        new_record = {**record, "frames": frames, "fps": float(fps),
                      "objects": [{**o, "appears": appears[o["id"]]} for o in record["objects"]]}
        out.append((videos, new_record))
    (clean_frames, clean_record), (corrupt_frames, corrupt_record) = out
    return VideoPair(clean_frames, corrupt_frames, clean_record, corrupt_record, pair.pair_id, list(pair.changed),
                     float(fps))


def video_array(frames: list[Image.Image]) -> np.ndarray:
    """[T, H, W, 3] uint8: the frames stacked (the array form `model.prepare(videos=...)` also takes)."""
    return np.stack([np.asarray(frame.convert("RGB")) for frame in frames])
