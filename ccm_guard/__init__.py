"""ccm-guard: run AI coding agents on a real git repository without trusting them."""

__version__ = "0.1.0"
