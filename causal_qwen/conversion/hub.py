"""Hub ids: fail at once, in one line, when a model named by its Hugging Face hub id can be neither found in
the local cache nor reached (instead of retrying for a minute and ending in an ``OSError`` traceback)."""

from __future__ import annotations

import functools
import logging

logger = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 10.0
ALTERNATIVES = "pass a local folder or a .gguf file instead (or a preset such as random:tiny)"


def looks_like_hub_id(name: str) -> bool:
    """``owner/name`` (one slash, no leading ``.``, ``/`` or ``~``)."""
    return not name.startswith((".", "/", "~")) and name.count("/") == 1 and all(name.split("/"))


@functools.lru_cache(maxsize=None)
def check_hub_id(name: str) -> None:
    """Return when ``name``'s config is in the local cache or the hub answers for it; else ``ValueError`` in
    one line saying why and what to pass instead. Checked once per process and name."""
    from huggingface_hub import constants, try_to_load_from_cache

    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return
    if constants.HF_HUB_OFFLINE:
        raise ValueError(f"model {name!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set; "
                         f"{ALTERNATIVES}")
    _probe(name)


def _probe(name: str) -> None:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        HfApi().model_info(name, timeout=PROBE_TIMEOUT_S)
    except GatedRepoError as error:
        raise ValueError(f"model {name!r} is gated on the Hugging Face hub: accept its terms and log in "
                         f"(hf auth login), or {ALTERNATIVES}") from error
    except RepositoryNotFoundError as error:
        raise ValueError(f"no model {name!r} on the Hugging Face hub (nor a local folder, .gguf file or preset "
                         "of that name)") from error
    except Exception as error:  # connection refused, no DNS, timeout, proxy, HTTP errors
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ValueError(f"cannot reach the Hugging Face hub for {name!r} ({reason}); {ALTERNATIVES}") from error
