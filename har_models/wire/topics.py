"""MQTT topic names of a federation and the rules for ids.

Topics (``{p}`` = ``fedhar/v1/{federation}``)::

    {p}/coordinator/status          retained; last will "offline"
    {p}/round                       retained round announcement (JSON)
    {p}/progress                    retained record of the last completed round (JSON)
    {p}/model/global/{i}            retained chunk i of the current global model envelope
    {p}/client/{cid}/status         retained client status (JSON); last will "offline"
    {p}/client/{cid}/model/{i}      retained chunk i of the client's personalised model
    {p}/client/{cid}/update/{i}     chunk i of the client's update envelope (not retained)
    {p}/client/{cid}/update/blob    blob transport: the client uploaded its update (JSON notice)
    {p}/client/{cid}/receipt        the coordinator's receipt for an update (not retained)
    {p}/client/{cid}/grant          blob transport: the client's upload URL (+ own model) for the round (retained)
    {p}/client/{cid}/program_request  a client asks for the ExecuTorch programs of a version (JSON)
    {p}/client/{cid}/programs/{i}   chunk i of the program envelope sent to that client (not retained)

Everything works on MQTT 3.1.1 (the embedded broker speaks nothing newer); see docs/protocol.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

CLIENT_ID_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
FEDERATION_RE = CLIENT_ID_RE


def check_client_id(cid: str) -> str:
    """Return ``cid`` if it is a valid client id (letters, digits, ``_ . -``, 1-64 chars).

    Raises
    ------
    ValueError
        Naming the id and the allowed characters.
    """
    if not isinstance(cid, str) or not CLIENT_ID_RE.match(cid):
        raise ValueError(f"client id {cid!r} is invalid: use 1-64 letters, digits, '_', '.' or '-'")
    return cid


@dataclass(frozen=True)
class Topics:
    """Topic names of one federation.

    Parameters
    ----------
    federation : str
        Federation name (same rules as a client id).
    root : str
        Versioned topic root (default ``fedhar/v1``).
    """

    federation: str = "default"
    root: str = "fedhar/v1"

    def __post_init__(self) -> None:
        if not FEDERATION_RE.match(self.federation):
            raise ValueError(f"federation name {self.federation!r} is invalid: use 1-64 letters, digits, '_', '.' or '-'")

    @property
    def prefix(self) -> str:
        return f"{self.root}/{self.federation}"

    @property
    def coordinator_status(self) -> str:
        return f"{self.prefix}/coordinator/status"

    @property
    def coordinator_outlook(self) -> str:
        """The coordinator's retained :class:`~har_models.wire.messages.RoundOutlook` (what it is doing about rounds)."""
        return f"{self.prefix}/coordinator/outlook"

    @property
    def round(self) -> str:
        return f"{self.prefix}/round"

    @property
    def progress(self) -> str:
        """The retained progress message (:class:`har_models.wire.messages.RoundProgress`), for observers."""
        return f"{self.prefix}/progress"

    def global_model(self, index: int | str) -> str:
        return f"{self.prefix}/model/global/{index}"

    def client_status(self, cid: str) -> str:
        return f"{self.prefix}/client/{cid}/status"

    def client_model(self, cid: str, index: int | str) -> str:
        return f"{self.prefix}/client/{cid}/model/{index}"

    def client_update(self, cid: str, index: int | str) -> str:
        return f"{self.prefix}/client/{cid}/update/{index}"

    def client_receipt(self, cid: str) -> str:
        return f"{self.prefix}/client/{cid}/receipt"

    def client_grant(self, cid: str) -> str:
        """Blob transport: the retained grant of client ``cid`` for the open exchange (its upload URL, its own model)."""
        return f"{self.prefix}/client/{cid}/grant"

    def client_program_request(self, cid: str) -> str:
        """Where client ``cid`` asks for the ExecuTorch programs of an architecture version (JSON)."""
        return f"{self.prefix}/client/{cid}/program_request"

    def client_programs(self, cid: str, index: int | str) -> str:
        """Chunk ``index`` of the program envelope the coordinator sends to client ``cid``."""
        return f"{self.prefix}/client/{cid}/programs/{index}"

    @property
    def ca(self) -> str:
        """Where the server leaves the broker's CA certificate (retained PEM) for devices that hold only its fingerprint."""
        return f"{self.prefix}/ca"

    def enrol_request(self, code: str) -> str:
        """Where a device enrolling by certificate leaves its request (retained), ``code`` its enrolment code's topic level."""
        return f"{self.prefix}/enrol/{code}"

    def enrol_reply(self, code: str) -> str:
        """Where the server leaves its answer (retained) to the request of enrolment code ``code``."""
        return f"{self.prefix}/enrol/{code}/reply"

    def parse_client_topic(self, topic: str) -> tuple[str, str] | None:
        """``(client_id, kind)`` for a ``{p}/client/{cid}/{kind}/...`` topic, else None."""
        parts = topic.split("/")
        base = self.prefix.split("/")
        if len(parts) < len(base) + 3 or parts[: len(base)] != base or parts[len(base)] != "client":
            return None
        return parts[len(base) + 1], parts[len(base) + 2]
