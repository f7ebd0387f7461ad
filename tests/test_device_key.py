"""Enrolment by certificate without a broker: the device's key, request and code, the messages, the device CA, the broker's rules.

Known answers: the code and fingerprint of a fixed 91-byte key were computed with coreutils
(``sha256sum`` and ``base32``), not with the code under test. The certificate checks are openssl's own.
"""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from coordinator.broker import device_ca
from coordinator.broker.render import acl_text, config_text
from coordinator.broker.settings import BrokerSettings, SetupError, check_settings
from edge_client import cert_enrol
from har_io.cert_enrolment import EnrolmentMessageError, EnrolReply, EnrolRequest, Invitation
from har_io.device_key import (
    P256_SPKI_PREFIX,
    DeviceKeyError,
    certificate_subject_cn,
    csr_public_key,
    enrolment_code,
    key_fingerprint,
    key_public_der,
    make_csr,
    make_key,
    normalise_code,
)
from har_io.enrolment import pem_fingerprints

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")

FIXED_SPKI = P256_SPKI_PREFIX + b"\x04" + bytes(range(64))


def _openssl(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=30, cwd=cwd)


def test_code_and_fingerprint_of_a_known_key() -> None:
    # sha256sum: 0131dda9654fef86...; base32 of the digest: AEY53KLFJ7XYNVLY...
    assert enrolment_code(FIXED_SPKI) == "AEY53-KLFJ7"
    assert key_fingerprint(FIXED_SPKI) == "0131 dda9 654f ef86 d578 12b9 960f 2605 23c2 7a40 c3a1 8fa8 ecc7 3035 10e7 8c22"


@pytest.mark.parametrize("typed", ["AEY53-KLFJ7", "aey53klfj7", " aey53 - klfj7 "])
def test_a_code_is_read_in_any_case_with_or_without_dashes(typed: str) -> None:
    assert normalise_code(typed) == "AEY53-KLFJ7"


def test_digits_that_look_like_letters_are_read_as_the_letters() -> None:
    assert normalise_code("00000-11188") == "OOOOO-IIIBB"


@pytest.mark.parametrize("bad", ["", "AEY53-KLFJ", "AEY53-KLFJ77", "AEY53-KLFJ9", "AEY53/KLFJ7"])
def test_a_malformed_code_is_refused_with_the_form_expected(bad: str) -> None:
    with pytest.raises(DeviceKeyError, match="expected 10 letters and digits 2-7"):
        normalise_code(bad)


def test_key_request_and_code_agree_and_the_key_is_private(tmp_path: Path) -> None:
    key = make_key(tmp_path / "device.key")
    assert key.stat().st_mode & 0o777 == 0o600
    csr = make_csr(key, "phone-anna")
    spki = key_public_der(key)
    assert len(spki) == 91 and spki.startswith(P256_SPKI_PREFIX)
    assert csr_public_key(csr) == spki
    with pytest.raises(DeviceKeyError, match="never replaced"):
        make_key(key)
    assert key.stat().st_size > 0


def test_an_altered_request_fails_its_own_signature(tmp_path: Path) -> None:
    csr = make_csr(make_key(tmp_path / "device.key"), "phone-anna")
    body = "".join(csr.strip().splitlines()[1:-1])
    der = base64.b64decode(body)
    assert der.count(b"phone-anna") == 1
    forged = base64.encodebytes(der.replace(b"phone-anna", b"phone-bobb")).decode()
    with pytest.raises(DeviceKeyError, match="signature does not verify"):
        csr_public_key(f"-----BEGIN CERTIFICATE REQUEST-----\n{forged}-----END CERTIFICATE REQUEST-----\n")


def test_an_rsa_request_is_refused(tmp_path: Path) -> None:
    r = _openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", str(tmp_path / "k"), "-subj", "/CN=x")
    assert r.returncode == 0, r.stderr
    with pytest.raises(DeviceKeyError, match="not an EC P-256 key"):
        csr_public_key(r.stdout)


def test_messages_round_trip_and_bad_ones_name_their_defect() -> None:
    req = EnrolRequest("phone-anna", "-----BEGIN CERTIFICATE REQUEST-----\nAA==\n-----END CERTIFICATE REQUEST-----\n")
    assert EnrolRequest.from_bytes(req.to_bytes()) == req
    rep = EnrolReply("phone-anna", refused="name_taken")
    assert EnrolReply.from_bytes(rep.to_bytes()) == rep
    with pytest.raises(EnrolmentMessageError, match="not a fedhar-enrol-request"):
        EnrolRequest.from_bytes(rep.to_bytes())
    with pytest.raises(EnrolmentMessageError, match="version 2"):
        EnrolRequest.from_bytes(req.to_bytes().replace(b'"version":1', b'"version":2'))
    with pytest.raises(EnrolmentMessageError, match="client id"):
        EnrolRequest.from_bytes(req.to_bytes().replace(b"phone-anna", b"phone/anna"))
    with pytest.raises(EnrolmentMessageError, match="more than the 16384"):
        EnrolRequest.from_bytes(b" " * 20000)
    with pytest.raises(EnrolmentMessageError, match="exactly one of"):
        EnrolReply("phone-anna")


def _ca(tmp_path: Path) -> tuple[str, str]:
    r = _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2", "-subj", "/CN=t",
                 "-keyout", str(tmp_path / "ca.key"), "-out", str(tmp_path / "ca.crt"))  # fmt: skip
    assert r.returncode == 0, r.stderr
    pem = (tmp_path / "ca.crt").read_text()
    return pem, pem_fingerprints(pem)[0]


def test_an_invitation_round_trips_and_its_ca_must_be_the_pinned_one(tmp_path: Path) -> None:
    pem, pin = _ca(tmp_path)
    inv = Invitation("home-server", "home", "nuc.local", 8883, 8884, "enrol", "s3cret-enrol", pin.upper(), pem)
    assert inv.tls_ca_sha256 == pin
    assert Invitation.from_json(inv.to_json()) == inv
    assert "s3cret" not in repr(inv)
    (tmp_path / "o").mkdir()
    other, _ = _ca(tmp_path / "o")
    with pytest.raises(EnrolmentMessageError, match="not the CA of tls_ca_sha256"):
        Invitation("home-server", "home", "nuc.local", 8883, 8884, "enrol", "x", pin, other)
    with pytest.raises(EnrolmentMessageError, match="device_port 0 is not a TCP port"):
        Invitation("home-server", "home", "nuc.local", 8883, 0, "enrol", "x", pin)


def test_the_device_ca_signs_for_the_name_given_and_revokes(tmp_path: Path) -> None:
    out = tmp_path / "broker"
    assert device_ca.ensure_device_ca(out, "home") is True
    assert device_ca.ensure_device_ca(out, "home") is False  # kept: a second run never makes another CA
    p = device_ca.paths(out)
    assert p["key"].stat().st_mode & 0o777 == 0o600 and p["crl"].stat().st_mode & 0o777 == 0o644
    key = make_key(tmp_path / "device.key")
    pem = device_ca.sign_device(out, make_csr(key, "asks-for-this"), "phone-anna")
    assert certificate_subject_cn(pem) == "phone-anna"  # the name approved, not the one asked for
    crt = device_ca.issued(out, "phone-anna")
    assert crt is not None and crt.read_text() == pem
    text = _openssl("x509", "-in", str(crt), "-noout", "-text").stdout
    assert "TLS Web Client Authentication" in text and "CA:FALSE" in text
    assert _openssl("verify", "-CAfile", str(p["crt"]), str(crt)).returncode == 0
    kept = tmp_path / "phone-anna.crt"
    kept.write_text(pem)
    assert device_ca.revoke_device(out, "phone-anna") is True
    assert device_ca.issued(out, "phone-anna") is None
    assert device_ca.revoke_device(out, "phone-anna") is False
    r = _openssl("verify", "-crl_check", "-CRLfile", str(p["crl"]), "-CAfile", str(p["crt"]), str(kept))
    assert r.returncode != 0 and "certificate revoked" in r.stdout + r.stderr
    with pytest.raises(SetupError, match="no device CA"):
        device_ca.sign_device(tmp_path / "elsewhere", make_csr(key, "x"), "x")


def test_the_broker_rules_of_a_folder_with_device_certificates(tmp_path: Path) -> None:
    for name in ("s.crt", "s.key", "ca.crt"):
        (tmp_path / name).write_text("x")
    s = check_settings(BrokerSettings("home", tls_cert=str(tmp_path / "s.crt"), tls_key=str(tmp_path / "s.key"),
                                      tls_ca=str(tmp_path / "ca.crt"), device_cert_port=8884))  # fmt: skip
    conf = config_text(s, tmp_path)
    listener = conf[conf.index("listener 8884"):]
    for line in ("require_certificate true", "use_identity_as_username true", "use_username_as_clientid true",
                 f"cafile {tmp_path / 'tls' / 'devices-ca.crt'}", f"crlfile {tmp_path / 'tls' / 'devices.crl'}"):  # fmt: skip
        assert f"\n{line}\n" in listener
    acl = acl_text(s, ["phone-anna"])
    enrol = re.search(r"\nuser enrol\n((?:topic .*\n)+)", acl)
    assert enrol is not None
    assert enrol.group(1).splitlines() == ["topic write fedhar/v1/home/enrol/+", "topic read fedhar/v1/home/enrol/+/reply",
                                           "topic read fedhar/v1/home/ca"]  # fmt: skip
    assert "enrol" in s.service_users and "enrol-desk" in s.service_users
    with pytest.raises(SetupError, match="--device-cert-port needs --tls-cert"):
        check_settings(BrokerSettings("home", device_cert_port=8884))
    with pytest.raises(SetupError, match="other than --port and --tls-port"):
        check_settings(BrokerSettings("home", tls_cert=str(tmp_path / "s.crt"), tls_key=str(tmp_path / "s.key"), device_cert_port=8883))


def test_a_device_keeps_only_a_certificate_of_its_own_key_and_name(tmp_path: Path) -> None:
    out = tmp_path / "broker"
    device_ca.ensure_device_ca(out, "home")
    prep = cert_enrol.Prepared(tmp_path / "dev", "phone-anna", "", "", "")
    key = make_key(tmp_path / "dev" / "device.key")
    other = make_key(tmp_path / "other.key")
    foreign = device_ca.sign_device(out, make_csr(other, "phone-anna"), "phone-anna")
    with pytest.raises(cert_enrol.EnrolmentNotApproved, match="not this device's"):
        cert_enrol.store_certificate(prep, EnrolReply("phone-anna", certificate_pem=foreign))
    wrong_name = device_ca.sign_device(out, make_csr(key, "phone-bob"), "phone-bob")
    with pytest.raises(cert_enrol.EnrolmentNotApproved, match="not this device's"):
        cert_enrol.store_certificate(prep, EnrolReply("phone-bob", certificate_pem=wrong_name))
    assert not (tmp_path / "dev" / "device.crt").exists()
    with pytest.raises(cert_enrol.EnrolmentNotApproved, match="revoked for good"):
        cert_enrol.store_certificate(prep, EnrolReply("phone-anna", refused="name_revoked"))
    mine = device_ca.sign_device(out, make_csr(key, "phone-anna"), "phone-anna")
    assert cert_enrol.store_certificate(prep, EnrolReply("phone-anna", certificate_pem=mine)).read_text() == mine


def test_with_the_recipes_ec_ca_both_qr_codes_carry_the_ca_itself(tmp_path: Path) -> None:
    """The openssl recipe of ``broker init --help`` run as printed: bundle and invitation codes hold the whole CA, at version <= 20."""
    import secrets

    import segno

    from coordinator.broker.certificates import OPENSSL_HELP
    from coordinator.server.qr import QR_MAX_VERSION, invitation_payload, qr_payload
    from har_io.enrolment import EnrolmentBundle

    recipe = OPENSSL_HELP.split("\n\n")[1]
    r = subprocess.run(["bash", "-e", "-c", recipe], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    pem = (tmp_path / "ca.crt").read_text()
    password = secrets.token_urlsafe(32)  # the generator's length (PASSWORD_BYTES)
    bundle = EnrolmentBundle(coordinator="fedhar-home", federation="home", client_id="phone-anna", password=password,
                             host="homeserver.local", port=8883, tls_ca_pem=pem)  # fmt: skip
    inv = Invitation("fedhar-home", "home", "homeserver.local", 8883, 8884, "enrol", password, pem_fingerprints(pem)[0], pem)
    for text in (qr_payload(bundle), invitation_payload(inv)):
        assert "-----BEGIN CERTIFICATE-----" in text
        assert int(segno.make(text, error="L", micro=False, boost_error=False, mode="byte").version) <= QR_MAX_VERSION
    assert Invitation.from_json(invitation_payload(inv)) == inv


def test_an_invitation_with_a_large_ca_carries_its_fingerprint_to_fetch_and_pin(tmp_path: Path) -> None:
    from coordinator.server.qr import invitation_payload

    r = _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=fedhar CA",
                 "-keyout", str(tmp_path / "ca.key"), "-out", str(tmp_path / "ca.crt"))  # fmt: skip
    assert r.returncode == 0, r.stderr
    pem = (tmp_path / "ca.crt").read_text()
    inv = Invitation("fedhar-home", "home", "homeserver.local", 8883, 8884, "enrol", "p" * 43, pem_fingerprints(pem)[0], pem)
    slim = Invitation.from_json(invitation_payload(inv))
    assert slim.tls_ca_pem is None and slim.tls_ca_sha256 == inv.tls_ca_sha256


def test_no_device_certificate_carries_a_service_accounts_name(tmp_path: Path) -> None:
    """A certificate with the CN ``coordinator`` would log in as the coordinator on the device-certificate listener."""
    import getpass

    from coordinator.broker.accounts import generate
    from coordinator.broker.certificates import OPENSSL_HELP

    if shutil.which("mosquitto_passwd") is None and not Path("/usr/bin/mosquitto_passwd").exists():
        pytest.skip("mosquitto_passwd not installed")
    r = subprocess.run(["bash", "-e", "-c", OPENSSL_HELP.split("\n\n")[1]], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "broker"
    given = {"federation": "home", "tls_cert": str(tmp_path / "server.crt"), "tls_key": str(tmp_path / "server.key"),
             "tls_ca": str(tmp_path / "ca.crt"), "device_cert_port": 8884, "broker_user": getpass.getuser()}  # fmt: skip
    outcome = generate(out, given, ["phone-anna"])
    assert {"enrol", "enrol-desk"} <= set(outcome.added) and outcome.clients == ["phone-anna"]
    csr = make_csr(make_key(tmp_path / "device.key"), "coordinator")
    for name in ("coordinator", "monitor", "enrol", "enrol-desk"):
        with pytest.raises(SetupError, match="service account"):
            device_ca.sign_device(out, csr, name)
    assert certificate_subject_cn(device_ca.sign_device(out, csr, "phone-anna")) == "phone-anna"
    # A folder with a device called "enrol" cannot get the enrolment accounts until that device is renamed or removed.
    older = tmp_path / "older"
    generate(older, {k: v for k, v in given.items() if k != "device_cert_port"}, ["enrol"])
    with pytest.raises(SetupError, match="has a device named enrol, an enrolment account's name"):
        generate(older, {"device_cert_port": 8884}, [])


@pytest.mark.slow  # each command loads the server's modules: about 1 s apiece
def test_the_desk_commands_on_a_folder_without_device_certificates_say_how_to_add_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    import getpass

    from coordinator.broker.accounts import generate
    from coordinator.server import devices_cli

    if shutil.which("mosquitto_passwd") is None and not Path("/usr/bin/mosquitto_passwd").exists():
        pytest.skip("mosquitto_passwd not installed")
    out = tmp_path / "broker"
    generate(out, {"federation": "home", "broker_user": getpass.getuser()}, [])
    data = tmp_path / "data"
    data.mkdir()
    (data / "server.toml").write_text(f'[server]\nbroker_dir = "{out}"\n')
    for cmd, argv in (("invite", []), ("pending", []), ("approve", ["AEY53-KLFJ7"])):
        assert devices_cli.main(cmd, [*argv, "--data", str(data)]) == 2
        err = capsys.readouterr().err
        assert f"no device-certificate listener: run fedhar-coordinator broker init --out {out} --device-cert-port" in err


def test_fedhar_client_request_certificate_refuses_a_bad_invitation_with_the_reason(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    from edge_client import cli

    rc = cli.main(["request-certificate", "--invitation", '{"format": "fedhar-enrolment"}', "--client-id", "pi-kitchen",
                   "--folder", str(tmp_path / "k")])  # fmt: skip
    assert rc == 2
    assert "not a fedhar-invitation message" in capsys.readouterr().err
    assert not (tmp_path / "k" / "device.key").exists()  # nothing made for an invitation that cannot be used
