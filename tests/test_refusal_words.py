"""Each wrong-bundle, wrong-CA, revoked, re-issued and renamed case gets the words and the fix it needs, on the phone and the board.

One test per message: the broker refuses a bundle it never accepted (re-issue it) or one it
accepted before (re-issued, renamed or revoked since: the operator's ``devices`` says which); a
bundle's CA does not sign the broker's certificate (the bundle is for another broker: a new
bundle, and no ``--tls-ca`` the person never gave); a certificate request is refused (name
revoked, name taken, operator's no). Where the words come from a real broker, a real Mosquitto
with TLS and per-device accounts answers.
"""

from __future__ import annotations

import pytest

from edge_client.app.config import ACCEPTED_MARK, AppConfig
from edge_client.app.federation_words import describe_refusal
from edge_client.app.joining import enrolment_fields, federation_fields, note_accepted
from har_io.enrolment import EnrolmentBundle
from har_io.mqtt_link import MqttLink
from har_io.refusal_words import bundle_login_refused, bundle_wrong_ca, certificate_refused
from har_models.data.labels import LABEL_SETS


def _enrolled_app(tmp_path, bundle: EnrolmentBundle) -> AppConfig:
    _, fields = enrolment_fields(tmp_path, bundle.to_json())
    cfg = AppConfig(state_dir=tmp_path, labels=LABEL_SETS["hapt6"], client_id="localhost")
    return AppConfig(**{**cfg.__dict__, **federation_fields(tmp_path, fields)})


def test_a_bundle_the_broker_never_accepted_is_to_be_reissued_not_renamed(tmp_path):
    cfg = _enrolled_app(tmp_path, EnrolmentBundle("fedhar-home", "home", "phone-anna", "pw-1", "homeserver", 1883))
    words = describe_refusal("auth", "Not authorized", cfg)
    assert words == (
        "login refused: the broker refused the password of 'phone-anna''s enrolment bundle at its first use: the bundle is not the "
        "current one for 'phone-anna' (an older copy, or one written before the device was re-issued). Ask the server's operator "
        "to re-issue it (fedhar-coordinator reissue phone-anna) and enrol with the new bundle"
    )
    assert "NEW-NAME" not in words and "revoked" not in words


def test_a_bundle_accepted_before_was_reissued_renamed_or_revoked_each_with_its_fix(tmp_path):
    cfg = _enrolled_app(tmp_path, EnrolmentBundle("fedhar-home", "home", "phone-anna", "pw-1", "homeserver", 1883))
    note_accepted(tmp_path)  # the broker took this bundle once (the controller marks it when its agent connects)
    words = describe_refusal("auth", "Not authorized", cfg)
    assert words == "login refused: " + bundle_login_refused("phone-anna", accepted_before=True)
    assert "fedhar-coordinator devices says which" in words
    assert "Re-issued: enrol with the new bundle of 'phone-anna'" in words
    assert "Renamed: enrol with the bundle of its new name" in words
    assert "Revoked: the name stays refused; the device joins again only under a new name (fedhar-coordinator enrol NEW-NAME)" in words
    # A new bundle (re-issued): not accepted yet, so its refusal reads as a first use again.
    _enrolled_app(tmp_path, EnrolmentBundle("fedhar-home", "home", "phone-anna", "pw-2", "homeserver", 1883))
    assert not (tmp_path / ACCEPTED_MARK).exists()


def test_a_typed_password_and_a_typed_ca_are_for_the_typist_to_check(tmp_path):
    cfg = AppConfig(state_dir=tmp_path, labels=LABEL_SETS["hapt6"], client_id="pi-den", username="pi-den", tls_ca=tmp_path / "ca.crt")
    assert describe_refusal("auth", "x", cfg) == (
        "login refused: the broker does not accept user 'pi-den' with this password; check the user name and password"
    )
    assert describe_refusal("tls", "certificate verify failed", cfg) == (
        f"wrong CA certificate: the broker's certificate is not signed by {tmp_path / 'ca.crt'}; choose the CA that signed it"
    )


def test_certificate_requests_refused_name_the_fix():
    assert certificate_refused("board-2", "name_revoked") == (
        "the server refused 'board-2': the name was revoked for good and is never enrolled again; ask under a new name "
        "(--client-id NEW-NAME)"
    )
    taken = certificate_refused("board-2", "name_taken")
    assert "fedhar-coordinator reissue board-2), then ask again with --new-key" in taken and "Another device's: ask under another" in taken
    assert certificate_refused("board-2", "refused") == (
        "the server's operator refused the request for 'board-2'; ask them why, or ask under another name"
    )


@pytest.mark.slow
def test_a_real_broker_refusing_a_bundle_for_its_ca_or_its_password_names_the_bundle(tmp_path, tls_mosquitto):
    from edge_client.cli import enrolment_refusal_hint

    broker = tls_mosquitto("home", ["phone-anna"])
    # A bundle whose inline CA did not sign the broker's certificate: its CA is not a --tls-ca the person gave.
    wrong = EnrolmentBundle("fedhar-home", "home", "phone-anna", broker.password("phone-anna"), "127.0.0.1", broker.tls_port,
                            tls_ca_pem=broker.wrong_ca.read_text())  # fmt: skip
    link = MqttLink(wrong.broker_config(tmp_path / "wrong"), "t-wrong-ca")
    try:
        assert not link.start(10.0)
        assert link.fatal is not None and link.fatal.kind == "tls"
        text = str(link.fatal)
        assert bundle_wrong_ca("phone-anna", str(tmp_path / "wrong" / "home.phone-anna.ca.pem")) in text and "--tls-ca" not in text
    finally:
        link.stop()
    cfg = _enrolled_app(tmp_path / "app", wrong)
    assert describe_refusal("tls", text, cfg) == "wrong CA certificate: " + bundle_wrong_ca("phone-anna", str(cfg.tls_ca))
    # The right CA, a password the broker never had: the client's hint says re-issue.
    stale = EnrolmentBundle("fedhar-home", "home", "phone-anna", "not-the-password", "127.0.0.1", broker.tls_port,
                            tls_ca_pem=broker.ca.read_text())  # fmt: skip
    link = MqttLink(stale.broker_config(tmp_path / "stale"), "t-stale")
    try:
        assert not link.start(10.0)
        assert link.fatal is not None and link.fatal.kind == "auth"
        assert enrolment_refusal_hint("phone-anna.json", link.fatal, "phone-anna") == (
            "phone-anna.json: " + bundle_login_refused("phone-anna", accepted_before=False)
        )
    finally:
        link.stop()
