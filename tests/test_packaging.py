"""What `pip install` puts into site-packages: one `opsynth` package holding every layer, and its data."""

import subprocess
import sys
import zipfile

from tests.test_layers import FOLDERS, ROOT


def test_the_wheel_holds_every_module_under_opsynth_and_nothing_at_the_top(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("opsynth-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {
        f"{package.replace('.', '/')}/{path.name}"
        for package, folder in FOLDERS.items()
        for path in folder.glob("*.py")
    }
    assert expected <= names
    assert "opsynth/filters/data/kernelbench_index.json.gz" in names
    assert "opsynth/operator_catalog/data/ops6k_counts.json" in names
    tops = {name.split("/")[0] for name in names}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"opsynth"}


def test_the_worker_image_copies_every_layer():
    dockerfile = (ROOT / "docker" / "worker.Dockerfile").read_text()
    for folder in FOLDERS.values():
        assert f"COPY {folder.name} ./{folder.name}\n" in dockerfile
