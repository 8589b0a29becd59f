"""The sh hook templates, shipped inside the wheel as ccm_guard.hooks (package data)."""
