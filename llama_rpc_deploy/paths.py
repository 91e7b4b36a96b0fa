"""Where the project's own files are: the checkout, and what ships with the package."""

from __future__ import annotations

from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent  # the checkout (deploy.py, inventory.py, group_data/)
STATE = PROJECT / ".state"  # on the control machine: packed sources, the image-transfer key, the tunnel's keys


def shipped(name: str) -> Path:
    """templates/ or files/: inside this package when it is installed (pyproject.toml maps them into
    it), at the top of the checkout otherwise."""
    installed = Path(__file__).resolve().parent / name
    return installed if installed.is_dir() else PROJECT / name
