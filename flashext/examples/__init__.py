"""End-to-end examples: `python -m flashext.examples.train_gpt`, `python -m flashext.examples.serve_gpt`."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def git_commit() -> str:
    """The commit an example's figures belong to: $FLASHEXT_GIT_COMMIT, else the source tree's HEAD."""
    if os.environ.get("FLASHEXT_GIT_COMMIT"):
        return os.environ["FLASHEXT_GIT_COMMIT"]
    try:
        return subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, text=True,
                                       stderr=subprocess.DEVNULL).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
