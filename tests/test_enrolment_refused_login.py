"""A device started with its enrolment bundle alone learns, when the broker refuses its login, that it was revoked.

The link's own message names --username and --password-file, which such a device never gave.
"""

from __future__ import annotations

from edge_client.cli import enrolment_refusal_hint
from har_io.mqtt_link import BrokerRefused


def test_a_refused_bundle_login_names_revocation_and_a_new_bundle() -> None:
    hint = enrolment_refusal_hint("phone-anna.json", BrokerRefused("auth", "refused the login of user 'phone-anna'"))
    assert hint is not None and "phone-anna.json" in hint and "revoked" in hint and "fedhar-coordinator enrol NEW-NAME" in hint


def test_no_hint_without_a_bundle_or_for_another_refusal() -> None:
    assert enrolment_refusal_hint(None, BrokerRefused("auth", "x")) is None
    assert enrolment_refusal_hint("phone-anna.json", BrokerRefused("tls", "certificate verify failed")) is None
    assert enrolment_refusal_hint("phone-anna.json", None) is None
