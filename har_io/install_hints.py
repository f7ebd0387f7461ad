"""Install commands that work where fedhar comes from: a checkout, since fedhar is not on PyPI.

A hint such as ``pip install 'fedhar[app]'`` sends a person to PyPI, which has no fedhar
(or someone else's). Every hint names this interpreter's pip and the checkout this code was
installed from (an editable install keeps the checkout's path), or says to run it in the
checkout when the code is an installed copy.
"""

from __future__ import annotations

import sys
from pathlib import Path

CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
TORCH_PIN = "torch==2.13.0"


def checkout() -> Path | None:
    """The fedhar checkout these modules run from (the folder with ``pyproject.toml``), or None for an installed copy."""
    root = Path(__file__).resolve().parents[1]
    return root if (root / "pyproject.toml").is_file() else None


def install_hint(extra: str | None = None) -> str:
    """The command that installs fedhar (with ``extra``, e.g. ``"pi"``) into this interpreter from its checkout.

    Returns e.g. ``/opt/fedhar/.venv/bin/python -m pip install -e '/opt/fedhar[pi]'``; without a
    checkout, ``... pip install -e '<your fedhar checkout>[pi]'`` with words saying where to get one.
    """
    root = checkout()
    target = f"{root if root is not None else '<your fedhar checkout>'}{f'[{extra}]' if extra else ''}"
    return f"{sys.executable} -m pip install -e '{target}'"


def update_hint() -> str:
    """The commands that update fedhar from its checkout (``git pull``, then the install again)."""
    root = checkout()
    where = str(root) if root is not None else "your fedhar checkout"
    return f"git -C {where} pull, then {install_hint()}"


def torch_hint() -> str:
    """The command that installs PyTorch's CPU build; a version pin alone cannot choose the build, the index URL does."""
    return f"{sys.executable} -m pip install {TORCH_PIN} --index-url {CPU_TORCH_INDEX}"
