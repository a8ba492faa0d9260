"""The commands: the `opsynth` command line (cli.py), one module per command, and what only they run."""
