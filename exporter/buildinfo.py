"""What build this is: the version, and the git revision it was built from.

The revision comes from the REVISION file that the wheel build writes into the package
(setup.py), or, running from a checkout, from git itself; "unknown" when neither exists (a
source tarball). Read once: build_info is on every scrape.
"""
from __future__ import annotations

import functools
import subprocess
from pathlib import Path

from exporter import __version__

PACKAGE = Path(__file__).resolve().parent
REVISION_FILE = PACKAGE / "REVISION"


@functools.cache
def revision() -> str:
    try:
        text = REVISION_FILE.read_text().strip()
        if text:
            return text[:40]
    except OSError:
        pass
    if (PACKAGE.parent / ".git").exists():
        try:
            out = subprocess.run(["git", "-C", str(PACKAGE.parent), "rev-parse", "HEAD"],
                                 capture_output=True, text=True, timeout=5)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip()[:40]
        except (OSError, subprocess.SubprocessError):
            pass
    return "unknown"


def version() -> str:
    return __version__
