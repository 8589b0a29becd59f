"""The guard hooks' entry point, by the name every installed hook imports.

Hooks written by `ccm-guard install` (hooks/hook.sh) run `from ccm_guard.hookrun import cli`,
and hooks installed by earlier versions live on in people's repositories, so this name stays
while the code lives in `ccm_guard.prevent.hookrun`.
"""

from ccm_guard.prevent.hookrun import cli

__all__ = ["cli"]
