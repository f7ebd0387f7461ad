"""A device started with its enrolment bundle alone learns, when the broker refuses its login, what happened and the fix.

The link's own message names --username and --password-file, which such a device never gave.
"""

from __future__ import annotations

from edge_client.cli import enrolment_refusal_hint
from har_io.mqtt_link import BrokerRefused


def test_a_refused_bundle_login_names_the_fix_its_history_calls_for() -> None:
    refused = BrokerRefused("auth", "refused the login of user 'phone-anna'")
    # Never accepted: the bundle is not the device's current one; the fix is a re-issue, not a new name.
    first = enrolment_refusal_hint("phone-anna.json", refused, "phone-anna", accepted_before=False)
    assert first is not None and first.startswith("phone-anna.json: ") and "fedhar-coordinator reissue phone-anna" in first
    assert "NEW-NAME" not in first and "revoked" not in first
    # Taken part before: re-issued, renamed or revoked since, each with its own fix.
    later = enrolment_refusal_hint("phone-anna.json", refused, "phone-anna", accepted_before=True)
    assert later is not None and "fedhar-coordinator devices says which" in later
    assert "Revoked: the name stays refused" in later and "fedhar-coordinator enrol NEW-NAME" in later


def test_no_hint_without_a_bundle_or_for_another_refusal() -> None:
    assert enrolment_refusal_hint(None, BrokerRefused("auth", "x")) is None
    assert enrolment_refusal_hint("phone-anna.json", BrokerRefused("tls", "certificate verify failed")) is None
    assert enrolment_refusal_hint("phone-anna.json", None) is None


def _bundle(**over: object):
    from har_io.enrolment import EnrolmentBundle

    kw: dict = dict(coordinator="fedhar-home", federation="home", client_id="phone-anna", password="pw-1", host="homeserver", port=1883)
    kw.update(over)
    return EnrolmentBundle(**kw)


def test_the_links_own_words_for_a_bundles_refused_login_ask_for_a_new_bundle(tmp_path) -> None:
    from har_io.broker_config import BrokerConfig
    from har_io.mqtt_link import login_refused

    bundled = _bundle().broker_config(tmp_path)
    assert bundled.enrolled
    words = login_refused(bundled, "Bad user name or password")
    assert "refused the login of user 'phone-anna'" in words and "ask the server's operator for a new bundle" in words.lower()
    assert "--password-file" not in words and "--username" not in words
    typed = login_refused(BrokerConfig(host="homeserver", port=1883, username="pi-den", password="x"), "Not authorized")
    assert "Check --username and --password-file" in typed and "bundle" not in typed


def test_the_apps_words_follow_where_the_password_came_from(tmp_path) -> None:
    from edge_client.app.controller import ENROLLED_MARK, AppConfig, describe_refusal, enrolment_fields, federation_fields
    from har_models.data.labels import LABEL_SETS

    _, fields = enrolment_fields(tmp_path, _bundle().to_json())
    cfg = AppConfig(state_dir=tmp_path, labels=LABEL_SETS["hapt6"], client_id="phone-anna", username="phone-anna")
    cfg = AppConfig(**{**cfg.__dict__, **federation_fields(tmp_path, fields)})
    assert (tmp_path / ENROLLED_MARK).is_file()
    words = describe_refusal("auth", "refused", cfg)
    assert "fedhar-coordinator reissue phone-anna" in words and "check the user name and password" not in words
    # a password typed by hand afterwards: the person who typed it checks it
    cfg = AppConfig(**{**cfg.__dict__, **federation_fields(tmp_path, {"password": "typed"})})
    assert not (tmp_path / ENROLLED_MARK).exists()
    words = describe_refusal("auth", "refused", cfg)
    assert words.endswith("check the user name and password") and "bundle" not in words
