"""llama.cpp trees on the control machine: where the tree is in a folder, and its files in a stable order.

Read by source.py (packing a local tree) and webui.py (building its chat page).
"""

from __future__ import annotations

import os
from pathlib import Path


def find_tree(root: Path) -> Path:
    """The folder holding ggml/ and src/: root itself or, for an sdist, vendor/llama.cpp."""
    for candidate in (root, root / "vendor" / "llama.cpp"):
        if (candidate / "ggml" / "CMakeLists.txt").is_file() and (candidate / "tools").is_dir():
            return candidate
    raise FileNotFoundError(
        f"{root} is not a llama.cpp tree (no ggml/CMakeLists.txt and tools/ in it or in vendor/llama.cpp)"
    )


def files_below(root: Path, skip_top: set[str]) -> list[Path]:
    """Every file below root in a stable order (sorted, folder by folder), leaving out the top-level
    folders named in skip_top."""
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        if Path(dirpath) == root:
            dirnames[:] = [d for d in dirnames if d not in skip_top]
        dirnames.sort()
        files.extend(Path(dirpath, name) for name in sorted(filenames))
    return files
