"""Whether a hub id can be loaded: the Hugging Face Hub reachable within seconds, or the model cached.

Without a network, transformers retries the hub for most of a minute before it fails with a
traceback. `check_hub_reachable` answers in seconds (one TCP connection to ``HF_ENDPOINT``, the
name lookup included, in a thread with a timeout) and, when neither the hub nor the local cache
has the model, raises one line saying how to download it. Only the standard library and
`huggingface_hub` are imported (a failing `vlens` command stays fast).
"""

from __future__ import annotations

import logging
import socket
import threading
from urllib.parse import urlparse

from vlens.utils.errors import UserInputError

logger = logging.getLogger(__name__)

HUB_TIMEOUT_S = 5.0  # how long reaching the hub may take before a hub id is said to be unreachable
DOWNLOAD_HINT = ("download it where there is a network (hf download {repo} --local-dir DIR), copy DIR here and "
                 "pass that folder, or set HF_HUB_OFFLINE=1 to use a copy already in the Hugging Face cache")


class HubUnreachableError(UserInputError):
    """A hub id was given but the hub cannot be reached and the model is not in the local cache."""


def check_hub_reachable(repo_id: str, timeout: float = HUB_TIMEOUT_S) -> bool:
    """Before a hub id is loaded: True when it must be read from the local cache only (the hub cannot
    be reached, or HF_HUB_OFFLINE is set, and the cache holds its config); False when the hub answers.
    Raises `HubUnreachableError` when neither, within about `timeout` seconds (HF's own retries would
    take most of a minute), saying how to download the model."""
    from huggingface_hub import constants, try_to_load_from_cache

    cached = isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    if constants.HF_HUB_OFFLINE:
        if cached:
            return True
        raise HubUnreachableError(f"model {repo_id!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is "
                                  f"set: {DOWNLOAD_HINT.format(repo=repo_id)}")
    endpoint = constants.ENDPOINT
    reason = _unreachable(endpoint, timeout)
    if reason is None:
        return False
    if cached:
        logger.warning("the Hugging Face Hub (%s) cannot be reached (%s); using the cached copy of %s", endpoint,
                       reason, repo_id)
        return True
    raise HubUnreachableError(f"model {repo_id!r}: the Hugging Face Hub ({endpoint}) cannot be reached ({reason}) "
                              f"and the model is not in the local cache: {DOWNLOAD_HINT.format(repo=repo_id)}")


def _unreachable(endpoint: str, timeout: float) -> str | None:
    """Why a TCP connection to the endpoint fails within `timeout` (name lookup included), or None."""
    url = urlparse(endpoint)
    host, port = url.hostname or "", url.port or (443 if url.scheme == "https" else 80)
    outcome: list[str | None] = []

    def connect() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                outcome.append(None)
        except OSError as error:
            outcome.append(error.strerror or type(error).__name__)

    worker = threading.Thread(target=connect, daemon=True)
    worker.start()
    worker.join(timeout + 1.0)
    if not outcome:
        return f"no answer within {timeout:.0f} s"
    return outcome[0]


__all__ = ["DOWNLOAD_HINT", "HUB_TIMEOUT_S", "HubUnreachableError", "check_hub_reachable"]
