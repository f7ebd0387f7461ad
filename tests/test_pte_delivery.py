"""Program delivery without a broker: requests, program envelopes, the client's checks and storage, the coordinator's checks.

The program files here are stand-in byte strings: what is checked is the envelope, not the
programs' content (``tests/test_pte_delivery_federation.py`` runs real programs end to end).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest

from coordinator.pte_desk import ProgramDesk
from edge_client.agent import ClientConfig
from edge_client.backends import BACKEND_NAMES, BackendOptions, make_backend
from edge_client.pte_fetch import ProgramFetcher, make_fetcher, needs_delivery
from har_io.mqtt_link import BrokerConfig
from har_models.nn.arch import ArchSpec
from har_models.wire import codec
from har_models.wire.chunking import split_payload
from har_models.wire.messages import RoundAnnouncement
from har_models.wire.pte_delivery import (
    MAX_REQUEST_BYTES,
    PROGRAM_FILES,
    ProgramError,
    ProgramRequest,
    ProgramSet,
    decode_programs,
    encode_programs,
    find_programs,
    program_paths,
    store_programs,
)
from har_models.wire.topics import Topics

SPEC = ArchSpec(6, conv_filters=8, dense_units=32)
GROWN = ArchSpec(6, conv_filters=10, dense_units=32, version=1)
TOPICS = Topics("fed")


def _set(spec: ArchSpec = SPEC, key: str = "0123abcd") -> ProgramSet:
    files = {n: f"{n} program of v{spec.version}".encode() * 3 for n in PROGRAM_FILES}
    meta = {"spec": spec.to_dict(), "key": key, "format": 1, "train_batch": 32, "infer_batch": 64,
            "params": {"conv.weight": "conv_weight"}, "weights_ptd": {"conv.weight": [0, 4]}}  # fmt: skip
    return ProgramSet(spec, meta, files)


def _envelope(spec: ArchSpec = SPEC, client: str = "phone-1", run: str = "run-a", key: str = "0123abcd") -> bytes:
    return encode_programs(_set(spec, key), client_id=client, run_id=run, executorch_version="1.4.0")


def _ann(spec: ArchSpec = SPEC, run: str = "run-a") -> RoundAnnouncement:
    return RoundAnnouncement(run_id=run, round=0, state="training", arch=spec.to_dict(), label_set="hapt6",
                             selected=("phone-1",), global_model="t")  # fmt: skip


# ------------------------------------------------------------------------------------- requests
def test_request_round_trips_and_its_wire_form_is_plain_json() -> None:
    req = ProgramRequest("run-a", 3)
    assert json.loads(req.to_bytes()) == {"protocol": 1, "run_id": "run-a", "arch_version": 3}
    assert ProgramRequest.from_bytes(req.to_bytes()) == req


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"not json", "bad_request"),
        (b"\xff\xfe", "bad_request"),
        (b"[1, 2]", "bad_request"),
        (b'{"protocol": 1, "arch_version": 0}', "bad_request"),
        (b'{"protocol": 1, "run_id": "r", "arch_version": -1}', "bad_request"),
        (b'{"protocol": 1, "run_id": "r", "arch_version": true}', "bad_request"),
        (b'{"protocol": 1, "run_id": "r", "arch_version": "0"}', "bad_request"),
        (b'{"protocol": 2, "run_id": "r", "arch_version": 0}', "unknown_protocol"),
        (b'{"protocol": 1, "run_id": "' + b"x" * MAX_REQUEST_BYTES + b'", "arch_version": 0}', "oversized"),
    ],
)
def test_malformed_requests_are_rejected_with_a_reason(payload: bytes, reason: str) -> None:
    with pytest.raises(ProgramError) as err:
        ProgramRequest.from_bytes(payload)
    assert err.value.reason == reason


# ------------------------------------------------------------------------------------- envelopes
def test_program_envelope_round_trips_every_file_and_the_metadata() -> None:
    sent = _set()
    got = decode_programs(_envelope(), client_id="phone-1", run_id="run-a", spec=SPEC)
    assert got.files == sent.files and got.meta == sent.meta and got.spec == SPEC and got.key == "0123abcd"
    header = codec.peek_header(_envelope())
    assert header["kind"] == "program" and header["arch_version"] == 0 and header["client_id"] == "phone-1"
    files = header["meta"]["files"]
    assert files["train"] == {"bytes": len(sent.files["train"]), "sha256": hashlib.sha256(sent.files["train"]).hexdigest()}


def _tamper_body(env: bytes) -> bytes:
    out = bytearray(env)
    out[-1] ^= 0x01  # the last byte of the body (a byte of the last program file)
    return bytes(out)


def _with_meta(env: bytes, change: dict) -> bytes:
    """The envelope re-encoded with its body unchanged and its metadata updated (a consistent but lying sender)."""
    e = codec.decode(env)
    meta = json.loads(json.dumps(e.meta))
    for path, value in change.items():
        node = meta
        *parents, leaf = path.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    return codec.encode(e.tensors, kind=e.kind, round=e.round, arch_version=e.arch_version, client_id=e.client_id, meta=meta)


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda: _tamper_body(_envelope()), "sha256_mismatch"),
        (lambda: _envelope()[:-10], "truncated"),
        (lambda: b"XXXX" + _envelope()[4:], "bad_magic"),
        (lambda: _envelope(client="phone-2"), "client_mismatch"),
        (lambda: _envelope(run="run-b"), "wrong_run"),
        (lambda: _envelope(spec=GROWN), "wrong_arch_version"),
        (lambda: _envelope(spec=ArchSpec(6, 8, 32, input_std=(2.0,) * 6)), "wrong_spec"),  # same version, other normalisation
        (lambda: codec.encode({}, kind="model", round=0, arch_version=0, client_id="phone-1", meta={"run_id": "run-a"}), "wrong_kind"),
        (lambda: _with_meta(_envelope(), {"files.train.sha256": "0" * 64}), "bad_program"),
        (lambda: _with_meta(_envelope(), {"files.infer.bytes": 1}), "bad_program"),
        (lambda: _with_meta(_envelope(), {"program.key": "../../etc"}), "bad_program"),
        (lambda: _with_meta(_envelope(), {"program.spec": {"n_classes": "six"}}), "bad_program"),
    ],
)
def test_wrong_program_envelopes_are_rejected_with_a_reason(make, reason: str) -> None:
    with pytest.raises(ProgramError) as err:
        decode_programs(make(), client_id="phone-1", run_id="run-a", spec=SPEC)
    assert err.value.reason == reason


def test_an_oversized_program_envelope_is_rejected() -> None:
    env = _envelope()
    with pytest.raises(ProgramError) as err:
        decode_programs(env, client_id="phone-1", run_id="run-a", spec=SPEC, max_bytes=len(env) - 1)
    assert err.value.reason == "oversized"
    assert decode_programs(env, client_id="phone-1", run_id="run-a", spec=SPEC, max_bytes=len(env)).spec == SPEC


def test_stored_sets_use_the_exporters_names_and_are_found_only_when_complete(tmp_path: Path) -> None:
    paths = store_programs(tmp_path, _set())
    assert sorted(p.name for p in paths.values()) == sorted(
        ["0123abcd.train.pte", "0123abcd.infer.pte", "0123abcd.infer_static.pte", "0123abcd.weights.ptd", "0123abcd.json"]
    )
    assert paths["train"].read_bytes() == _set().files["train"]
    assert find_programs(tmp_path, SPEC) == paths
    assert find_programs(tmp_path, GROWN) is None  # another architecture
    assert find_programs(tmp_path / "absent", SPEC) is None
    (tmp_path / "broken.json").write_text("{not json")  # unreadable metadata is skipped
    assert find_programs(tmp_path, SPEC) == paths
    paths["infer_static"].unlink()
    assert find_programs(tmp_path, SPEC) is None  # incomplete


# ------------------------------------------------------------------------------------- the client
def test_which_clients_ask_for_programs() -> None:
    assert needs_delivery("executorch-android", "export")  # a phone cannot export
    assert needs_delivery("executorch", "fetch")
    assert not needs_delivery("executorch", "export")
    assert not needs_delivery("executorch", "auto")  # PyTorch is importable here, so it exports
    assert not needs_delivery("torch", "fetch") and not needs_delivery("numpy", "fetch")
    with pytest.raises(ValueError, match="programs mode"):
        needs_delivery("executorch", "sometimes")
    assert make_fetcher("c", TOPICS, "torch", "auto", None, "/tmp/x", 10) is None
    f = make_fetcher("c", TOPICS, "executorch", "fetch", None, "/tmp/state", 10)
    assert f is not None and f.folder == Path("/tmp/state/programs")


def test_client_config_knows_the_android_backend_and_refuses_an_unknown_programs_mode() -> None:
    assert ClientConfig("phone-1", BrokerConfig(), backend="executorch-android").programs == "auto"
    assert "executorch-android" in BACKEND_NAMES
    with pytest.raises(ValueError, match="programs must be one of"):
        ClientConfig("phone-1", BrokerConfig(), backend="executorch", programs="maybe")


def _fetcher(tmp_path: Path, backend: str = "executorch-android") -> ProgramFetcher:
    return ProgramFetcher("phone-1", TOPICS, tmp_path / "programs", backend, max_bytes=1 << 20, retry_s=60.0)


def test_client_asks_once_per_period_then_stores_what_arrives_and_trains(tmp_path: Path) -> None:
    f = _fetcher(tmp_path)
    sent: list[tuple[str, bytes]] = []
    assert not f.ready(_ann(), lambda t, p: sent.append((t, p)))
    assert not f.ready(_ann(), lambda t, p: sent.append((t, p)))  # not due again for 60 s
    assert sent == [("fedhar/v1/fed/client/phone-1/program_request", ProgramRequest("run-a", 0).to_bytes())]
    assert f.subscriptions() == [("fedhar/v1/fed/client/phone-1/programs/+", 1)]
    env = _envelope()
    chunks = split_payload(env, 64)
    assert len(chunks) > 3
    for i, c in enumerate(chunks):
        assert f.owns(TOPICS.client_programs("phone-1", i))
        f.on_message(c)
    assert f.stored == [0] and f.rejected == []
    assert f.ready(_ann(), lambda t, p: sent.append((t, p))) and len(sent) == 1
    assert find_programs(tmp_path / "programs", SPEC) is not None
    assert not f.owns(TOPICS.client_programs("phone-2", 0)) and not f.owns(TOPICS.client_model("phone-1", 0))


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda: _tamper_body(_envelope()), "sha256_mismatch"),  # chunks intact, the envelope's own checksum wrong
        (lambda: _envelope(spec=GROWN), "unrequested"),  # a version nobody asked for
        (lambda: _envelope(client="phone-2"), "client_mismatch"),
        (lambda: _envelope(run="run-b"), "wrong_run"),
    ],
)
def test_client_rejects_wrong_programs_and_stores_nothing(tmp_path: Path, make, reason: str, caplog) -> None:
    f = _fetcher(tmp_path)
    assert not f.ready(_ann(), lambda t, p: None)
    with caplog.at_level(logging.ERROR):
        for c in split_payload(make(), 200):
            f.on_message(c)
    assert f.rejected == [reason] and f.stored == []
    assert f"rejected the programs received ({reason})" in caplog.text
    assert not f.ready(_ann(), lambda t, p: None) and find_programs(tmp_path / "programs", SPEC) is None


def test_client_drops_garbage_chunks_without_failing(tmp_path: Path) -> None:
    f = _fetcher(tmp_path)
    for junk in (b"", b"{}", b"FHC1" + b"\x00" * 10, bytes(range(256))):
        f.on_message(junk)
    assert f.stored == [] and f.rejected == []


def test_python_runtime_checks_the_exporters_cache_key(tmp_path: Path) -> None:
    pytest.importorskip("executorch")
    from har_models.nn.export import program_key

    f = _fetcher(tmp_path, backend="executorch")
    assert not f.ready(_ann(), lambda t, p: None)
    for c in split_payload(_envelope(key="ffffffffffffffff"), 4096):
        f.on_message(c)
    assert f.rejected == ["runtime_mismatch"]  # a key this runtime would not look for: it would export instead
    for c in split_payload(_envelope(key=program_key(SPEC, 32, 64)), 4096):
        f.on_message(c)
    assert f.stored == [0]
    assert program_paths(tmp_path / "programs", program_key(SPEC, 32, 64))["meta"].exists()


def test_android_backend_is_reachable_by_name_and_needs_delivered_programs(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no programs for architecture version 0"):
        make_backend("executorch-android", SPEC, options=BackendOptions(program_cache=tmp_path))
    with pytest.raises(ValueError, match=r"give BackendOptions\(program_cache=FOLDER\)"):
        make_backend("executorch-android", SPEC)


# ------------------------------------------------------------------------------------- the coordinator
class _NoLink:
    """A link that fails the test if the desk publishes anything (a rejected request must not be answered)."""

    def publish_chunks(self, *a: object, **k: object) -> int:
        raise AssertionError("a rejected program request was answered")


@pytest.mark.parametrize(
    ("payload", "spec", "reason"),
    [
        (b"{broken", SPEC, "bad_request"),
        (b"x" * (MAX_REQUEST_BYTES + 1), SPEC, "oversized"),
        (ProgramRequest("run-b", 0).to_bytes(), SPEC, "wrong_run"),
        (ProgramRequest("run-a", 1).to_bytes(), SPEC, "unknown_version"),  # not the federation's version
        (ProgramRequest("run-a", 0).to_bytes(), None, "no_architecture"),
    ],
)
def test_coordinator_rejects_bad_requests_with_a_reason_and_sends_nothing(payload: bytes, spec, reason: str, tmp_path: Path) -> None:
    seen: list[tuple[str, str, str]] = []
    desk = ProgramDesk(_NoLink(), TOPICS, "run-a", lambda: spec, cache_dir=tmp_path, on_reject=lambda *a: seen.append(a))  # type: ignore[arg-type]
    desk.on_request("phone-1", payload)
    desk.on_request("phone-1", payload)  # repeats are counted, recorded once
    assert desk.rejected[("phone-1", reason)] == 2
    assert [(c, r) for c, r, _ in seen] == [("phone-1", reason)]
    assert desk._thread is None and not any(tmp_path.iterdir())  # nothing exported, nothing sent


def test_a_request_over_the_broker_is_answered_with_programs_the_client_stores(tmp_path: Path) -> None:
    """The whole exchange over the embedded broker, the coordinator's cache holding a set already (no export here)."""
    pytest.importorskip("executorch")
    from har_io.mqtt_link import MqttLink
    from har_models.nn.export import program_key
    from simulation.broker import EmbeddedBroker

    key = program_key(SPEC, 32, 64)  # where ensure_programs looks: a set there is used, not exported again
    small = _set(key=key)
    sent = ProgramSet(SPEC, small.meta, {n: (b * 2000)[:20_000] for n, b in small.files.items()})
    store_programs(tmp_path / "cache", sent)
    wait_s = 30.0
    with EmbeddedBroker() as broker:
        cfg = BrokerConfig(port=broker.port, max_message_bytes=16_384)  # the 80 kB set travels in several chunks
        coord = MqttLink(cfg, "t-coordinator", subscriptions=[(TOPICS.client_program_request("+"), 1)])
        f = ProgramFetcher("phone-1", TOPICS, tmp_path / "client", "executorch", max_bytes=1 << 20)
        dev = MqttLink(cfg, "t-phone", subscriptions=f.subscriptions())
        desk = ProgramDesk(coord, TOPICS, "run-a", lambda: SPEC, cache_dir=tmp_path / "cache")
        try:
            assert coord.start(wait_s=wait_s) and dev.start(wait_s=wait_s)
            assert not f.ready(_ann(), dev.publish_nowait)
            topic, payload, _ = coord.inbox.get(timeout=wait_s)
            assert TOPICS.parse_client_topic(topic) == ("phone-1", "program_request")
            desk.on_request("phone-1", payload)
            chunks = 0
            while not f.stored and chunks < 50:  # bounded: the set is a few chunks
                topic, chunk, retained = dev.inbox.get(timeout=wait_s)
                assert f.owns(topic) and not retained
                f.on_message(chunk)
                chunks += 1
            assert chunks >= 5  # at least 80 kB in messages of at most 16,384 bytes
            assert f.stored == [0] and f.ready(_ann(), dev.publish_nowait)
            assert find_programs(tmp_path / "client", SPEC) == program_paths(tmp_path / "client", key)
            for name, data in sent.files.items():
                assert program_paths(tmp_path / "client", key)[name].read_bytes() == data
            assert desk.sent[("phone-1", 0)] == 1
            desk.on_request("phone-1", payload)  # asked again at once: refused, not sent again
            assert desk.rejected[("phone-1", "repeated_request")] == 1 and desk.sent[("phone-1", 0)] == 1
        finally:
            desk.close()
            dev.stop()
            coord.stop()


def test_client_does_not_ask_again_while_program_chunks_arrive(tmp_path: Path) -> None:
    f = ProgramFetcher("phone-1", TOPICS, tmp_path / "programs", "executorch-android", max_bytes=1 << 20, retry_s=0.0)
    sent: list[str] = []
    assert not f.ready(_ann(), lambda t, p: sent.append(t))
    assert not f.ready(_ann(), lambda t, p: sent.append(t))  # due at once (retry 0 s): asked again
    assert len(sent) == 2
    f.on_message(split_payload(_envelope(), 200)[0])  # a transfer is arriving
    assert not f.ready(_ann(), lambda t, p: sent.append(t)) and len(sent) == 2
