"""The commands: the `opsynth` command line and what only it runs (validate, similarity, compare, catalog check)."""
