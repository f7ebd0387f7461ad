"""``fedhar-client --enrolment FILE``: the bundle gives the broker, TLS CA, federation, id and password; contradictions are refused.

The last test joins a real Mosquitto (TLS, ACL, one account per device, as
firmware_scripts/mosquitto_config.py writes it) with nothing but the bundle.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edge_client.cli import PreparedClient, prepare
from har_io.enrolment import EnrolmentBundle, pem_fingerprints

ROOT = Path(__file__).resolve().parents[1]
HAPT = ROOT / "datasets" / "hapt" / "user01.npz"
SECRET = "cli-secret-6f1b"


def _write(tmp: Path, **over: object) -> Path:
    kw: dict = dict(coordinator="fedhar-home", federation="home", client_id="pi-den", password=SECRET, host="127.0.0.1", port=8883)
    kw.update(over)
    path = tmp / "pi-den.json"
    path.write_text(EnrolmentBundle(**kw).to_json())
    return path


def _prepare(tmp: Path, bundle: Path, *extra: str) -> PreparedClient | int:
    return prepare(["--enrolment", str(bundle), "--source", f"hapt:{HAPT}", "--state-dir", str(tmp / "state"), "--backend", "numpy",
                    *extra])  # fmt: skip


@pytest.mark.slow
def test_the_bundle_alone_sets_the_broker_login_tls_and_federation(pki, tmp_path, caplog):
    ca, _ = pki
    with caplog.at_level(logging.INFO):
        client = _prepare(tmp_path, _write(tmp_path, tls_ca_pem=ca.read_text()))
    assert isinstance(client, PreparedClient)
    try:
        cfg = client.cfg
        assert (cfg.client_id, cfg.federation) == ("pi-den", "home")
        assert (cfg.broker.address, cfg.broker.credentials()) == ("127.0.0.1:8883", ("pi-den", SECRET))
        assert cfg.broker.tls_ca == str(tmp_path / "state" / "enrolment" / "home.pi-den.ca.pem")
        assert Path(cfg.broker.tls_ca).read_text() == ca.read_text()
    finally:
        client.store.close()
    assert (
        f"coordinator 'fedhar-home', federation 'home', broker 127.0.0.1:8883 (TLS, CA sha256 {pem_fingerprints(ca.read_text())[0]})"
        in (caplog.text)
    )
    assert SECRET not in caplog.text


def test_options_that_agree_with_the_bundle_are_accepted(pki, tmp_path):
    ca, _ = pki
    (tmp_path / "pw").write_text(SECRET + "\n")
    client = _prepare(
        tmp_path,
        _write(tmp_path, tls_ca_sha256=pem_fingerprints(ca.read_text())[0]),
        *("--client-id", "pi-den", "--federation", "home", "--broker", "127.0.0.1:8883", "--username", "pi-den"),
        *("--password-file", str(tmp_path / "pw"), "--tls-ca", str(ca), "--max-message-bytes", "65536"),
    )
    assert isinstance(client, PreparedClient)
    client.store.close()
    assert client.cfg.broker.tls_ca == str(ca) and client.cfg.broker.max_message_bytes == 65536  # the fingerprint's CA file


@pytest.mark.parametrize(
    "extra, words",
    [
        (("--client-id", "pi-kitchen"), "--client-id pi-kitchen contradicts the bundle's client id pi-den"),
        (("--federation", "office"), "(wrong_federation): the bundle is for federation 'home', this device is set up for 'office'"),
        (("--broker", "10.0.0.2:8883"), "--broker 10.0.0.2:8883 contradicts the bundle's broker 127.0.0.1:8883"),
        (("--username", "coordinator"), "--username coordinator contradicts the bundle, which logs in as pi-den"),
        (("--password-file", "{pw}"), "holds another password than the bundle"),
    ],
)
def test_options_that_contradict_the_bundle_are_refused_with_exit_2(tmp_path, capsys, extra, words):
    (tmp_path / "pw").write_text("another")
    rc = _prepare(tmp_path, _write(tmp_path), *(e.format(pw=tmp_path / "pw") for e in extra))
    assert rc == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fedhar-client: {tmp_path / 'pi-den.json'}: enrolment bundle refused (") and words in err
    assert SECRET not in err and not (tmp_path / "state").exists()


def test_a_ca_file_of_another_ca_is_refused(pki, tmp_path, capsys):
    ca, other = pki
    assert _prepare(tmp_path, _write(tmp_path, tls_ca_pem=ca.read_text()), "--tls-ca", str(other)) == 2
    err = capsys.readouterr().err
    assert "(ca_mismatch): the CA file" in err and str(other) in err


def test_a_fingerprint_only_bundle_without_its_ca_file_is_refused(pki, tmp_path, capsys):
    ca, _ = pki
    assert _prepare(tmp_path, _write(tmp_path, tls_ca_sha256=pem_fingerprints(ca.read_text())[0])) == 2
    assert "(missing_field): the bundle names the broker's CA by its SHA-256" in capsys.readouterr().err


@pytest.mark.parametrize(
    "text, reason",
    [('{"format": "fedhar-enrolment", ', "bad_json"), ('{"format": "fedhar-enrolment", "version": 7}', "unknown_version")],
)
def test_a_malformed_or_newer_bundle_is_refused_with_its_reason(tmp_path, capsys, text, reason):
    (tmp_path / "b.json").write_text(text)
    assert _prepare(tmp_path, tmp_path / "b.json") == 2
    assert f"enrolment bundle refused ({reason})" in capsys.readouterr().err


def test_a_missing_bundle_or_id_is_a_usage_error(tmp_path, capsys):
    assert _prepare(tmp_path, tmp_path / "nope.json") == 2
    assert f"cannot read the enrolment bundle {tmp_path / 'nope.json'}: No such file or directory" in capsys.readouterr().err
    assert prepare(["--source", f"hapt:{HAPT}", "--state-dir", str(tmp_path / "s")]) == 2
    assert "give --client-id (the device's id), or --enrolment FILE" in capsys.readouterr().err


def test_without_a_bundle_the_defaults_are_unchanged(tmp_path):
    client = prepare(["--client-id", "a", "--source", f"hapt:{HAPT}", "--state-dir", str(tmp_path / "s"), "--backend", "numpy"])
    assert isinstance(client, PreparedClient)
    client.store.close()
    assert (client.cfg.federation, client.cfg.broker.address, client.cfg.broker.credentials()) == ("default", "127.0.0.1:1883", None)


def _wait_for(path: Path, text: str, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if text in path.read_text(errors="replace"):
            return True
        time.sleep(0.2)
    return False


@pytest.mark.slow
@pytest.mark.mosquitto
def test_a_client_joins_a_tls_broker_with_its_bundle_alone(tmp_path, tls_mosquitto):
    """The client logs in over TLS as its own account; a bundle with a stale password is refused by the broker (exit 4)."""
    broker = tls_mosquitto("home", ["pi-den"])
    good = EnrolmentBundle("fedhar-home", "home", "pi-den", broker.password("pi-den"), "127.0.0.1", broker.tls_port,
                           tls_ca_pem=broker.ca.read_text())  # fmt: skip
    (tmp_path / "good.json").write_text(good.to_json())
    cmd = [sys.executable, "-m", "edge_client.cli", "--enrolment", str(tmp_path / "good.json"), "--source", f"hapt:{HAPT}",
           "--state-dir", str(tmp_path / "state"), "--backend", "numpy", "--max-seconds", "6"]  # fmt: skip
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    log = broker.log.read_text()
    assert f"on port {broker.tls_port}" in log and "as pi-den" in log and "u'pi-den'" in log, log[-3000:]
    assert _wait_for(broker.log, "Received PUBLISH from pi-den", 5) and "fedhar/v1/home/client/pi-den/status" in broker.log.read_text()
    stale = EnrolmentBundle("fedhar-home", "home", "pi-den", "an-old-password", "127.0.0.1", broker.tls_port,
                            tls_ca_pem=broker.ca.read_text())  # fmt: skip
    (tmp_path / "stale.json").write_text(stale.to_json())
    cmd[cmd.index("--enrolment") + 1] = str(tmp_path / "stale.json")
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 4, r.stderr[-3000:]
    for text in (r.stdout, r.stderr):
        assert broker.password("pi-den") not in text and "an-old-password" not in text
