"""`python -m opsynth` is `opsynth`."""

from opsynth.commands.cli import entry

if __name__ == "__main__":
    entry()
