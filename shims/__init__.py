"""The git shim, shipped inside the wheel as ccm_guard.shims (package data)."""
