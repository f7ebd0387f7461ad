"""Enrolment bundles (har_io/enrolment.py): the round-trip, every refusal with its reason, and a password kept out of sight."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import ssl
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from har_io.enrolment import (
    BUNDLE_FORMAT,
    BUNDLE_VERSION,
    MAX_BUNDLE_BYTES,
    EnrolmentBundle,
    EnrolmentRefused,
    normalise_fingerprint,
    pem_fingerprints,
    read_bundle,
)

ROOT = Path(__file__).resolve().parents[1]
SECRET = "pw-Zq8#only-here"


def _bundle(**over: object) -> EnrolmentBundle:
    kw: dict = dict(coordinator="fedhar-home", federation="home", client_id="phone-anna", password=SECRET, host="nuc.local", port=8883)
    kw.update(over)
    return EnrolmentBundle(**kw)


def _doc(**over: object) -> dict:
    d = _bundle().to_dict()
    d.update(over)
    return d


def _refusal(text: str | bytes) -> EnrolmentRefused:
    with pytest.raises(EnrolmentRefused) as info:
        EnrolmentBundle.from_json(text)
    assert SECRET not in str(info.value)
    return info.value


@pytest.mark.slow
def test_a_bundle_round_trips_through_json_with_and_without_an_inline_ca(pki):
    ca, _ = pki
    plain = _bundle()
    assert EnrolmentBundle.from_json(plain.to_json()) == plain
    assert EnrolmentBundle.from_json(plain.to_json(indent=None).encode()) == plain
    tls = _bundle(tls_ca_pem=ca.read_text())
    back = EnrolmentBundle.from_json(tls.to_json())
    assert back == tls and back.tls_ca_pem == ca.read_text()
    doc = json.loads(tls.to_json())
    assert doc["format"] == BUNDLE_FORMAT == "fedhar-enrolment" and doc["version"] == BUNDLE_VERSION == 1
    assert doc["password"] == SECRET and doc["port"] == 8883 and "tls_ca_sha256" not in doc
    assert back.username == "phone-anna" and back.uses_tls and not plain.uses_tls


def test_the_fingerprint_is_the_sha256_of_the_der_certificate(pki):
    ca, _ = pki
    der = ssl.PEM_cert_to_DER_cert(ca.read_text())
    want = hashlib.sha256(der).hexdigest()
    assert pem_fingerprints(ca.read_text()) == [want]
    assert _bundle(tls_ca_pem=ca.read_text()).ca_fingerprint() == want
    colons = ":".join(want[i : i + 2] for i in range(0, 64, 2)).upper()
    assert normalise_fingerprint(f"sha256 Fingerprint={colons}") == want
    b = _bundle(tls_ca_sha256=colons)
    assert b.tls_ca_sha256 == want and b.ca_fingerprint() == want and b.uses_tls


@pytest.mark.parametrize(
    "text, reason, words",
    [
        ("{not json", "bad_json", "not JSON"),
        ('{"format": "fedhar-enrolment", "ver', "bad_json", "truncated"),
        ("[1, 2]", "bad_json", "JSON object, not a JSON list"),
        (b"\xff\xfe{}", "bad_json", "UTF-8"),
        ("x" * (MAX_BUNDLE_BYTES + 1), "bad_json", f"more than a bundle's {MAX_BUNDLE_BYTES}"),
    ],
)
def test_malformed_text_is_refused_as_bad_json(text, reason, words):
    exc = _refusal(text)
    assert exc.reason == reason and words in str(exc)
    assert str(exc).startswith(f"enrolment bundle refused ({reason}): ")


def test_an_unknown_version_names_the_versions_read_and_says_to_update():
    exc = _refusal(json.dumps(_doc(version=2)))
    assert exc.reason == "unknown_version"
    assert "bundle version 2" in str(exc) and "(version 1)" in str(exc) and "update the app" in str(exc)
    assert "pip install -U fedhar" not in str(exc) and " pull, then " in str(exc)  # fedhar is not on PyPI: the checkout is updated
    exc = _refusal(json.dumps(_doc(version=0)))
    assert exc.reason == "unknown_version"


def test_another_format_is_refused_as_an_unknown_version():
    exc = _refusal(json.dumps(_doc(format="fedhar-startup-kit")))
    assert exc.reason == "unknown_version" and "'fedhar-startup-kit' is not 'fedhar-enrolment'" in str(exc)
    d = _doc()
    del d["format"]
    assert _refusal(json.dumps(d)).reason == "unknown_version"


@pytest.mark.parametrize("key", ["version", "coordinator", "federation", "client_id", "password", "host", "port"])
def test_each_missing_field_is_named(key):
    d = _doc()
    del d[key]
    exc = _refusal(json.dumps(d))
    assert exc.reason == "missing_field" and f"'{key}'" in str(exc)


@pytest.mark.parametrize(
    "key, value, words",
    [
        ("port", "8883", "port must be int, not str"),
        ("port", True, "port must be int, not bool"),
        ("port", 0, "port 0 must be an integer in 1..65535"),
        ("port", 70000, "port 70000"),
        ("client_id", "anna's phone", 'client id "anna\'s phone" is invalid'),
        ("client_id", "", "client id '' is invalid"),
        ("client_id", 7, "client_id must be str, not int"),
        ("federation", "home/x", "federation 'home/x' is invalid"),
        ("host", "nuc local", "is not a host name"),
        ("password", "", "password must be a non-empty string"),
        ("password", "two\nlines", "one line"),
        ("coordinator", "", "coordinator '' must be 1-64"),
        ("version", "1", "version '1' must be an integer"),
        ("tls_ca_sha256", "abc", "not a SHA-256 fingerprint"),
        ("tls_ca_pem", "hello", "no '-----BEGIN CERTIFICATE-----' block"),
        ("tls_ca_pem", "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n", "not base64"),
    ],
)
def test_each_mistyped_or_bad_value_is_named(key, value, words):
    exc = _refusal(json.dumps(_doc(**{key: value})))
    assert exc.reason == "bad_value", exc
    assert words in str(exc)


def test_unknown_extra_keys_are_ignored():
    assert EnrolmentBundle.from_json(json.dumps(_doc(server_url="http://x", note="hi"))) == _bundle()


def test_check_refuses_another_federation_or_coordinator():
    b = _bundle()
    b.check(federation="home", coordinator="fedhar-home")
    b.check()
    with pytest.raises(EnrolmentRefused) as info:
        b.check(federation="office")
    assert info.value.reason == "wrong_federation" and "'home'" in str(info.value) and "'office'" in str(info.value)
    with pytest.raises(EnrolmentRefused) as info:
        b.check(coordinator="granny-nas")
    assert info.value.reason == "wrong_coordinator" and "'fedhar-home', not 'granny-nas'" in str(info.value)


def test_a_pin_that_does_not_match_the_inline_ca_is_refused(pki):
    ca, other = pki
    wrong = pem_fingerprints(other.read_text())[0]
    exc = _refusal(json.dumps(_doc(tls_ca_pem=ca.read_text(), tls_ca_sha256=wrong)))
    assert exc.reason == "ca_mismatch" and wrong in str(exc) and pem_fingerprints(ca.read_text())[0] in str(exc)
    right = pem_fingerprints(ca.read_text())[0]
    assert EnrolmentBundle.from_json(json.dumps(_doc(tls_ca_pem=ca.read_text(), tls_ca_sha256=right))).tls_ca_sha256 == right


def test_check_refuses_a_ca_file_of_another_ca(pki):
    ca, other = pki
    fp = pem_fingerprints(ca.read_text())[0]
    for b in (_bundle(tls_ca_sha256=fp), _bundle(tls_ca_pem=ca.read_text())):
        b.check(ca_file=ca)
        with pytest.raises(EnrolmentRefused) as info:
            b.check(ca_file=other)
        assert info.value.reason == "ca_mismatch" and str(other) in str(info.value) and fp in str(info.value)
    with pytest.raises(EnrolmentRefused) as info:
        _bundle().check(ca_file=ca)
    assert info.value.reason == "ca_mismatch" and "without TLS" in str(info.value)


def test_broker_config_writes_an_inline_ca_privately_and_logs_in_as_the_client(pki, tmp_path):
    ca, _ = pki
    b = _bundle(tls_ca_pem=ca.read_text(), host="127.0.0.1")
    cfg = b.broker_config(tmp_path / "ca", max_message_bytes=65536)
    written = Path(cfg.tls_ca or "")
    assert written == tmp_path / "ca" / "home.phone-anna.ca.pem" and written.read_text() == ca.read_text()
    assert stat.S_IMODE(os.stat(written).st_mode) == 0o600
    assert sorted(p.name for p in written.parent.iterdir()) == [written.name]  # no temporary file left behind
    assert (cfg.host, cfg.port, cfg.credentials(), cfg.max_message_bytes) == ("127.0.0.1", 8883, ("phone-anna", SECRET), 65536)
    ctx = cfg.tls_context()
    assert ctx is not None and ctx.check_hostname and ctx.verify_mode == ssl.CERT_REQUIRED
    plain = _bundle().broker_config(tmp_path / "none")
    assert plain.tls_ca is None and not (tmp_path / "none").exists()


def test_a_fingerprint_only_bundle_needs_the_matching_ca_file(pki, tmp_path):
    ca, other = pki
    b = _bundle(tls_ca_sha256=pem_fingerprints(ca.read_text())[0])
    with pytest.raises(EnrolmentRefused) as info:
        b.broker_config(tmp_path)
    assert info.value.reason == "missing_field" and "CA file" in str(info.value)
    assert b.broker_config(tmp_path, ca_file=ca).tls_ca == str(ca)
    with pytest.raises(EnrolmentRefused) as info:
        b.broker_config(tmp_path, ca_file=other)
    assert info.value.reason == "ca_mismatch"


def test_read_bundle_takes_a_file_or_pasted_text(tmp_path):
    b = _bundle()
    f = tmp_path / "phone-anna.json"
    f.write_text(b.to_json())
    assert read_bundle(f) == b and read_bundle(str(f)) == b
    assert read_bundle("  \n" + b.to_json()) == b
    with pytest.raises(FileNotFoundError):
        read_bundle(tmp_path / "missing.json")
    big = tmp_path / "big.json"
    big.write_bytes(b"{" + b" " * MAX_BUNDLE_BYTES + b"}")
    with pytest.raises(EnrolmentRefused) as info:
        read_bundle(big)
    assert info.value.reason == "bad_json"


def test_the_password_is_in_no_repr_str_log_or_error(pki, tmp_path, caplog):
    ca, other = pki
    b = _bundle(tls_ca_pem=ca.read_text())
    cfg = b.broker_config(tmp_path)
    log = logging.getLogger("fedhar.test")
    with caplog.at_level(logging.DEBUG):
        log.info("bundle %s / %r", b, b)
        log.info("broker %s / %r", cfg, cfg)
        for bad in (dict(port=0), dict(client_id="a b"), dict(version=9), dict(tls_ca_sha256=pem_fingerprints(other.read_text())[0])):
            try:
                EnrolmentBundle.from_json(json.dumps({**b.to_dict(), **bad}))
            except EnrolmentRefused as exc:
                log.warning("refused: %s", exc)
        for call in (lambda: b.check(federation="x"), lambda: b.check(coordinator="y"), lambda: b.check(ca_file=other)):
            try:
                call()
            except EnrolmentRefused as exc:
                log.warning("refused: %s", exc)
    assert len(caplog.records) == 9
    assert SECRET not in caplog.text and SECRET not in repr(b) and SECRET not in str(cfg)
    assert "phone-anna" in caplog.text  # the logs did name the bundle


def test_the_module_imports_without_torch_numpy_or_paho():
    """A phone or a board reads bundles before anything heavy is installed: standard library only."""
    code = (
        "import sys\nfor n in ('torch', 'numpy', 'paho', 'safetensors', 'scipy', 'kivy'):\n    sys.modules[n] = None\n"
        "import har_io.enrolment as e\nprint(e.EnrolmentBundle.from_json(sys.argv[1]).client_id)\n"
    )
    r = subprocess.run([sys.executable, "-c", code, _bundle().to_json()], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "phone-anna", r.stderr


def test_the_script_entry_prints_fields_as_shell_and_writes_the_parts(pki, tmp_path):
    ca, other = pki
    b = _bundle(coordinator="Anna's NUC", tls_ca_pem=ca.read_text())
    path = tmp_path / "b.json"
    path.write_text(b.to_json())
    run = [sys.executable, "-m", "har_io.enrolment", str(path)]
    r = subprocess.run([*run, "--shell"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    show = '\nprintf "%s|" "$client_id" "$federation" "$broker" "$coordinator" "$tls" "$ca_sha256"'
    fields = subprocess.run(["bash", "-c", r.stdout + show], capture_output=True, text=True, timeout=10).stdout
    assert fields == f"phone-anna|home|nuc.local:8883|Anna's NUC|inline|{pem_fingerprints(ca.read_text())[0]}|"
    assert SECRET not in r.stdout + r.stderr
    r = subprocess.run([*run, "--write-password", str(tmp_path / "etc" / "pw"), "--write-ca", str(tmp_path / "etc" / "ca.crt")],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0 and r.stdout == "", r.stderr
    assert (tmp_path / "etc" / "pw").read_text() == SECRET and stat.S_IMODE(os.stat(tmp_path / "etc" / "pw").st_mode) == 0o600
    assert (tmp_path / "etc" / "ca.crt").read_text() == ca.read_text() and stat.S_IMODE(
        os.stat(tmp_path / "etc" / "ca.crt").st_mode
    ) == 0o644
    r = subprocess.run([*run, "--prog", "setup", "--tls-ca", str(other), "--write-password", str(tmp_path / "p2")],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 2 and r.stderr.startswith(f"setup: {path}: enrolment bundle refused (ca_mismatch)")
    assert not (tmp_path / "p2").exists() and SECRET not in r.stderr
