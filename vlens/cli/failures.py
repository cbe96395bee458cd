"""The command line's failure boundary: every exception becomes one line and an exit status.

    vlens COMMAND: error: <what> (<file>): <how to fix>        exit 2: the input or the machine
    vlens COMMAND: error: internal error (a bug in vlens) ...   exit 1: anything else

`explain(error)` decides which. A failure the user can cause or fix is status 2:

| exception | said as |
|---|---|
| `UserInputError` (and vlens's own `ValueError`s) | its message |
| `OSError`: missing file, permission denied, a folder where a file is meant, a symbolic-link loop, a full disk, a read-only file system, too many open files, network errors | the reason, the path and what to do, by errno |
| `MemoryError`, torch's `OutOfMemoryError` | out of memory, and which flags make the run smaller |
| safetensors' `SafetensorError`, jinja2's `TemplateError`, JSON / UTF-8 decoding errors, the Hub's errors | what failed and how to get a good file |
| `ImportError` | the missing package (vlens's messages name the extra to install) |
| any `ValueError`, `RuntimeError`, `KeyError`, ... raised by a library (transformers, accelerate, tokenizers, ...) inside `vlens.utils.errors.failure_context` (loading a model, its processor, a dataset) | what was being done, the library's message, how to fix it |
| any other `ValueError` | its message and the library that raised it |

Everything else (a `TypeError`, `KeyError`, `RuntimeError`, ... raised outside such a context,
or by vlens itself) is a bug: one line naming the exception and where vlens raised it, status 1.
`-v` prints the traceback before the line; without it no traceback is ever printed.
"""

from __future__ import annotations

import errno
import json
from dataclasses import dataclass
from types import TracebackType

from vlens.utils.errors import UserInputError, error_context

USER_STATUS, BUG_STATUS, INTERRUPTED_STATUS = 2, 1, 130
MAX_MESSAGE = 600  # characters of a library's message kept on the one line
BUG_ADVICE = ("run the command again with -v to see the traceback, and report it (with that traceback and the "
              "command) in the vlens repository's issue tracker")

# errno -> how to fix it
_ERRNO_FIXES = {
    errno.ENOENT: "check the path (it does not exist)",
    errno.EACCES: "this user may not read or write it: fix its permissions (ls -l, chmod) or choose another path",
    errno.EPERM: "this user may not read or write it: fix its permissions (ls -l, chmod) or choose another path",
    errno.EISDIR: "it is a folder: give the path of a file",
    errno.ENOTDIR: "a part of the path is a file, not a folder: check the path",
    errno.ELOOP: "a symbolic link points back to itself (directly or through other links): fix or remove the link",
    errno.ENOSPC: "the disk is full: free some space, or write --out to another disk",
    errno.EDQUOT: "the disk quota is used up: free some space, or write --out to another disk",
    errno.EROFS: "the file system is read-only: choose another --out on a writable disk",
    errno.ENAMETOOLONG: "the path is too long: choose a shorter one",
    errno.EMFILE: "too many open files: raise the limit (ulimit -n) or use fewer files",
    errno.ENFILE: "too many open files on the machine: close other programs or raise the limit",
    errno.EIO: "the disk or network file system failed to read or write: check the device",
    errno.ENOMEM: "the machine is out of memory: use a smaller --batch-size / --image-size / --max-pixels or model",
    errno.EEXIST: "it already exists: remove it, choose another path or pass --overwrite",
    errno.ENOTEMPTY: "the folder is not empty: choose another path or pass --overwrite",
    errno.EXDEV: "the path crosses file systems: write --out on the same disk",
}
_MEMORY_FIX = ("use a smaller --batch-size, --image-size or --max-pixels, a smaller model or --dtype bfloat16, "
               "or a machine with more memory")
_NETWORK_FIX = ("check the network; without one, download the model where there is one (hf download ORG/NAME "
                "--local-dir DIR), copy it here and pass --model DIR")


@dataclass(frozen=True)
class Failure:
    status: int
    message: str  # one line


def explain(error: BaseException) -> Failure:
    """The exit status and the one line that `error` is reported as (see the module doc)."""
    if isinstance(error, KeyboardInterrupt):
        return Failure(INTERRUPTED_STATUS, "interrupted")
    if isinstance(error, UserInputError):
        return Failure(USER_STATUS, _flat(str(error)) or type(error).__name__)
    context = error_context(error)
    origin = raised_in(error.__traceback__)
    if isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError" or (
            isinstance(error, RuntimeError) and "out of memory" in str(error).lower()):  # "CUDA error: out of memory"
        return _user(context, f"out of memory ({_library_text(error)})", _MEMORY_FIX)
    if isinstance(error, OSError):
        return _os_error(error, context)
    special = _library_error(error)
    if special is not None:
        what, fix = special
        return _user(context, what, fix)
    if isinstance(error, ImportError):
        name = getattr(error, "name", None)
        fix = "" if "pip install" in str(error) else f"install the missing package (pip install {name or '...'})"
        return _user(context, _library_text(error), fix)
    third_party = origin is not None and not origin.startswith("vlens")
    if context is not None and (third_party or isinstance(error, ValueError)):
        return _user(context, _library_text(error, origin if third_party else None), "")
    if isinstance(error, ValueError):
        return Failure(USER_STATUS, _library_text(error, origin if third_party else None))
    return Failure(BUG_STATUS, bug_line(error))


def bug_line(error: BaseException) -> str:
    """'internal error (a bug in vlens): TypeError: ... (at vlens/x.py:12); run ... -v ...'."""
    where = vlens_frame(error.__traceback__)
    at = f" (at {where})" if where else ""
    return _flat(f"internal error (a bug in vlens): {type(error).__name__}: {_short(str(error))}{at}; {BUG_ADVICE}")


def raised_in(tb: TracebackType | None) -> str | None:
    """The module (``__name__``) of the innermost Python frame of a traceback."""
    name = None
    while tb is not None:
        name = tb.tb_frame.f_globals.get("__name__", name)
        tb = tb.tb_next
    return name


def vlens_frame(tb: TracebackType | None) -> str | None:
    """'vlens/core/model.py:123' for the innermost frame inside vlens (None when there is none)."""
    found = None
    while tb is not None:
        module = tb.tb_frame.f_globals.get("__name__", "")
        if module == "vlens" or module.startswith("vlens."):
            filename = tb.tb_frame.f_code.co_filename
            index = filename.rfind("vlens/")
            found = f"{filename[index:] if index >= 0 else filename}:{tb.tb_lineno}"
        tb = tb.tb_next
    return found


def _os_error(error: OSError, context: tuple[str, str] | None) -> Failure:
    code = error.errno
    if code is None and isinstance(error, FileNotFoundError):
        code = errno.ENOENT
    fix = _ERRNO_FIXES.get(code or -1, "")
    if isinstance(error, (ConnectionError, TimeoutError)) or _module_of(error).startswith(("requests", "urllib3")):
        fix = _NETWORK_FIX
    if error.strerror and error.filename is not None:
        paths = str(error.filename) + (f" -> {error.filename2}" if error.filename2 is not None else "")
        what = f"{error.strerror} ({paths})"
    else:  # vlens's own messages already name the path
        what = _short(str(error)) or (error.strerror or type(error).__name__)
        if code in (errno.ENOENT, errno.EEXIST, errno.ENOTDIR) and error.strerror is None:
            fix = ""  # vlens's own FileNotFoundError / FileExistsError messages say what to do
    return _user(context, what, fix)


def _library_error(error: BaseException) -> tuple[str, str] | None:
    """(what, fix) for the libraries' own error types that always mean a bad file or setting."""
    module, name = _module_of(error), type(error).__name__
    text = _short(str(error))
    if name == "SafetensorError" or module.startswith("safetensors"):
        return (f"not a valid safetensors weights file ({text})",
                "the file is truncated or corrupt: download or save the checkpoint again")
    if module.startswith("jinja2"):
        return (f"the chat template cannot be used ({name}: {text})",
                "fix the template (chat_template.jinja, or chat_template in tokenizer_config.json)")
    if module.startswith(("huggingface_hub", "httpx", "requests", "urllib3")):
        return f"the Hugging Face Hub could not be reached or used ({name}: {text})", _NETWORK_FIX
    if isinstance(error, json.JSONDecodeError):
        return f"not valid JSON ({text})", "fix the file (a JSON validator names the line)"
    if isinstance(error, UnicodeDecodeError):
        return f"not UTF-8 text ({text})", "save the file as UTF-8"
    if isinstance(error, RecursionError):
        return f"the input is nested too deeply ({text})", "simplify the file"
    return None


def _user(context: tuple[str, str] | None, what: str, fix: str) -> Failure:
    if context is not None:
        doing, context_fix = context
        what = f"{doing}: {what}"
        fix = fix or context_fix
    return Failure(USER_STATUS, _flat(f"{what}: {fix}" if fix else what))


def _library_text(error: BaseException, origin: str | None = None) -> str:
    text = _short(str(error)) or type(error).__name__
    if origin is not None:
        return f"{text} ({type(error).__name__} from {origin.split('.')[0]})"
    return text


def _module_of(error: BaseException) -> str:
    return type(error).__module__ or ""


def _short(text: str) -> str:
    text = _flat(text)
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


def _flat(text: str) -> str:
    return " ".join(text.split())


__all__ = ["BUG_STATUS", "INTERRUPTED_STATUS", "USER_STATUS", "Failure", "bug_line", "explain", "raised_in",
           "vlens_frame"]
