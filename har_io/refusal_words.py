"""What a device enrolled by a bundle or a certificate is told when the broker or the server refuses it, with the fix it needs.

A broker answers a wrong password and a re-issued, renamed or revoked device alike; the device's
history tells some apart (a bundle never accepted is not the current one; one accepted before was
re-issued, renamed or revoked). A CA from the bundle was never a ``--tls-ca``, so the words name the
bundle. The app, ``fedhar-client``, the MQTT link and the certificate request all use these words.
"""

from __future__ import annotations


def bundle_login_refused(name: str, accepted_before: bool) -> str:
    """The broker refused the password of device ``name``'s enrolment bundle (``accepted_before``: it connected or took
    part before; False: refused at its first use)."""
    if not accepted_before:
        return (f"the broker refused the password of {name!r}'s enrolment bundle at its first use: the bundle is not the current "
                f"one for {name!r} (an older copy, or one written before the device was re-issued). Ask the server's operator to "
                f"re-issue it (fedhar-coordinator reissue {name}) and enrol with the new bundle")  # fmt: skip
    return (f"the broker no longer accepts {name!r} with its enrolment bundle, which it accepted before: the server's operator "
            f"re-issued, renamed or revoked this device (fedhar-coordinator devices says which). Re-issued: enrol with the new "
            f"bundle of {name!r}. Renamed: enrol with the bundle of its new name. Revoked: the name stays refused; the device "
            f"joins again only under a new name (fedhar-coordinator enrol NEW-NAME)")  # fmt: skip


def bundle_wrong_ca(name: str, ca_file: str | None) -> str:
    """The broker's certificate is not signed by the CA that came with device ``name``'s enrolment bundle (kept at ``ca_file``)."""
    where = f" (kept as {ca_file})" if ca_file else ""
    return (f"the broker's certificate is not signed by the CA of {name!r}'s enrolment bundle{where}: the bundle is for another "
            f"broker, or the broker's CA was replaced after the bundle was written. Ask the server's operator for a new bundle "
            f"(fedhar-coordinator reissue {name}) and enrol with it")  # fmt: skip


def certificate_refused(name: str, reason: str) -> str:
    """The server refused device ``name``'s certificate request (``reason``: a refusal of :mod:`har_io.cert_enrolment`)."""
    if reason == "name_revoked":
        return (f"the server refused {name!r}: the name was revoked for good and is never enrolled again; ask under a new name "
                f"(--client-id NEW-NAME)")  # fmt: skip
    if reason == "name_taken":
        return (f"the server refused {name!r}: the name is enrolled already, by another device or by this one under another key. "
                f"Another device's: ask under another name. This device's (reset, or its key lost): ask the operator to re-issue "
                f"it (fedhar-coordinator reissue {name}), then ask again with --new-key")  # fmt: skip
    return f"the server's operator refused the request for {name!r}; ask them why, or ask under another name"
