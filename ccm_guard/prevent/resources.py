"""Files shipped beside the code: the hook template and the git shim.

They live at the top of the source tree (hooks/, shims/) and the wheel maps them into the
package (ccm_guard/hooks, ccm_guard/shims). Tests may import ccm_guard from a source
checkout while an installed copy is also present, so both layouts are looked up.
"""

from __future__ import annotations

from pathlib import Path

from ccm_guard.errors import StateError


def data_file(directory: str, name: str) -> Path:
    here = Path(__file__).resolve().parent.parent  # the ccm_guard package
    for candidate in (here / directory / name, here.parent / directory / name):
        if candidate.is_file():
            return candidate
    raise StateError(f"{directory}/{name} is missing from the ccm-guard installation: reinstall ccm-guard")
