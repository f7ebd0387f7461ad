"""The app's Enrol (edge_client/app): a bundle fills every Federation field, a refused one changes nothing, and a phone joins.

Through the controllers, no window: :class:`DeviceController` (sensing in the app's process)
and :class:`RemoteController` (Android's UI, which hands the settings to the sensing
service). The scanner's Android side is driven with stand-ins of python-for-android's
``android.activity`` and pyjnius (the camera and the scanner app are hardware and software a
test machine does not have); off Android it says why and the file and paste imports remain.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import sys
import types
from pathlib import Path

import pytest
from support.polling import poll

from edge_client.app import scanner
from edge_client.app.controller import PASSWORD_FILE, AppConfig, DeviceController, enrolment_fields
from edge_client.app.service import RemoteController
from edge_client.sensors.base import ReplaySensor
from har_io.enrolment import EnrolmentBundle, EnrolmentRefused, pem_fingerprints
from har_models.data.hapt import read_hapt_recordings
from har_models.data.labels import HAPT_LABELS

ROOT = Path(__file__).resolve().parents[1]
SECRET = "app-secret-Qm4"


def _bundle(**over: object) -> EnrolmentBundle:
    kw: dict = dict(coordinator="fedhar-home", federation="home", client_id="phone-anna", password=SECRET, host="127.0.0.1", port=8883)
    kw.update(over)
    return EnrolmentBundle(**kw)




def _controller(state: Path, **cfg_kw) -> tuple[DeviceController, list]:
    rec = read_hapt_recordings(ROOT / "datasets" / "hapt" / "user01.npz")[0]
    cfg = AppConfig(state_dir=state, labels=HAPT_LABELS, client_id="localhost", broker="127.0.0.1:1", **cfg_kw)
    views: list = []
    ctl = DeviceController(
        cfg, ReplaySensor(rec, speed=None, loop=False), on_federation=views.append, charging=lambda: True, supervise_s=0.1
    )
    return ctl, views


@pytest.mark.slow
def test_a_bundle_fills_the_same_fields_as_typing_them(pki, tmp_path):
    ca, _ = pki
    b = _bundle(tls_ca_pem=ca.read_text())
    got, fields = enrolment_fields(tmp_path, b.to_json())
    assert got == b
    ca_copy = tmp_path / "credentials" / "home.phone-anna.ca.pem"
    assert fields == {"client_id": "phone-anna", "broker": "127.0.0.1:8883", "federation": "home", "username": "phone-anna",
                      "password": SECRET, "tls_ca": str(ca_copy), "enrolled": True}  # fmt: skip
    assert ca_copy.read_text() == ca.read_text() and stat.S_IMODE(os.stat(ca_copy.parent).st_mode) == 0o700


def test_enrol_from_a_file_or_pasted_text_sets_every_field_and_keeps_the_password_private(pki, tmp_path, caplog):
    ca, _ = pki
    b = _bundle(tls_ca_pem=ca.read_text())
    (tmp_path / "phone-anna.json").write_text(b.to_json())
    caplog.set_level(logging.DEBUG)
    ctl, _ = _controller(tmp_path / "state")
    try:
        assert ctl.enrol(tmp_path / "phone-anna.json") == b
        v = ctl.federation
        assert (v.client_id, v.broker, v.federation, v.username, v.password_set) == (
            "phone-anna",
            "127.0.0.1:8883",
            "home",
            "phone-anna",
            True,
        )
        assert v.tls_ca == str(tmp_path / "state" / "credentials" / "home.phone-anna.ca.pem")
        pw = tmp_path / "state" / PASSWORD_FILE
        assert pw.read_text() == SECRET and stat.S_IMODE(os.stat(pw).st_mode) == 0o600
        assert ctl.cfg.password_file == pw and ctl.cfg.tls_ca == Path(v.tls_ca)
        # pasted text (a single-line field turns its line breaks into spaces) of another device's bundle
        other = _bundle(client_id="phone-ben", federation="family", password="ben-pw", tls_ca_pem=ca.read_text())
        ctl.enrol(other.to_json().replace("\n", " "))
        assert (ctl.federation.client_id, ctl.federation.federation) == ("phone-ben", "family")
        assert pw.read_text() == "ben-pw"
    finally:
        ctl.close()
    assert "enrolled: client phone-anna of federation home (coordinator 'fedhar-home') at 127.0.0.1:8883" in caplog.text
    assert SECRET not in caplog.text and "ben-pw" not in caplog.text


def test_a_refused_bundle_names_its_reason_and_changes_nothing(pki, tmp_path):
    ca, other = pki
    ctl, _ = _controller(tmp_path / "state")
    try:
        before = (ctl.cfg, ctl.federation.client_id)
        cases = [
            ("{not json", "bad_json"),
            (json.dumps({**_bundle().to_dict(), "version": 3}), "unknown_version"),
            (json.dumps({**_bundle().to_dict(), "port": "x"}), "bad_value"),
            (json.dumps({**_bundle(tls_ca_pem=ca.read_text()).to_dict(), "tls_ca_sha256": pem_fingerprints(other.read_text())[0]}),
             "ca_mismatch"),
        ]  # fmt: skip
        for text, reason in cases:
            with pytest.raises(EnrolmentRefused) as info:
                ctl.enrol(text)
            assert info.value.reason == reason and SECRET not in str(info.value)
        # a fingerprint-only bundle (a scanned code of a large CA) needs that CA, and refuses another
        fp = _bundle(tls_ca_sha256=pem_fingerprints(ca.read_text())[0]).to_json()
        with pytest.raises(EnrolmentRefused, match=r"by its SHA-256 .* only"):
            ctl.enrol(fp)
        with pytest.raises(EnrolmentRefused) as info:
            ctl.enrol(fp, ca_file=other)
        assert info.value.reason == "ca_mismatch"
        with pytest.raises(FileNotFoundError):
            ctl.enrol(str(tmp_path / "missing.json"))
        assert (ctl.cfg, ctl.federation.client_id) == before
        assert not (tmp_path / "state" / PASSWORD_FILE).exists()
        ctl.enrol(fp, ca_file=ca)
        assert ctl.federation.tls_ca == str(ca) and ctl.federation.client_id == "phone-anna"
    finally:
        ctl.close()


def test_the_android_ui_hands_the_bundle_to_the_service(pki, tmp_path):
    ca, _ = pki
    ui = RemoteController(AppConfig(state_dir=tmp_path, labels=HAPT_LABELS, client_id="localhost", broker="127.0.0.1:1"), poll_s=0.05)
    try:
        ui.enrol(_bundle(tls_ca_pem=ca.read_text()).to_json())
        settings = json.loads((tmp_path / "app_settings.json").read_text())
        assert (settings["client_id"], settings["username"], settings["federation"], settings["broker"]) == (
            "phone-anna", "phone-anna", "home", "127.0.0.1:8883")  # fmt: skip
        assert settings["tls_ca"] == str(tmp_path / "credentials" / "home.phone-anna.ca.pem")
        assert settings["password_file"] == str(tmp_path / PASSWORD_FILE) and SECRET not in json.dumps(settings)
    finally:
        ui.close()


def test_off_android_the_scanner_says_why_and_points_to_file_and_paste(monkeypatch):
    monkeypatch.setitem(sys.modules, "android", None)
    got: list = []
    assert scanner.start_scan(got.append) == scanner.NOT_ANDROID
    assert "import the bundle's .json file or paste its text" in scanner.NOT_ANDROID and got == []


class _FakeIntent:
    def __init__(self, action: str):
        self.action = action
        self.extras: dict[str, str] = {}

    def putExtra(self, key: str, value: str) -> None:  # noqa: N802 (Java's names)
        self.extras[key] = value

    def resolveActivity(self, pm: object) -> object | None:  # noqa: N802
        return "scanner" if pm == "has-scanner" else None


def _fake_android(monkeypatch, package_manager: str) -> dict:
    """Stand-ins of python-for-android's ``android.activity`` and of pyjnius' ``autoclass``."""
    seen: dict = {"listeners": [], "started": []}
    act = types.SimpleNamespace(
        getPackageManager=lambda: package_manager, startActivityForResult=lambda i, code: seen["started"].append((i, code))
    )
    classes = {"android.content.Intent": _FakeIntent, "org.kivy.android.PythonActivity": types.SimpleNamespace(mActivity=act)}
    activity = types.SimpleNamespace(bind=lambda on_activity_result: seen["listeners"].append(on_activity_result),
                                     unbind=lambda on_activity_result: seen["listeners"].remove(on_activity_result))  # fmt: skip
    monkeypatch.setitem(sys.modules, "android", types.SimpleNamespace(activity=activity))
    monkeypatch.setitem(sys.modules, "android.activity", activity)
    monkeypatch.setitem(sys.modules, "jnius", types.SimpleNamespace(autoclass=classes.__getitem__))
    return seen


def test_on_android_a_scan_asks_the_scanner_app_and_its_text_enrols(pki, tmp_path, monkeypatch):
    ca, _ = pki
    seen = _fake_android(monkeypatch, "no-scanner")
    assert scanner.start_scan(lambda t: None) == scanner.NO_SCANNER and seen["started"] == []
    seen = _fake_android(monkeypatch, "has-scanner")
    texts: list = []
    assert scanner.start_scan(texts.append) is None
    ((intent, code),) = seen["started"]
    assert (intent.action, intent.extras, code) == (
        "com.google.zxing.client.android.SCAN",
        {"SCAN_MODE": "QR_CODE_MODE"},
        scanner.REQUEST_CODE,
    )
    listener = seen["listeners"][0]
    listener(7, scanner.RESULT_OK, None)  # another request's answer: not ours
    assert texts == [] and seen["listeners"] == [listener]
    payload = _bundle(tls_ca_pem=ca.read_text()).to_json(indent=None)
    listener(scanner.REQUEST_CODE, scanner.RESULT_OK, types.SimpleNamespace(getStringExtra={"SCAN_RESULT": payload}.get))
    assert texts == [payload] and seen["listeners"] == []
    scanner.start_scan(texts.append)
    seen["listeners"][0](scanner.REQUEST_CODE, 0, None)  # RESULT_CANCELED
    assert texts[-1] is None
    _, fields = enrolment_fields(tmp_path, texts[0])
    assert fields["client_id"] == "phone-anna" and fields["password"] == SECRET


@pytest.mark.slow
@pytest.mark.mosquitto
def test_a_phone_enrolled_by_a_bundle_joins_the_tls_broker(tmp_path, tls_mosquitto):
    broker = tls_mosquitto("home", ["phone-anna"])
    ctl, views = _controller(tmp_path / "state", backend="numpy")
    try:
        ctl.start_recording("walking")
        assert poll(lambda: ctl.counts().get("walking", 0) >= 20, 60)
        ctl.stop_recording()
        b = _bundle(password=broker.password("phone-anna"), port=broker.tls_port, tls_ca_pem=broker.ca.read_text())
        ctl.enrol(b.to_json())
        ctl.set_charge_only(False)
        ctl.set_take_part(True)
        assert poll(lambda: views and views[-1].state == "connected" and views[-1].error == "", 60), views[-1:]
    finally:
        ctl.close()
    assert "u'phone-anna'" in broker.log.read_text()
