"""Control messages of the blob transport (docs/protocol.md, "Blob transport").

With ``transport = "blobs"`` the model bytes leave the broker (:mod:`har_io.blobs`); what
stays on MQTT are these small JSON messages:

* :class:`BlobRef` — where a model envelope is, its size and SHA-256: the global model's is in
  the round announcement (``blobs.global``), a personalised model's in that client's grant;
* :class:`BlobGrant` — on ``{p}/client/{cid}/grant`` (retained, readable by that device only):
  the exchange it belongs to, the client's own model (personalised) if it has one, and the
  signed URL it uploads its update to (:class:`UploadGrant`);
* :class:`BlobNotice` — on ``{p}/client/{cid}/update/blob``: the client uploaded its update;
  ``{run, round, stage, sha256, size}``, which the coordinator checks every byte against;
* :class:`ProgramBlob` — on ``{p}/client/{cid}/programs/blob``: the ExecuTorch programs a client
  asked for are in the store (the same program envelope that otherwise comes in chunks).

Every field is checked where it enters, as for every message (:class:`MessageError`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from har_models.wire.blob_ref import BlobRef, check_blob_url, check_int, check_sha256
from har_models.wire.messages import MessageError, dump_message, load_message

__all__ = ["BLOB_NOTICE_INDEX", "PROGRAM_BLOB_INDEX", "BlobGrant", "BlobNotice", "BlobRef", "ProgramBlob", "UploadGrant", "check_sha256"]

PROGRAM_BLOB_INDEX = "blob"
"""The last level of the program topic a :class:`ProgramBlob` is published on (``{p}/client/{cid}/programs/blob``)."""

BLOB_NOTICE_INDEX = "blob"
"""The last level of the update topic a :class:`BlobNotice` is published on (``{p}/client/{cid}/update/blob``):
chunks use numbers there, so the two never mix, and the device's ACL and a bridge already carry it."""


@dataclass(frozen=True)
class UploadGrant:
    """Permission to upload one update: a signed PUT URL for the client's slot of one exchange.

    Parameters
    ----------
    url : str
        ``http(s)`` URL a PUT of the update envelope goes to (no credentials needed).
    expires_unix : float
        Unix time (s) after which the store refuses it (the exchange's deadline).
    max_bytes : int
        Largest envelope the coordinator accepts (its ``max_update_bytes``), bytes.
    """

    url: str
    expires_unix: float
    max_bytes: int

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, "expires_unix": self.expires_unix, "max_bytes": self.max_bytes}

    @classmethod
    def from_json(cls, d: Any) -> UploadGrant:
        """Parse and check; ValueError if a field is missing, unknown or of the wrong kind."""
        if not isinstance(d, dict) or set(d) != {"url", "expires_unix", "max_bytes"}:
            raise ValueError(f"an upload grant needs exactly url, expires_unix and max_bytes, got {d!r:.120}")
        exp = d["expires_unix"]
        if isinstance(exp, bool) or not isinstance(exp, int | float):
            raise ValueError(f"expires_unix must be a number, got {exp!r:.40}")
        return cls(check_blob_url(d["url"]), float(exp), check_int(d["max_bytes"], "max_bytes", 1))


@dataclass(frozen=True)
class BlobGrant:
    """What one selected client needs for one exchange in blob mode (retained on its grant topic).

    Parameters
    ----------
    run_id : str
    round : int
    stage : int
    attempt : str
        The coordinator attempt it was made for (a new attempt hands out new grants).
    upload : UploadGrant
    model : BlobRef or None
        The client's personalised model (FedDWA, FedPer); None: it starts from the global model
        named in the announcement.
    """

    run_id: str
    round: int
    stage: int
    attempt: str
    upload: UploadGrant
    model: BlobRef | None = None

    def key(self) -> tuple[str, int, int]:
        """The exchange: (run id, round, stage)."""
        return (self.run_id, self.round, self.stage)

    def to_bytes(self) -> bytes:
        d: dict[str, Any] = {"run_id": self.run_id, "round": self.round, "stage": self.stage,
                             "attempt": self.attempt, "upload": self.upload.to_json()}  # fmt: skip
        if self.model is not None:
            d["model"] = self.model.to_json()
        return dump_message(d)

    @classmethod
    def from_bytes(cls, payload: bytes) -> BlobGrant:
        """Parse a grant. MessageError if it is not one, or malformed."""
        d = load_message(payload, "upload grant")
        try:
            if set(d) - {"run_id", "round", "stage", "attempt", "upload", "model"}:
                raise ValueError(f"unknown fields {sorted(set(d) - {'run_id', 'round', 'stage', 'attempt', 'upload', 'model'})}")
            if not isinstance(d.get("run_id"), str) or not isinstance(d.get("attempt"), str):
                raise ValueError("run_id and attempt must be strings")
            model = d.get("model")
            return cls(d["run_id"], check_int(d.get("round"), "round"), check_int(d.get("stage"), "stage"), d["attempt"],
                       UploadGrant.from_json(d.get("upload")), None if model is None else BlobRef.from_json(model))  # fmt: skip
        except (KeyError, ValueError) as exc:
            raise MessageError(f"upload grant: {exc}") from None


@dataclass(frozen=True)
class BlobNotice:
    """A client's word that its update is in its upload slot (``{p}/client/{cid}/update/blob``).

    Parameters
    ----------
    run_id : str
    round : int
    stage : int
    sha256 : str
        SHA-256 of the uploaded envelope, hex; the coordinator refuses bytes that do not match.
    size : int
        Its length, bytes.
    """

    run_id: str
    round: int
    stage: int
    sha256: str
    size: int

    def to_bytes(self) -> bytes:
        d = {"run_id": self.run_id, "round": self.round, "stage": self.stage,
             "sha256": self.sha256, "size": self.size}  # fmt: skip
        return dump_message(d)

    @classmethod
    def from_bytes(cls, payload: bytes) -> BlobNotice:
        """Parse a notice. MessageError if it is not one, or malformed."""
        d = load_message(payload, "upload notice")
        try:
            if set(d) != {"run_id", "round", "stage", "sha256", "size"}:
                raise ValueError(f"expected run_id, round, stage, sha256 and size, got {sorted(d)}")
            if not isinstance(d["run_id"], str):
                raise ValueError("run_id must be a string")
            return cls(d["run_id"], check_int(d["round"], "round"), check_int(d["stage"], "stage"), check_sha256(d["sha256"]),
                       check_int(d["size"], "size"))  # fmt: skip
        except ValueError as exc:
            raise MessageError(f"upload notice: {exc}") from None


@dataclass(frozen=True)
class ProgramBlob:
    """Where the program envelope a client asked for is (blob transport; ``{p}/client/{cid}/programs/blob``).

    Parameters
    ----------
    run_id : str
    arch_version : int
        The architecture version whose programs these are.
    ref : BlobRef
        The envelope of kind ``"program"`` (:mod:`har_models.wire.pte_delivery`), addressed to that client.
    """

    run_id: str
    arch_version: int
    ref: BlobRef

    def to_bytes(self) -> bytes:
        d = {"run_id": self.run_id, "arch_version": self.arch_version, "ref": self.ref.to_json()}
        return dump_message(d)

    @classmethod
    def from_bytes(cls, payload: bytes) -> ProgramBlob:
        """Parse one. MessageError if it is not one, or malformed."""
        d = load_message(payload, "program reference")
        try:
            if set(d) != {"run_id", "arch_version", "ref"} or not isinstance(d["run_id"], str):
                raise ValueError(f"expected run_id (a string), arch_version and ref, got {sorted(d)}")
            return cls(d["run_id"], check_int(d["arch_version"], "arch_version"), BlobRef.from_json(d["ref"]))
        except ValueError as exc:
            raise MessageError(f"program reference: {exc}") from None
