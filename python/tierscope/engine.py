"""Locate and run the native engine binary `tierscope-engine` (built from engine/ by maturin)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ENGINE_NAME = "tierscope-engine"


class EngineNotFound(RuntimeError):
    """The native engine binary is not installed next to this Python environment."""


def engine_path() -> Path:
    """Path of `tierscope-engine`: $TIERSCOPE_ENGINE, then the interpreter's bin dir, then PATH."""
    override = os.environ.get("TIERSCOPE_ENGINE")
    if override:
        return Path(override)
    candidate = Path(sys.executable).parent / ENGINE_NAME
    if candidate.exists():
        return candidate
    found = shutil.which(ENGINE_NAME)
    if found:
        return Path(found)
    raise EngineNotFound(
        f"{ENGINE_NAME} not found next to {sys.executable} nor on PATH; run `make setup` "
        "(or `pip install .`) to build it"
    )


def engine_version() -> str:
    """The engine's own version string, e.g. '0.1.0'."""
    out = subprocess.run([str(engine_path()), "version"], capture_output=True, text=True, check=True)
    return out.stdout.strip().split()[-1]
