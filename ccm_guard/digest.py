"""SHA-256 and SHA-1 for what ccm-guard hashes on every run, without loading OpenSSL.

Importing `hashlib` loads OpenSSL's libcrypto: about 2.5 ms at every start here, for
inputs that are mostly a few hundred bytes (a path, a config file, a ref). The
interpreter's own implementations need nothing loaded and are as quick for those; OpenSSL's
is several times faster per byte, so inputs past SMALL still go to it.
"""

from __future__ import annotations

import functools
import importlib
import sys
from typing import Any, Callable

# Past this OpenSSL's speed pays for loading it (about 2.5 ms; the interpreter's SHA-256
# does ~350 MB/s here, OpenSSL's ~2 GB/s): a 1k-file repository's index (~100 KB, hashed
# by both snapshots) stays in the interpreter.
SMALL = 1 << 19
TINY = 1 << 12  # below a page, the interpreter's own is as quick as OpenSSL's even when loaded


@functools.lru_cache(maxsize=None)  # asked once per name: a snapshot hashes thousands of refs
def _builtin(name: str) -> Callable[..., Any] | None:
    for module in (f"_{name}", "_sha2"):  # CPython 3.11 has _sha1 and _sha256; 3.12 moved SHA-256 to _sha2
        try:
            constructor = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
        return constructor  # type: ignore[no-any-return]
    return None


def hasher(name: str, size: int) -> Any:
    """A fresh hash object, "sha1" or "sha256", for about `size` bytes: OpenSSL's past
    SMALL, or past a page once it is loaded anyway (a warm server loads it once for all)."""
    loaded = "hashlib" in sys.modules
    constructor = _builtin(name) if size <= (TINY if loaded else SMALL) else None
    if constructor is None:
        import hashlib

        return hashlib.new(name)
    return constructor()


def sha256_hex(data: bytes) -> str:
    h = hasher("sha256", len(data))
    h.update(data)
    return str(h.hexdigest())
