#!/bin/sh
# A git hook written by `ccm-guard install`; `ccm-guard uninstall` removes it.
# ccm-guard hook id: e82188c1dd1a8eae
#
# It runs the hook it replaced (LEGACY) first, then asks ccm-guard whether the
# operation is allowed for the task this worktree belongs to.  Prevention only:
# an agent can always run git without hooks; the snapshots taken on the host
# after the run are the authority.  Only shell builtins run until Python is
# needed, and Python only where there is something to decide.

# --- ccm-guard values: begin (written by install, shell-quoted; do not edit) ---
HOOK=pre-commit
PY=python3
PYPATH=
SETTINGS=
TASKS=
LEGACY=
CHECK=1
# --- ccm-guard values: end ---
#
# HOOK      the git hook this file is (never taken from $0: tools rename hooks)
# PY        the resolved interpreter (a pyenv shim would add ~80 ms per hook)
# PYPATH    ':'-separated directories holding ccm_guard and its dependencies
# SETTINGS  the task's settings file (install for one worktree), or empty and
# TASKS     a directory holding <admin dir name>/settings for each task
#           worktree (install for a whole repository)
# LEGACY    the hook this one chains: absolute, or relative to the worktree
#           top (a relative core.hooksPath); empty for none
# CHECK     0: nothing for ccm-guard to decide in this hook, only chain

nl='
'

# from_chaining_hook: true when this hook was started by the ccm-guard hook
# named last in CCM_GUARD_HOOK_CHAIN, not by git.  An agent can set the variable
# itself (CCM_GUARD_HOOK_CHAIN=pre-commit:x git commit) to pass for a chained
# hook and skip the check, so the variable counts only when our parent process
# is a shell running that hook (git never is one).  Without /proc, trust it.
from_chaining_hook() {
	[ -d /proc/$$ ] || return 0
	[ /proc/$PPID/exe -ef /proc/$$/exe ] || return 1
	# dash's read drops the NULs between the arguments: "/bin/sh/path/hookargs".
	IFS= read -r _parent </proc/$PPID/cmdline || [ -n "${_parent-}" ] || return 1
	case $_parent in *"${CCM_GUARD_HOOK_CHAIN##*:}"*) return 0 ;; esac
	return 1
}

# CCM_GUARD_HOOK_CHAIN is "<hook>:<file>:<file>..." while ccm-guard hooks chain
# one another (installed for a worktree and for the repository, or a copy kept
# as legacy): the first one runs the check, the others only chain, and a file
# seen before means a loop.
chained=
case ${CCM_GUARD_HOOK_CHAIN-} in
"$HOOK:"*)
	if from_chaining_hook; then
		case $CCM_GUARD_HOOK_CHAIN: in *":$0:"*) exit 0 ;; esac
		chained=1
	else
		CCM_GUARD_HOOK_CHAIN=$HOOK
	fi
	;;
*) CCM_GUARD_HOOK_CHAIN=$HOOK ;;
esac
CCM_GUARD_HOOK_CHAIN=$CCM_GUARD_HOOK_CHAIN:$0

case $LEGACY in '' | /*) ;; *) LEGACY=$PWD/$LEGACY ;; esac
# Only a runnable file, and never this file again through a link.
if [ -n "$LEGACY" ]; then
	if [ ! -f "$LEGACY" ] || [ ! -x "$LEGACY" ] || [ "$LEGACY" -ef "$0" ]; then
		LEGACY=
	fi
fi

if [ -z "$SETTINGS" ] && [ -n "$TASKS" ]; then
	# git exports GIT_DIR to hooks; a linked worktree's is .../worktrees/<name>.
	# No settings for it: not a task worktree (the person's own checkout).
	case ${GIT_DIR-} in
	/*/worktrees/?*) [ -f "$TASKS/${GIT_DIR##*/}/settings" ] && SETTINGS=$TASKS/${GIT_DIR##*/}/settings ;;
	esac
fi

# under_exec: true when a `ccm-guard exec` is among our ancestors, i.e. an agent
# runs this git.  Every process an agent starts stays below ccm-guard (a child
# subreaper), whatever the agent does to its environment.  It forks: asked only
# when CCM_GUARD_SKIP is set.
under_exec() {
	_p=$PPID
	while [ "$_p" -gt 1 ] 2>/dev/null; do
		_cmd=$(tr '\0' '\n' </proc/$_p/cmdline 2>/dev/null) || return 1
		case $nl$_cmd$nl in
		*"/ccm-guard${nl}exec$nl"* | *"${nl}ccm-guard${nl}exec$nl"* | *"${nl}ccm_guard${nl}exec$nl"*) return 0 ;;
		esac
		IFS= read -r _stat </proc/$_p/stat 2>/dev/null || return 1
		set -- ${_stat##*) }
		_p=$2
	done
	return 1
}

# CCM_GUARD_SKIP=1 is a person's switch: it skips ccm-guard's own check, not
# the hooks it chains.  `ccm-guard exec` scrubs it from agents, and an agent
# that sets it again is not obeyed.
if [ "$CHECK" = 0 ] || [ -z "$SETTINGS" ] || [ -n "$chained" ] ||
	{ [ "${CCM_GUARD_SKIP-}" = 1 ] && ! under_exec; }; then
	[ -n "$LEGACY" ] || exit 0
	export CCM_GUARD_HOOK_CHAIN
	# Not exec: the chained hook must see this hook as its parent (from_chaining_hook).
	"$LEGACY" "$@"
	exit $?
fi

# run_python ARGS...: ccm-guard decides (never returns).  -I: no PYTHON*
# variables, no user site, no current directory on sys.path (an agent's
# json.py must not run here); -S: no site, whose .pth files cost tens of ms.
run_python() {
	if [ ! -x "$PY" ]; then
		printf 'ccm-guard: refused: %s is gone: reinstall the hooks (ccm-guard install)\n' "$PY" >&2
		exit 1
	fi
	CCM_GUARD_HOOK_SETTINGS=$SETTINGS
	export CCM_GUARD_HOOK_SETTINGS
	exec "$PY" -I -S -c 'import sys; sys.path += filter(None, sys.argv.pop(1).split(":")); from ccm_guard.hookrun import cli; sys.exit(cli(sys.argv[1:]))' "$PYPATH" "$HOOK" "$@"
}

case $HOOK in
pre-push)
	# The push is refused whatever the chained hook would say, so it is not run.
	run_python "$@"
	;;
reference-transaction)
	# The ref updates arrive on stdin; both the chained hook and the check need them.
	input=
	while IFS= read -r line || [ -n "$line" ]; do
		input=$input$line$nl
	done
	if [ -n "$LEGACY" ]; then
		printf '%s' "$input" | CCM_GUARD_HOOK_CHAIN=$CCM_GUARD_HOOK_CHAIN "$LEGACY" "$@" || exit $?
	fi
	# Only `prepared` can still stop the transaction.
	[ "${1-}" = prepared ] || exit 0
	branch=
	while IFS= read -r line || [ -n "$line" ]; do
		case $line in branch=*) branch=${line#branch=} ;; esac
	done <"$SETTINGS"
	# Fast path for a normal commit in the task worktree (HEAD, the task's
	# branch, pseudo-refs such as ORIG_HEAD): nothing to refuse, no Python.
	# Anything else goes to Python, which decides (and logs) authoritatively.
	rest=$input
	while [ -n "$rest" ]; do
		line=${rest%%"$nl"*}
		rest=${rest#*"$nl"}
		ref=${line##* }
		case $ref in
		HEAD | "refs/heads/$branch") continue ;;
		'' | *[!ABCDEFGHIJKLMNOPQRSTUVWXYZ_]*) ;;
		*) continue ;;
		esac
		printf '%s' "$input" | run_python "$@"
		exit $?
	done
	exit 0
	;;
*)
	if [ -n "$LEGACY" ]; then
		CCM_GUARD_HOOK_CHAIN=$CCM_GUARD_HOOK_CHAIN "$LEGACY" "$@" || exit $?
	fi
	run_python "$@"
	;;
esac
