"""Whether the federation can make progress, in words: the disk it needs, a stuck round, files it cannot read.

The rules over plain values; :meth:`coordinator.server.web.view.ServerView.health` collects every
reason, so the page, ``/healthz`` and the log say the same.
"""

from __future__ import annotations

import getpass
import grp
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from coordinator.server.templating import size

MIN_FREE_BYTES = 64_000_000
"""Free space below which the disk is full whatever the model (databases, log and first round; the paper's CNN is 26 MB a copy)."""

STUCK_FACTOR = 2.0
"""An attempt still open after this many times its own deadline is stuck: the coordinator is not closing its rounds."""


@dataclass(frozen=True)
class DiskBudget:
    """What a served federation needs on disk, and what its data folder's filesystem has free (bytes).

    ``model`` is one version file (0 before the first); ``keep``/``kept``: versions kept at most / now;
    ``round_folder``: the newest round's models; ``updates``: updates the newest round held on disk.
    """

    folder: Path
    free: int
    model: int
    keep: int
    kept: int
    kept_bytes: int
    round_folder: int
    updates: int

    @property
    def known(self) -> bool:
        """Whether a model's size is known (after the first version)."""
        return self.model > 0

    @property
    def per_round(self) -> int:
        """Working space of one round: its models' folder, its updates and its version file."""
        return self.round_folder + self.updates * self.model + self.model

    @property
    def need(self) -> int:
        """All the federation needs once its versions are all kept: ``keep`` x one version, plus one round's working space."""
        return self.keep * self.model + self.per_round

    @property
    def need_next_round(self) -> int:
        """What the next round writes before anything is deleted (:data:`MIN_FREE_BYTES` before a model's size is known)."""
        return self.per_round if self.known else MIN_FREE_BYTES

    @property
    def need_until_full(self) -> int:
        """What the next rounds add until ``keep`` versions are kept, plus one round's working space."""
        return max(0, self.keep - self.kept) * self.model + self.per_round

    def problem(self) -> str | None:
        """Why the next round cannot be written (free space below :attr:`need_next_round`); None when it can."""
        if self.free >= self.need_next_round:
            return None
        return f"disk full: {self.folder}: {size(self.free)} free of the {size(self.need_next_round)} the next round needs"

    def warning(self) -> str | None:
        """A warning while free space is below what the next rounds need until the kept versions are complete."""
        if not self.known or self.free >= self.need_until_full:
            return None
        return (f"disk: {size(self.free)} free on {self.folder}, below the {size(self.need_until_full)} the next rounds need "
                f"until {self.keep} versions are kept; free space or lower [server] keep_versions")  # fmt: skip


def _file_size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


def folder_size(folder: Path) -> int:
    """Bytes of the files under ``folder`` (0 when it does not exist)."""
    total = 0
    for root, _, files in os.walk(folder):
        total += sum(_file_size(Path(root) / f) for f in files)
    return total


def measure_disk(folder: Path, run_dir: Path | None, version_paths: list[Path], keep: int, updates: int) -> DiskBudget:
    """The :class:`DiskBudget` of a data folder now (``version_paths`` oldest first); OSError if the free space cannot be asked."""
    sizes = [_file_size(p) for p in version_paths]
    rounds = sorted((run_dir / "models").glob("r[0-9]*")) if run_dir is not None else []
    round_folder = folder_size(rounds[-1]) if rounds else 0
    model = sizes[-1] if sizes else _file_size(rounds[-1] / "global.safetensors") if rounds else 0
    return DiskBudget(Path(folder), shutil.disk_usage(folder).free, model, keep, len(sizes), sum(sizes), round_folder, updates)


def stuck_round(round_: int, announced_unix: float | None, deadline_unix: float, now: float) -> str | None:
    """Why the open attempt of ``round_`` is stuck (open over :data:`STUCK_FACTOR` x its deadline); None when not."""
    if announced_unix is None or not deadline_unix or deadline_unix <= announced_unix:
        return None
    allowed = deadline_unix - announced_unix
    open_s = now - announced_unix
    if open_s <= STUCK_FACTOR * allowed:
        return None
    return (f"round {round_} has been open for {open_s / 60:.0f} min, more than {STUCK_FACTOR:g} times its deadline "
            f"({allowed / 60:.0f} min): the coordinator does not close its rounds")  # fmt: skip


def _account() -> tuple[str, str]:
    """This process's user and group names (numbers where the system has no name)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    try:
        group = grp.getgrgid(os.getgid()).gr_name
    except KeyError:
        group = str(os.getgid())
    return user, group


def unreadable(path: Path, why: str, account: tuple[str, str] | None = None) -> str:
    """A file this process cannot read, with the fix (``chgrp`` + ``chmod g+r`` for the server's ``account``)."""
    user, group = account or _account()
    return (f"{path} cannot be read by the server (user {user}): {why}; let its group read it: "
            f"sudo chgrp {group} {path} && sudo chmod g+r {path} (and o+x on the folders above it)")  # fmt: skip


def first_unreadable(paths: list[Path]) -> tuple[Path, str] | None:
    """The first of ``paths`` this process cannot open for reading, and why (the OS's words); None when all can be read."""
    for p in paths:
        try:
            with open(p, "rb") as f:
                f.read(1)
        except OSError as exc:
            return p, exc.strerror or type(exc).__name__
    return None
