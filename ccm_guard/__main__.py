from ccm_guard.cli import main

main()
