"""Which devices the broker folder lists now: the revocations of ``fedhar-coordinator broker`` as ``run`` reads them.

``fedhar-coordinator broker remove ID`` (``--revoke``) takes a device out of the folder's manifest
(:data:`coordinator.broker.settings.MANIFEST_NAME`, its ``clients``) and out of the broker's password file;
the broker then refuses its next login, but a session it already has stays open. :class:`Roster` reads the
manifest again whenever it changes, so a coordinator of ``run`` given the folder (``--broker-dir``) refuses,
from the next message on, every device the folder no longer lists: revocation is final in ``run`` as in
``serve``. Standard library only, as the rest of this package.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from coordinator.broker.settings import MANIFEST_NAME


class Roster:
    """The devices a broker folder lists, read again whenever its manifest changes (see the module docstring).

    Parameters
    ----------
    folder : Path
        A folder made by ``fedhar-coordinator broker``.

    Raises
    ------
    ValueError
        If the folder holds no readable manifest (the message names the file and the fix).
    """

    def __init__(self, folder: Path):
        self.path = Path(folder) / MANIFEST_NAME
        self._stamp: tuple[int, int] | None = None
        self._clients: frozenset[str] = frozenset()
        self._read()

    def _read(self) -> None:
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp == self._stamp:
                return
            doc = json.loads(self.path.read_text())
            clients = doc["clients"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            if self._stamp is not None:  # it was readable: keep the last list rather than let every device in
                return
            raise ValueError(f"{self.path}: not a readable broker folder manifest ({exc}); give the folder that "
                             f"fedhar-coordinator broker made (--broker-dir)") from None  # fmt: skip
        self._stamp, self._clients = stamp, frozenset(str(c) for c in clients)

    def listed(self, cid: str) -> bool:
        """True if the folder lists device ``cid`` now."""
        self._read()
        return cid in self._clients

    def refused(self, cid: str) -> bool:
        """True if the folder no longer lists device ``cid`` (removed, revoked, or never added)."""
        return not self.listed(cid)
