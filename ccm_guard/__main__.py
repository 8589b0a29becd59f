from ccm_guard.cli import run

run()
