"""A reference to a blob: where an object of the blob store is, its size and SHA-256 (docs/protocol.md, "Blob transport").

The one value both the round announcement (:mod:`har_models.wire.messages`, its ``global_blob``)
and the blob transport's own messages (:mod:`har_models.wire.blob_messages`) carry, with the
checks of its fields.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
"""A SHA-256 digest as lowercase hex: the name of every object."""

def check_sha256(value: Any, what: str = "sha256") -> str:
    """``value`` if it is a lowercase hex SHA-256 digest, else ValueError naming ``what``."""
    if not isinstance(value, str) or not SHA256_RE.match(value):
        raise ValueError(f"{what} must be 64 lowercase hex characters, got {value!r:.80}")
    return value


def check_blob_url(url: Any) -> str:
    """``url`` if it is an ``http(s)://`` URL without spaces (at most 4,000 characters), else ValueError."""
    if not isinstance(url, str) or not re.match(r"^https?://\S{1,4000}$", url):
        raise ValueError(f"a blob URL must be http(s)://..., got {url!r:.120}")
    return url


def check_int(value: Any, what: str, low: int = 0) -> int:
    """``value`` if it is an integer (not a bool) of at least ``low``, else ValueError naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{what} must be an integer >= {low}, got {value!r:.40}")
    return value


@dataclass(frozen=True)
class BlobRef:
    """Where a model envelope is and how to check it.

    Parameters
    ----------
    sha256 : str
        SHA-256 of the envelope, hex (also its transfer id, as over MQTT).
    size : int
        Envelope length, bytes.
    url : str
        An ``http(s)`` URL that answers a GET with exactly those bytes until the exchange's deadline.
    """

    sha256: str
    size: int
    url: str

    def to_json(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "size": self.size, "url": self.url}

    @classmethod
    def from_json(cls, d: Any) -> BlobRef:
        """Parse and check; ValueError if a field is missing, unknown or of the wrong kind."""
        if not isinstance(d, dict) or set(d) != {"sha256", "size", "url"}:
            raise ValueError(f"a blob reference needs exactly sha256, size and url, got {d!r:.120}")
        return cls(check_sha256(d["sha256"]), check_int(d["size"], "blob size"), check_blob_url(d["url"]))
