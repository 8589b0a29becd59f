"""Path rules: gitignore-style patterns matched by git's rules (`matcher`), a role's allow
and forbid lists in every spelling a name may have (`rules`), and a change's paths judged
against them (`check`). Pure: no git, no policy files; the guard hooks import it on every
commit, so it stays lean."""
