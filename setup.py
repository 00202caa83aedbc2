"""Only what pyproject.toml cannot say: the package list is found, plus exporter.bpf, which
package-dir maps to the top-level bpf/ (the BPF C ships inside the wheel;
exporter/sources/kernel/bpf/files.py finds it installed or in a checkout); and the git revision
the wheel is built from, written into
the package as exporter/REVISION for node_resize_exporter_build_info (exporter/buildinfo.py)."""

import subprocess
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py


class BuildWithRevision(build_py):
    def run(self) -> None:
        super().run()
        try:
            rev = subprocess.run(
                ["git", "-C", str(Path(__file__).parent), "rev-parse", "HEAD"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            rev = ""
        if rev:
            target = Path(self.build_lib) / "exporter" / "REVISION"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(rev + "\n")


setup(
    packages=find_packages(include=["exporter*"]) + ["exporter.bpf"],
    cmdclass={"build_py": BuildWithRevision},
)
