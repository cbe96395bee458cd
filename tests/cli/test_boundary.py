"""The command line's failure boundary: every failure is one line; what the user can cause or fix
exits 2, a bug exits 1 and says so, and only -v shows a traceback."""

from __future__ import annotations

import errno
import json

import pytest

from vlens.cli import main
from vlens.cli.failures import BUG_STATUS, USER_STATUS, explain
from vlens.utils.errors import UserInputError, failure_context


def _raised(error: BaseException, context: tuple[str, str] | None = None) -> BaseException:
    """`error` as raised (with a traceback), optionally inside a failure_context."""
    try:
        if context is None:
            raise error
        with failure_context(*context):
            raise error
    except BaseException as caught:  # noqa: BLE001 - handed back to the test
        return caught


def _library_error(kind: type[BaseException], message: str, module: str) -> BaseException:
    """An exception raised from inside a module named `module` (a library, as the boundary sees it)."""
    namespace = {"__name__": module, "kind": kind, "message": message}
    exec("def fail():\n    raise kind(message)", namespace)
    try:
        namespace["fail"]()
    except BaseException as caught:  # noqa: BLE001
        return caught
    raise AssertionError("unreachable")


@pytest.mark.parametrize(("error", "needles"), [
    (OSError(errno.ENOSPC, "No space left on device", "out/results.json"), ("out/results.json", "disk is full")),
    (PermissionError(errno.EACCES, "Permission denied", "data/metadata.jsonl"), ("Permission denied",
                                                                                "data/metadata.jsonl", "chmod")),
    (IsADirectoryError(errno.EISDIR, "Is a directory", "model.safetensors"), ("Is a directory", "give the path")),
    (OSError(errno.ELOOP, "Too many levels of symbolic links", "m/config.json"), ("m/config.json", "symbolic link")),
    (OSError(errno.EROFS, "Read-only file system", "/out"), ("read-only",)),
    (FileNotFoundError("data file nope does not exist"), ("nope does not exist",)),
    (MemoryError(), ("out of memory", "--batch-size")),
    (RuntimeError("CUDA error: out of memory"), ("out of memory", "--batch-size")),
    (UserInputError("--limit must be >= 1, got 0"), ("--limit must be >= 1",)),
    (ValueError("give either device or device_map"), ("give either device",)),
    (ImportError("reading parquet needs pyarrow: pip install 'vlens[data]'"), ("pip install",)),
    (json.JSONDecodeError("Expecting value", "{", 1), ("not valid JSON",)),
])
def test_user_caused_failures_exit_2_in_one_line(error, needles):
    failure = explain(_raised(error))
    assert failure.status == USER_STATUS and "\n" not in failure.message, failure
    for needle in needles:
        assert needle in failure.message, failure.message


def test_library_errors_while_loading_are_the_users():
    for kind in (RuntimeError, ValueError, KeyError, OSError):
        error = _library_error(kind, "Error(s) in loading state_dict", "transformers.modeling_utils")
        labelled = _raised(error, ("loading the model ./m", "use a complete model folder"))
        failure = explain(labelled)
        assert failure.status == USER_STATUS, (kind, failure)
        assert failure.message.startswith("loading the model ./m: ") and "use a complete model folder" in \
            failure.message or kind is OSError, failure.message


def test_safetensors_jinja_and_hub_errors_are_named():
    from jinja2 import TemplateSyntaxError
    from safetensors import SafetensorError

    assert "safetensors" in explain(_raised(SafetensorError("header too large"))).message
    assert "chat template" in explain(_raised(TemplateSyntaxError("unexpected '}'", 3))).message
    hub_error = type("LocalEntryNotFoundError", (Exception,), {"__module__": "huggingface_hub.errors"})
    message = explain(_library_error(hub_error, "connection refused", "huggingface_hub.file_download")).message
    assert "Hub" in message and "hf download" in message


def test_a_bug_exits_1_and_says_where_and_how_to_report():
    failure = explain(_raised(KeyError("blocks.3")))
    assert failure.status == BUG_STATUS and "internal error (a bug in vlens): KeyError" in failure.message
    assert "test_boundary.py" not in failure.message or "vlens/" in failure.message
    assert "-v" in failure.message and "report" in failure.message
    library_bug = _library_error(TypeError, "unsupported operand", "torch.nn.functional")
    assert explain(library_bug).status == BUG_STATUS  # outside any loading context: vlens called it wrongly


def _command_failing_with(monkeypatch, error: BaseException) -> None:
    """`vlens info` whose work raises `error` (the command's own function is replaced)."""
    import vlens.cli.info as info

    def fail(args):
        raise error
    monkeypatch.setattr(info, "run", fail, raising=False)
    real_configure = info.configure

    def configure(parser):
        real_configure(parser)
        parser.set_defaults(func=fail)
    monkeypatch.setattr(info, "configure", configure)


@pytest.mark.parametrize(("error", "status", "needle"), [
    (OSError(errno.ENOSPC, "No space left on device", "o/results.json"), 2, "disk is full"),
    (MemoryError(), 2, "out of memory"),
    (AttributeError("'NoneType' object has no attribute 'shape'"), 1, "a bug in vlens"),
    (KeyboardInterrupt(), 130, "interrupted"),
])
def test_commands_print_one_line_and_the_traceback_only_with_v(monkeypatch, capsys, error, status, needle):
    _command_failing_with(monkeypatch, error)
    assert main(["info"]) == status
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and lines[0].startswith("vlens info"), err
    if status != 130:
        assert main(["info", "-v"]) == status
        assert "Traceback" in capsys.readouterr().err


def test_a_failure_while_reading_the_arguments_is_one_line(monkeypatch, capsys):
    import vlens.cli.options as options

    def unreadable(text):  # what reading a --device-map JSON file on a failing disk raises
        raise OSError(errno.EIO, "Input/output error", text)
    monkeypatch.setattr(options, "device_map_arg", unreadable)
    assert main(["info", "--device-map", "map.json"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and "map.json" in err, err
