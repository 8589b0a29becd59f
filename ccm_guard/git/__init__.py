"""The one gateway to the git binary: no other part of ccm-guard starts a git process.

Every call is hardened (`core`): git dir, common dir and work tree passed from pinned
paths, hooks, fsmonitor, pagers, replace objects and the person's global config off,
pathspecs literal, output NUL-separated. The typed queries built on it live by what they
touch:

- `base`: the hardening, and git started with `os` alone (what the guard hooks use);
- `core`: `run`, `Repo`, `discover`;
- `refs`: resolving, moving (compare-and-swap), listing, fetching and pushing refs;
- `objects`: blobs and trees by id or REV:PATH, hashing files, pack and graph checks;
- `history`: commit ranges and their changes, ancestry, merge-tree, making commits;
- `index`: an index file read directly, and git calls on the own or a private index;
- `checkout`: linked worktrees, read-tree/reset/restore, status and ignored files;
- `config`: config files read and written through git, and which keys run code;
- `layout`: where the common dir and the worktrees' admin dirs are (no git run).

Callers use the package (`from ccm_guard import git; git.resolve_commit(...)`): the
query API is re-exported here, each name loaded when first used. Submodules import only the ones below them (`core` at
the bottom), never this package.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ccm_guard.git.base import HARDENING, binary
    from ccm_guard.git.checkout import (
        IgnoreRule,
        KeptIndex,
        StatusEntry,
        WorktreeEntry,
        check_ignore,
        checkout_with_index,
        clean_with_index,
        fast_forward_checkout,
        files_match_index,
        hidden_by_index_flags,
        ignored_untracked,
        refresh_index,
        refresh_with_index,
        reset_hard,
        reset_work_tree,
        restore_path,
        restore_paths,
        sparse_set_cone,
        staged_changes,
        status,
        status_with_index,
        status_without_trusting_index,
        unsplit_index,
        tracked_listed,
        untracked_listed,
        untracked_matching,
        worktree_add,
        worktree_add_bare,
        worktree_list,
        worktree_prune,
        worktree_remove,
        worktree_unlock,
    )
    from ccm_guard.git.config import (
        config_entries,
        config_file_create,
        config_file_set,
        global_config_files,
        may_set,
        object_format,
        remote_url,
    )
    from ccm_guard.git.core import (
        Discovered,
        Repo,
        Result,
        describe_failure,
        discover,
        discover_commits,
        environment,
        is_oid,
        run,
    )
    from ccm_guard.git.history import (
        FileStat,
        MergeResult,
        RawChange,
        archive_commit,
        commit_changes,
        commit_claims,
        commit_tree,
        commits,
        count_commits,
        diff_text,
        has_any_commit,
        is_ancestor,
        merge_base,
        merge_tree,
        numstat,
        numstat_trees,
        parents_and_message,
        tree_changes,
    )
    from ccm_guard.git.index import (
        changed_with_index,
        index_from,
        index_tree,
        reset_index,
        stage_with_index,
    )
    from ccm_guard.git.objects import (
        blob_at,
        blob_sizes,
        blobs,
        file_at,
        files_at,
        hash_file,
        hash_files,
        object_type,
        peeled,
        tree_blobs,
        tree_of,
        tree_paths,
        tree_size,
        trees_of,
        verify_commit_graph,
        verify_midx,
        verify_pack,
    )
    from ccm_guard.git.refs import (
        RefTree,
        all_reachable,
        branch_taken,
        branch_tip,
        check_branch_name,
        current_branch,
        delete_ref,
        drop_ref,
        fetch_ref,
        push_ref,
        ref_exists,
        ref_trees,
        refs_under,
        resolve_commit,
        set_symbolic_head,
        symbolic_head,
        try_update_ref,
        update_ref,
        worktree_stash,
    )

# The query API, as callers use it: `from ccm_guard import git; git.resolve_commit(...)`.
__all__ = [
    "binary", "describe_failure", "discover", "discover_commits", "Discovered", "environment", "HARDENING", "is_oid", "Repo", "Result",
    "run",
    "check_branch_name", "delete_ref", "drop_ref", "fetch_ref", "push_ref", "ref_exists", "branch_taken", "branch_tip", "current_branch", "worktree_stash", "all_reachable", "ref_trees",
    "refs_under", "RefTree", "resolve_commit", "set_symbolic_head", "symbolic_head", "try_update_ref", "update_ref",
    "blob_at", "blob_sizes", "blobs", "peeled", "file_at", "files_at", "hash_file", "hash_files", "object_type",
    "tree_blobs", "tree_of", "tree_paths", "tree_size", "trees_of", "verify_commit_graph", "verify_midx", "verify_pack",
    "archive_commit", "commit_changes", "commit_claims", "commit_tree", "parents_and_message", "commits", "count_commits",
    "diff_text", "FileStat", "has_any_commit", "is_ancestor", "merge_base", "merge_tree", "MergeResult",
    "numstat", "numstat_trees", "RawChange", "tree_changes",
    "changed_with_index", "index_from", "index_tree", "reset_index", "stage_with_index",
    "check_ignore", "checkout_with_index", "clean_with_index", "fast_forward_checkout", "hidden_by_index_flags", "ignored_untracked",
    "IgnoreRule", "refresh_index", "refresh_with_index", "reset_hard", "reset_work_tree", "restore_path", "restore_paths", "sparse_set_cone",
    "files_match_index", "status", "status_with_index", "status_without_trusting_index", "staged_changes", "unsplit_index", "KeptIndex", "StatusEntry", "tracked_listed", "untracked_listed", "untracked_matching", "worktree_add", "worktree_add_bare",
    "worktree_list", "worktree_prune", "worktree_remove", "worktree_unlock", "WorktreeEntry",
    "config_entries", "config_file_create", "config_file_set", "global_config_files", "may_set", "object_format", "remote_url",
]


# Loaded on first use, not here: a guard hook pays for every module it imports on every
# commit, and needs `core` and `spawn` only (mypy reads the imports above instead).
_PARTS = ("core", "refs", "objects", "history", "index", "checkout", "config")


if not TYPE_CHECKING:
    def __getattr__(name: str) -> object:
        if name in __all__:
            import importlib

            for part in _PARTS:
                module = importlib.import_module(f"ccm_guard.git.{part}")
                if name in vars(module):
                    value = vars(module)[name]
                    globals()[name] = value
                    return value
        raise AttributeError(f"module 'ccm_guard.git' has no attribute {name!r}")
