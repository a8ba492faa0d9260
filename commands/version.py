"""`opsynth --version`: opsynth's, its operator catalog's, torch's, Beam's and Python's, at once.

The catalog's version is a hash of its entries, which takes importing torch and every catalog module (about
two seconds of CPU): it is kept in the user's cache, under a key made of the catalog's files and the versions of
the libraries its entries come from, so that only the first `--version` after an install or an edit pays it.
"""

from __future__ import annotations

import hashlib
import os
import platform
from importlib import metadata, util
from pathlib import Path

CATALOG_PACKAGE = "opsynth.operator_catalog"
CATALOG_LIBRARIES = ("torch", "transformers")  # what the catalog's entries are read from


def _installed(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def _cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "opsynth"


def catalog_version_cached() -> str:
    """The catalog's version (`operator_catalog.catalog_version`), from the cache where its key is there."""
    spec = util.find_spec(CATALOG_PACKAGE)
    folder = Path(next(iter(spec.submodule_search_locations)))
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in (".py", ".json")):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0" + path.read_bytes())
    for library in CATALOG_LIBRARIES:
        digest.update(f"{library} {_installed(library)}".encode())
    cached = _cache_dir() / f"catalog-version-{digest.hexdigest()[:24]}"
    try:
        return cached.read_text().strip()
    except OSError:
        pass
    from opsynth.operator_catalog import catalog_version

    version = catalog_version()
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_text(version)
    except OSError:
        pass  # a read-only home: computed again next time
    return version


def version_line() -> str:
    from opsynth.config import VERSION

    return (
        f"opsynth {VERSION} (catalog {catalog_version_cached()}; torch {_installed('torch')}; apache-beam "
        f"{_installed('apache-beam')}; Python {platform.python_version()})"
    )
