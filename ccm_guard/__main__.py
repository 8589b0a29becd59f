"""The installed command (`ccm-guard`) and `python -m ccm_guard`: a warm server runs the
command when one serves this installation (ccm_guard.warm), else the command line does."""

import os


def main() -> None:
    from ccm_guard.warm.client import through_server

    code = through_server()
    if code is not None:
        os._exit(code)
    from ccm_guard.cli import run

    run()


if __name__ == "__main__":
    main()
