"""The package's layers: no module imports from a layer above its own (see opsynth/__init__.py)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The folder of each subpackage, and its floor; the modules of the `opsynth` folder itself are the ground floor.
FLOORS = {
    "opsynth": 0,
    "opsynth.operator_catalog": 1,
    "opsynth.filters": 2,
    "opsynth.outputs": 3,
    "opsynth.pipeline": 4,
    "opsynth.commands": 5,
    "opsynth.bench": 5,
}
ENTRY_POINTS = {"opsynth.__main__": 5}  # `python -m opsynth` runs the command line
FOLDERS = {name: ROOT / (name.split(".")[1] if "." in name else name) for name in FLOORS}


def floor_of(module: str) -> int:
    if module in ENTRY_POINTS:
        return ENTRY_POINTS[module]
    package = ".".join(module.split(".")[:2])
    return FLOORS.get(package, FLOORS["opsynth"])


def modules():
    for package, folder in FOLDERS.items():
        for path in sorted(folder.glob("*.py")):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            yield name, path


def imported(path: Path):
    """Every module a file imports, at its top or inside a function (lazy imports count too)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: relative import"
            yield node.module


def test_every_package_folder_is_a_layer():
    listed = {folder.name for folder in FOLDERS.values()}
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    assert packages == listed


def test_no_module_imports_from_a_layer_above_its_own():
    upward = []
    for name, path in modules():
        for target in imported(path):
            top = target.split(".")[0]
            assert top not in {f.name for f in FOLDERS.values()} - {"opsynth"}, (
                f"{name} imports {target}: the folders install as opsynth.<folder>, so import opsynth.{target}"
            )
            if top == "opsynth" and floor_of(target) > floor_of(name):
                upward.append(f"{name} -> {target}")
    assert not upward


def test_the_ground_floor_does_not_import_torch_or_beam():
    """Reading options, constants and records (what `--help` and usage errors need) stays fast."""
    heavy = []
    for name, path in modules():
        if floor_of(name) == 0:
            heavy += [f"{name} -> {t}" for t in imported(path) if t.split(".")[0] in {"torch", "apache_beam"}]
    assert not heavy


def test_tests_import_no_private_names_of_the_package():
    """Tests use what the package offers, so its insides can move without them."""
    private = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("opsynth"):
                private += [f"{path.name}: {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    assert private == []
