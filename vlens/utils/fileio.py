"""Writing output folders and files so that a failure never leaves a half-written or mixed result.

`atomic_folder(target)`: write a whole folder (a model, an adapter, a lens) into a hidden
temporary sibling and rename it onto `target` only when the block finishes; an exception or
a kill leaves the previous `target` exactly as it was (the temporary folder is removed on an
exception; after a kill, a hidden ``.<name>.tmp-*`` folder may remain beside it). Replacing an
existing model folder needs ``overwrite=True``; a non-empty folder that is not a model folder is
never replaced (its files are the user's).

`atomic_write_text(path, text)`: the same for one file.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from vlens.utils.validation import check_output_folder


def _sibling(target: Path, kind: str) -> Path:
    return target.parent / f".{target.name}.{kind}-{uuid.uuid4().hex[:8]}"


@contextmanager
def atomic_folder(target: str | os.PathLike, overwrite: bool = False, name: str = "out") -> Iterator[Path]:
    """Yield a temporary folder; on success it replaces `target` in one rename.

    Raises `vlens.utils.errors.UserInputError` before anything is written when `target` is a file,
    not writable, an existing model folder without `overwrite`, or a non-empty non-model folder.
    """
    target = Path(target)
    check_output_folder(target, name, overwrite=overwrite, model_folder=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = _sibling(target, "tmp")
    staging.mkdir()
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if target.exists():
        old = _sibling(target, "old")
        target.rename(old)
        try:
            staging.rename(target)
        except BaseException:
            old.rename(target)  # put the previous folder back
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        staging.rename(target)


def atomic_write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    """Write `text` to a temporary file beside `path`, then rename it onto `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = _sibling(path, "tmp")
    try:
        staging.write_text(text, encoding=encoding)
        os.replace(staging, path)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise
    return path


__all__ = ["atomic_folder", "atomic_write_text"]
