from ccm_guard.cli import main

# The same name as the installed command: in usage lines, in next steps, and in the
# variable shell completion is driven by (_CCM_GUARD_COMPLETE).
main(prog_name="ccm-guard")
