"""Whether this Python holds what a device client with a given training backend imports, said in words.

``firmware_scripts/pi_setup.sh`` runs ``python -m edge_client.install_check --backend numpy`` (or
``torch``) in the venv it built, so a missing module stops the setup with its name and its use
instead of the service failing later. Only what the chosen backend needs is checked: scipy is
no device dependency (the anti-alias filter is numpy's own), and the numpy backend needs no
PyTorch. After the named modules, the client's own modules are imported, so a module that the
program imports but this table forgets is still named.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NamedTuple

from har_io.exit_codes import Exit


class Need(NamedTuple):
    """One module a device imports: its import name, the package that brings it, and what it is for."""

    module: str
    package: str
    use: str


COMMON = (
    Need("numpy", "numpy", "the window pipeline and the numpy training backend"),
    Need("paho.mqtt.client", "paho-mqtt", "the link to the broker"),
    Need("smbus2", "smbus2 (the [pi] extra)", "reading the MPU-6050 on the I2C bus"),
)
NEEDS: dict[str, tuple[Need, ...]] = {
    "numpy": COMMON,
    "torch": (*COMMON, Need("torch", "torch, PyTorch's CPU build (the [client] extra)", "the PyTorch training backend")),
}
"""What each backend of ``fedhar-client --backend`` needs on a board."""

PROGRAM = {"numpy": ("edge_client.cli", "edge_client.backends.numpy_ref"), "torch": ("edge_client.cli", "edge_client.trainer")}
"""The client's own modules imported after :data:`NEEDS`, per backend."""


def missing(backend: str) -> list[str]:
    """The sentences naming each module ``backend`` needs that does not import here (empty: nothing is missing).

    Raises
    ------
    ValueError
        For a backend not in :data:`NEEDS`.
    """
    if backend not in NEEDS:
        raise ValueError(f"backend must be one of {', '.join(NEEDS)} (got {backend!r})")
    lines = []
    for need in NEEDS[backend]:
        try:
            importlib.import_module(need.module)
        except ImportError:
            lines.append(f"{need.package} is not installed: it is needed for {need.use}")
    if lines:  # the program's own imports would only repeat the same missing modules
        return lines
    for module in PROGRAM[backend]:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            lines.append(f"{exc.name} is not installed: fedhar's {module} imports it")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Print what is missing for ``--backend`` and return 7 (:data:`Exit.MISSING_MODULE`), or print nothing and return 0."""
    parser = argparse.ArgumentParser(prog="python -m edge_client.install_check", description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=sorted(NEEDS), default="numpy")
    parser.add_argument("--prog", default="install_check", help="the name the messages start with")
    args = parser.parse_args(argv)
    lines = missing(args.backend)
    for line in lines:
        print(f"{args.prog}: {line}", file=sys.stderr)
    if lines:
        print(f"{args.prog}: the {args.backend} backend cannot run in {sys.prefix}; install what is named above, then run this again",
              file=sys.stderr)
        return Exit.MISSING_MODULE
    return Exit.OK


if __name__ == "__main__":
    sys.exit(main())
