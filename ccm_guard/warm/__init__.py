"""A warm server: ccm-guard's commands without Python's start-up (client.py, server.py)."""
