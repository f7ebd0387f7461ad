"""JSON control messages of the wire protocol (docs/protocol.md).

Every field from the network is checked where it enters (types, ranges, unknown keys);
a malformed message is refused with :class:`MessageError`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from har_models.settings import AlaConfig, LocalTraining, from_mapping
from har_models.wire.blob_ref import BlobRef, check_sha256
from har_models.wire.pace import Pace
from har_models.wire.topics import check_client_id

PROTOCOL_VERSION = 1

MAX_WINDOW_COUNT = 10**9
"""Upper bound on any window count a device reports (10^9 windows of 3 KB are 3 TB), so no device can take over a weighted average."""


def check_count(value: Any, what: str) -> int:
    """``value`` if it is an integer in [0, :data:`MAX_WINDOW_COUNT`] (not a bool or float), else ValueError naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_WINDOW_COUNT:
        raise ValueError(f"{what} must be an integer in [0, {MAX_WINDOW_COUNT}], got {value!r:.40}")
    return value


GUIDANCE_PREFIX = "guidance/"
"""Name prefix of the FedDWA guidance model's tensors inside an update envelope."""

UPDATE_ENCODINGS = ("float32", "float16", "int8_delta")
"""Encodings a client may upload its update in (:mod:`har_models.wire.update_encoding` implements them)."""

DEFAULT_UPDATE_ENCODING = "float32"
"""The encoding of an envelope whose metadata names none (every envelope before encodings existed)."""


class MessageError(ValueError):
    """A JSON control message that must be ignored (malformed or of another protocol)."""


def load_json_message(payload: bytes, what: str) -> dict[str, Any]:
    """The JSON object ``payload`` holds, checked to be of this protocol; MessageError naming ``what`` otherwise."""
    try:
        d = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MessageError(f"{what}: not valid JSON ({exc})") from None
    if not isinstance(d, dict):
        raise MessageError(f"{what}: expected a JSON object")
    if d.get("protocol") != PROTOCOL_VERSION:
        raise MessageError(f"{what}: protocol {d.get('protocol')!r}, this build speaks {PROTOCOL_VERSION}")
    return d


def load_message(payload: bytes, what: str) -> dict[str, Any]:
    """:func:`load_json_message` with its ``protocol`` key taken out."""
    d = load_json_message(payload, what)
    d.pop("protocol")
    return d


def dump_message(d: dict[str, Any], *leave_out: str) -> bytes:
    """``d`` with the protocol version and without the keys ``leave_out``, as sorted JSON bytes.

    Optional fields at their defaults are left out, so a reader of an older release gets the message it knows.
    """
    for key in leave_out:
        del d[key]
    d["protocol"] = PROTOCOL_VERSION
    return json.dumps(d, sort_keys=True).encode()


@dataclass(frozen=True)
class TrainingPlan:
    """What a selected client must do in a round (part of the announcement).

    Parameters
    ----------
    prox_mu : float
        FedProx proximal weight (0 = plain FedAvg local objective).
    client_init : {"overwrite", "ala"}
        How the client combines the received and its previous local model (FedALA).
    guidance : bool
        Also train and upload the FedDWA guidance model.
    keep_local : tuple of str
        Tensor names the client keeps from its own model (FedPer personal layers).
    frozen : tuple of str
        Tensor names not trained this round (FedDist paper-mode intermediate rounds).
    class_weights : {"balanced", "none"}
    seed : int
        Base seed; each client derives its own from it, its id and the round.
    ala : dict
        FedALA settings (:class:`~har_models.settings.AlaConfig`).
    update_encoding : {"float32", "float16", "int8_delta"}
        See :mod:`har_models.wire.update_encoding`.
    """

    local_epochs: int = LocalTraining.local_epochs
    lr: float = LocalTraining.lr
    batch_size: int = LocalTraining.batch_size
    prox_mu: float = 0.0
    client_init: str = "overwrite"
    guidance: bool = False
    keep_local: tuple[str, ...] = ()
    frozen: tuple[str, ...] = ()
    class_weights: str = LocalTraining.class_weights
    seed: int = 1
    ala: dict[str, Any] = field(default_factory=dict)
    update_encoding: str = DEFAULT_UPDATE_ENCODING

    def __post_init__(self) -> None:
        if self.local_epochs < 0 or self.batch_size <= 0 or not (self.lr >= 0) or not (self.prox_mu >= 0):
            raise ValueError(
                f"TrainingPlan: need local_epochs >= 0, batch_size > 0, lr >= 0, prox_mu >= 0; got "
                f"{self.local_epochs}, {self.batch_size}, {self.lr}, {self.prox_mu}"
            )
        if self.client_init not in ("overwrite", "ala"):
            raise ValueError(f"TrainingPlan.client_init must be 'overwrite' or 'ala', got {self.client_init!r}")
        if self.class_weights not in ("balanced", "none"):
            raise ValueError(f"TrainingPlan.class_weights must be 'balanced' or 'none', got {self.class_weights!r}")
        if self.update_encoding not in UPDATE_ENCODINGS:
            raise ValueError(f"TrainingPlan.update_encoding must be one of {UPDATE_ENCODINGS}, got {self.update_encoding!r:.40}")
        object.__setattr__(self, "keep_local", tuple(self.keep_local))
        object.__setattr__(self, "frozen", tuple(self.frozen))
        # Checked here, where the plan enters a client, so that a mistyped key is refused
        # with its name instead of killing the trainer later.
        self.ala_config()

    def ala_config(self) -> AlaConfig:
        """The typed FedALA settings of :attr:`ala`; ValueError naming a bad key or value."""
        return from_mapping(AlaConfig, self.ala, "training plan ala")

    @classmethod
    def from_json(cls, d: Any) -> TrainingPlan:
        """Build from a JSON object; unknown keys are an error."""
        if not isinstance(d, dict):
            raise MessageError("training plan: expected an object")
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise MessageError(f"training plan: unknown fields {sorted(unknown)}")
        try:
            return cls(**d)
        except (TypeError, ValueError, OverflowError) as exc:
            raise MessageError(f"training plan: {exc}") from None


@dataclass(frozen=True)
class RoundAnnouncement:
    """The retained message that opens a round (or says the federation is finished).

    Optional fields are left out of the message at their defaults, so older clients parse it as before.

    Parameters
    ----------
    arch : dict
        :class:`~har_models.nn.model.ArchSpec` as JSON.
    selected : tuple of str
        Client ids that should train in this round.
    global_model : str
        Transfer id (sha256 hex) of the model on the global model topic, or "".
    personal_models : dict of str -> str
        Transfer id of each client's personalised model.
    deadline_unix : float
        When the coordinator closes the round, s since the epoch.
    stage : int
        0 for the main exchange; FedDist paper-mode intermediate exchanges count up.
    attempt : str
        Changes whenever the coordinator (re)starts or reruns a round that lacked quorum; a
        client that already answered resends its stored update instead of retraining.
    epoch : int
        The served coordinator's epoch (one per start of ``serve``); a client that sees a higher
        one drops older work (public report BR-46). 0 = none.
    transport : {"mqtt", "blobs"}
        How model bytes travel: chunks on the model topics, or a blob store over HTTP
        (:mod:`har_models.wire.blob_messages`).
    global_blob : dict or None
        With ``transport="blobs"``: the global model's :class:`~har_models.wire.blob_ref.BlobRef` as JSON.
    pace : Pace, optional
        When devices should check in again (:mod:`har_models.wire.pace`).
    """

    run_id: str
    round: int
    state: str
    arch: dict[str, Any]
    label_set: str
    selected: tuple[str, ...] = ()
    plan: TrainingPlan = field(default_factory=TrainingPlan)
    global_model: str = ""
    personal_models: dict[str, str] = field(default_factory=dict)
    deadline_unix: float = 0.0
    stage: int = 0
    attempt: str = ""
    epoch: int = 0
    transport: str = "mqtt"
    global_blob: dict[str, Any] | None = None
    pace: Pace | None = None

    def model_for(self, cid: str) -> tuple[str, str]:
        """``(source, transfer)`` of the model ``cid`` must start from: source is "personal" or "global"."""
        if cid in self.personal_models:
            return "personal", self.personal_models[cid]
        return "global", self.global_model

    def to_bytes(self) -> bytes:
        d = asdict(self)
        d["selected"] = list(self.selected)
        if d["plan"]["update_encoding"] == DEFAULT_UPDATE_ENCODING:  # clients built before encodings take the plan
            del d["plan"]["update_encoding"]
        left_out = {"epoch": not self.epoch, "transport": self.transport == "mqtt", "global_blob": self.global_blob is None,
                    "pace": self.pace is None}  # fmt: skip
        return dump_message(d, *(k for k, v in left_out.items() if v))

    @classmethod
    def from_bytes(cls, payload: bytes) -> RoundAnnouncement:
        """Parse an announcement; MessageError if it is not JSON, of another protocol, or malformed."""
        d = load_message(payload, "round announcement")
        try:
            d["plan"] = TrainingPlan.from_json(d.get("plan", {}))
            d["selected"] = tuple(check_client_id(c) for c in d.get("selected", []))
            if d.get("pace") is not None:
                d["pace"] = Pace.from_json(d["pace"])
            ann = cls(**d)
        except (TypeError, ValueError) as exc:
            raise MessageError(f"round announcement: {exc}") from None
        if ann.state not in ("training", "finished") or not isinstance(ann.round, int) or ann.round < 0:
            raise MessageError(f"round announcement: bad state {ann.state!r} or round {ann.round!r}")
        if isinstance(ann.epoch, bool) or not isinstance(ann.epoch, int) or ann.epoch < 0:
            raise MessageError(f"round announcement: epoch must be an integer >= 0, got {ann.epoch!r:.40}")
        if not isinstance(ann.arch, dict) or not isinstance(ann.personal_models, dict):
            raise MessageError("round announcement: 'arch' and 'personal_models' must be objects")
        if ann.transport not in ("mqtt", "blobs"):
            raise MessageError(f"round announcement: transport {ann.transport!r:.40} is neither 'mqtt' nor 'blobs'")
        if ann.global_blob is not None:
            try:
                ref = BlobRef.from_json(ann.global_blob)
            except ValueError as exc:
                raise MessageError(f"round announcement: global_blob: {exc}") from None
            if ref.sha256 != ann.global_model:
                raise MessageError("round announcement: global_blob names another model than global_model")
        return ann


MAX_SAMPLE_RATE_HZ = 10_000.0
"""Upper bound on a sample rate a device reports (Hz): far above any phone or IMU driver (a few hundred Hz)."""

_BACKEND_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_.-")


@dataclass(frozen=True)
class SensingHealth:
    """How well a client's sensors deliver (part of :class:`ClientStatus`); None fields are left out.

    Measured by :class:`edge_client.freshness.SensingHealthMeter` on the sensor clock.

    Parameters
    ----------
    acc_hz, gyro_hz : float or None
        Samples accepted by the resampler over the last 60 s of the sensor clock, Hz (50 expected).
    window_age_s : float or None
        The sensor clock's now minus the newest window's end, s.
    gaps_1h : int or None
        Silences longer than one window (2.56 s) in the last hour, either stream.
    late : int or None
        Samples dropped as late since sensing started.
    """

    acc_hz: float | None = None
    gyro_hz: float | None = None
    window_age_s: float | None = None
    gaps_1h: int | None = None
    late: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The object as JSON, None fields left out."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_json(cls, d: Any) -> SensingHealth:
        """Parse and range-check :meth:`to_json` output.

        Raises
        ------
        ValueError
            For a non-object, an unknown key, a rate outside [0, :data:`MAX_SAMPLE_RATE_HZ`], an age
            outside [0, 1e11) s, or a count outside [0, :data:`MAX_WINDOW_COUNT`].
        """
        if not isinstance(d, dict):
            raise ValueError(f"sensing_health must be an object, got {d!r:.40}")
        h = cls(**d)  # TypeError for an unknown key
        for name in ("acc_hz", "gyro_hz"):
            v = getattr(h, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= MAX_SAMPLE_RATE_HZ):
                raise ValueError(f"sensing_health.{name} must be a rate in [0, {MAX_SAMPLE_RATE_HZ:.0f}] Hz or left out, got {v!r:.40}")
        if h.window_age_s is not None:
            _check_seconds(h, ("window_age_s",))
        for name in ("gaps_1h", "late"):
            if getattr(h, name) is not None:
                check_count(getattr(h, name), f"sensing_health.{name}")
        return h


MAX_CPU_S = 1e7
"""Largest CPU-seconds figure a :class:`DeviceCost` may carry (about 116 days of one core)."""
MAX_BATTERY_PCT_PER_DAY = 10_000.0
"""Largest battery drain a :class:`DeviceCost` may carry, percent per day (a full battery in under 15 min)."""


@dataclass(frozen=True)
class DeviceCost:
    """What taking part costs the device, as measured by :mod:`edge_client.cost` (part of :class:`ClientStatus`).

    None and "" fields (not measured) are left out of the message.

    Parameters
    ----------
    sensing_cpu_s_per_h : float or None
        Process CPU seconds spent sensing (rounds left out) per hour of sensed samples, s/h.
    round_cpu_s, round_wall_s : float or None
        CPU (less sensing meanwhile) and wall seconds of the latest round, s.
    round_backend : str
        Training backend of that round.
    battery_pct_per_day : float or None
        Whole-device battery drain off the charger, % per day; None where not reported.
    """

    sensing_cpu_s_per_h: float | None = None
    round_cpu_s: float | None = None
    round_wall_s: float | None = None
    round_backend: str = ""
    battery_pct_per_day: float | None = None

    def to_json(self) -> dict[str, Any]:
        """The object as JSON, None and "" fields left out."""
        return {k: v for k, v in asdict(self).items() if v is not None and v != ""}

    @classmethod
    def from_json(cls, d: Any) -> DeviceCost:
        """Parse and range-check :meth:`to_json` output.

        Raises
        ------
        ValueError
            For a non-object, an unknown key, a figure outside [0, :data:`MAX_CPU_S`] or
            [0, :data:`MAX_BATTERY_PCT_PER_DAY`], or a backend that is not a backend name.
        """
        if not isinstance(d, dict):
            raise ValueError(f"cost must be an object, got {d!r:.40}")
        c = cls(**d)  # TypeError for an unknown key
        for name, top in (("sensing_cpu_s_per_h", MAX_CPU_S), ("round_cpu_s", MAX_CPU_S), ("round_wall_s", MAX_CPU_S),
                          ("battery_pct_per_day", MAX_BATTERY_PCT_PER_DAY)):  # fmt: skip
            v = getattr(c, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= top):
                raise ValueError(f"cost.{name} must be a number in [0, {top:g}] or left out, got {v!r:.40}")
        b = c.round_backend
        if not isinstance(b, str) or len(b) > 32 or not set(b) <= _BACKEND_CHARS:
            raise ValueError(f"cost.round_backend must be a backend name (lowercase letters, digits, '_.-', at most 32), got {b!r:.40}")
        return c


MAX_FAULT_CHARS = 500
"""Longest :attr:`ClientStatus.fault` (a sentence or two naming the folder or sensor and the fix)."""

MAX_BAD_OBJECTS = 8
"""Most hashes in :attr:`ClientStatus.bad_objects`."""

_TIMINGS = ("train_s", "download_s", "upload_s")
_OPTIONAL_STATUS_FIELDS = ("program_fault", "sensing", "charging", "backend", "arch_version", "fault", "left",
                           "sensing_health", "cost", *_TIMINGS, "warming_up", "bad_objects")  # fmt: skip


@dataclass(frozen=True)
class ClientStatus:
    """Retained presence and capability message of a client.

    Every field after ``refresh_s`` is optional and left out of the message at its default, so a
    coordinator of an older release reads the status as before.

    Parameters
    ----------
    train_stats : dict
        :class:`~har_models.data.windowing.ChannelStats` of the training windows (JSON form).
    last_round : int
        Last round whose update the client sent (-1 if none).
    instance : str
        Random id of the client process; two processes with one client id show (docs/reliability.md).
    sent_unix : float
        When the client published this status, s since the epoch (its clock).
    refresh_s : float
        The client republishes at least this often, s (0 = never); see :func:`fresh_until`.
    program_fault : str
        Why its ExecuTorch programs were refused (``pte_corrupt``, ``pte_incompatible``; docs/backends.md).
    sensing : {"", "live", "paused"}
        "paused": the newest window is older than the freshness limit (sensors withheld by the OS).
    charging : bool or None
        Whether the device is on its charger (:mod:`edge_client.power`).
    backend : str
        Training backend in use (lowercase letters, digits, ``_ . -``, at most 32 characters).
    arch_version : int or None
        Architecture version of the client's local model.
    sensing_health : SensingHealth or None
    fault : str
        Why the device cannot take part now (at most :data:`MAX_FAULT_CHARS`); a fault makes it
        not :attr:`selectable`.
    left : {"", "keep", "forget"}
        The device left its federation; "forget" also asks the operator to delete what the server
        holds of it (docs/protocol.md, "Leaving").
    cost : DeviceCost or None
    train_s, download_s, upload_s : float or None
        Seconds the last round took to train, to receive the model and to upload the update.
    warming_up : bool
        True until the process's first local training finished (a first-round allowance).
    bad_objects : tuple of str
        SHA-256 (hex) of up to :data:`MAX_BAD_OBJECTS` objects refused recently for a hash mismatch.
    """

    client_id: str
    state: str
    label_set: str = ""
    n_train: int = 0
    n_test: int = 0
    train_stats: dict[str, Any] = field(default_factory=dict)
    class_counts: tuple[int, ...] = ()
    run_id: str = ""
    last_round: int = -1
    instance: str = ""
    sent_unix: float = 0.0
    refresh_s: float = 0.0
    program_fault: str = ""
    sensing: str = ""
    charging: bool | None = None
    backend: str = ""
    arch_version: int | None = None
    sensing_health: SensingHealth | None = None
    fault: str = ""
    left: str = ""
    cost: DeviceCost | None = None
    train_s: float | None = None
    download_s: float | None = None
    upload_s: float | None = None
    warming_up: bool = False
    bad_objects: tuple[str, ...] = ()

    @property
    def selectable(self) -> bool:
        """Whether this status lets a coordinator select the device for a round: present, with training windows, no fault."""
        return self.state != "offline" and self.n_train > 0 and not self.fault

    def to_bytes(self) -> bytes:
        d = asdict(self)
        d["class_counts"] = list(self.class_counts)
        d["bad_objects"] = list(self.bad_objects)
        if self.sensing_health is not None:
            d["sensing_health"] = self.sensing_health.to_json()
        if self.cost is not None:
            d["cost"] = self.cost.to_json()
        unset = [n for n in _OPTIONAL_STATUS_FIELDS if d[n] is None or d[n] == "" or d[n] == [] or (n == "warming_up" and not d[n])]
        return dump_message(d, *unset)

    @classmethod
    def from_bytes(cls, payload: bytes, strict: bool = False) -> ClientStatus:
        """Parse a status message.

        Unknown top-level keys are ignored unless ``strict`` (docs/protocol.md, "Client status");
        inside ``sensing_health`` and ``cost`` every key is checked.

        Raises
        ------
        MessageError
            If it is not JSON, of another protocol, or malformed; with ``strict``, for an unknown key.
        """
        d = load_message(payload, "client status")
        unknown = sorted(set(d) - set(cls.__dataclass_fields__))
        if unknown and strict:
            raise MessageError(f"client status: unknown fields {unknown[:8]}")
        for key in unknown:
            del d[key]
        try:
            counts = d.get("class_counts", [])
            if not isinstance(counts, list):
                raise ValueError("class_counts must be a list")
            d["class_counts"] = tuple(check_count(c, "class_counts[i]") for c in counts)
            if d.get("sensing_health") is not None:
                d["sensing_health"] = SensingHealth.from_json(d["sensing_health"])
            if d.get("cost") is not None:
                d["cost"] = DeviceCost.from_json(d["cost"])
            bad = d.get("bad_objects", [])
            if not isinstance(bad, list) or len(bad) > MAX_BAD_OBJECTS or not all(isinstance(h, str) for h in bad):
                raise ValueError(f"bad_objects must be a list of at most {MAX_BAD_OBJECTS} SHA-256 hex strings")
            d["bad_objects"] = tuple(bad)
            st = cls(**d)
            check_client_id(st.client_id)
            check_count(st.n_train, "n_train")
            check_count(st.n_test, "n_test")
            if isinstance(st.last_round, bool) or not isinstance(st.last_round, int):
                raise ValueError(f"last_round must be an integer, got {st.last_round!r:.40}")
            if not isinstance(st.label_set, str) or not isinstance(st.run_id, str) or not isinstance(st.train_stats, dict):
                raise ValueError("label_set and run_id must be strings, train_stats an object")
            if not isinstance(st.instance, str) or len(st.instance) > 64:
                raise ValueError("instance must be a string of at most 64 characters")
            if not isinstance(st.program_fault, str) or len(st.program_fault) > 64:
                raise ValueError("program_fault must be a string of at most 64 characters")
            _check_seconds(st, ("sent_unix", "refresh_s"))
            if not isinstance(st.backend, str) or len(st.backend) > 32 or not set(st.backend) <= _BACKEND_CHARS:
                raise ValueError(f"backend must be a backend name (lowercase letters, digits, '_.-', at most 32), got {st.backend!r:.40}")
            if st.arch_version is not None:
                check_count(st.arch_version, "arch_version")
            if not isinstance(st.fault, str) or len(st.fault) > MAX_FAULT_CHARS:
                raise ValueError(f"fault must be a string of at most {MAX_FAULT_CHARS} characters")
            _check_seconds(st, tuple(n for n in _TIMINGS if getattr(st, n) is not None))
            if not isinstance(st.warming_up, bool):
                raise ValueError(f"warming_up must be true, false or left out, got {st.warming_up!r:.40}")
            for h in st.bad_objects:
                check_sha256(h, "bad_objects[i]")
        except (TypeError, ValueError, OverflowError) as exc:
            raise MessageError(f"client status: {exc}") from None
        if st.state not in ("online", "offline", "training", "idle"):
            raise MessageError(f"client status: unknown state {st.state!r:.40}")
        if st.left not in LEAVE_REQUESTS:
            raise MessageError(f"client status: left must be one of {LEAVE_REQUESTS}, got {st.left!r:.40}")
        if st.left and st.state != "offline":
            raise MessageError(f"client status: a device that left is offline, not {st.state!r:.40}")
        if st.sensing not in ("", "live", "paused"):
            raise MessageError(f"client status: sensing must be '', 'live' or 'paused', got {st.sensing!r:.40}")
        if st.charging is not None and not isinstance(st.charging, bool):
            raise MessageError(f"client status: charging must be true, false or left out, got {st.charging!r:.40}")
        return st


LEAVE_REQUESTS = ("", "keep", "forget")
"""Values of :attr:`ClientStatus.left`: stayed, left, left and asks to be forgotten."""


def offline_status(cid: str, instance: str = "") -> bytes:
    """The last-will payload of a client process ``instance``: a minimal status saying it is offline."""
    return ClientStatus(check_client_id(cid), "offline", instance=instance).to_bytes()


PRESENCE_PERIODS = 3
"""A status (a client's or the coordinator's) older than this many of its refresh periods counts as offline."""


def fresh_until(sent_unix: float, refresh_s: float, retained: bool, now: float, now_unix: float,
                periods: int = PRESENCE_PERIODS) -> float | None:  # fmt: skip
    """Until when a presence status counts as present, on the receiver's monotonic clock (s).

    It counts for ``periods * refresh_s``: a live status from its arrival ``now``; a retained one
    from its ``sent_unix`` against the receiver's ``now_unix`` (a future stamp is age 0). None:
    never stale (``refresh_s`` 0).
    """
    if refresh_s <= 0:
        return None
    age = max(0.0, now_unix - sent_unix) if retained else 0.0
    return now + periods * refresh_s - age


def _check_seconds(obj: object, names: tuple[str, ...]) -> None:
    for name in names:
        v = getattr(obj, name)
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < 1e11:
            raise ValueError(f"{name} must be a number of seconds in [0, 1e11), got {v!r:.40}")


@dataclass(frozen=True)
class CoordinatorStatus:
    """Retained presence of the coordinator (last will: offline).

    Republished every ``refresh_s`` s; a client treats one older than :data:`PRESENCE_PERIODS`
    periods as gone (:func:`fresh_until`). ``sent_unix``/``refresh_s`` are left out when
    ``refresh_s`` is 0 and ``epoch`` when 0, as in the older message.
    """

    state: str
    run_id: str = ""
    attempt: str = ""
    sent_unix: float = 0.0
    refresh_s: float = 0.0
    epoch: int = 0

    def to_bytes(self) -> bytes:
        return dump_message(asdict(self), *(() if self.refresh_s else ("sent_unix", "refresh_s")), *(() if self.epoch else ("epoch",)))

    @classmethod
    def from_bytes(cls, payload: bytes) -> CoordinatorStatus:
        """Parse a coordinator status; MessageError if it is not JSON, of another protocol, or malformed."""
        d = load_message(payload, "coordinator status")
        try:
            st = cls(**d)
            _check_seconds(st, ("sent_unix", "refresh_s"))
        except (TypeError, ValueError) as exc:
            raise MessageError(f"coordinator status: {exc}") from None
        if st.state not in ("online", "offline") or not isinstance(st.run_id, str) or not isinstance(st.attempt, str):
            raise MessageError(f"coordinator status: bad state {st.state!r:.40} or ids")
        if isinstance(st.epoch, bool) or not isinstance(st.epoch, int) or st.epoch < 0:
            raise MessageError(f"coordinator status: epoch must be an integer >= 0, got {st.epoch!r:.40}")
        return st


@dataclass(frozen=True)
class RoundOutlook:
    """What the coordinator is doing about rounds, for the people holding the devices (retained, its own topic).

    Kept apart from :class:`CoordinatorStatus` because a device of an earlier release refuses a
    status with unknown keys. None and "" fields are left out.

    Parameters
    ----------
    devices_taking_part : int, optional
        Devices that could be selected now.
    devices_needed : int, optional
        Devices a round needs before it starts (``min_clients``).
    next_round_unix : float, optional
        When the next round is expected to open, s since the epoch; None while one is open.
    open_round : int, optional
    model_version : int, optional
        The shared model version the open round starts from (as ``fedhar-coordinator versions`` numbers them).
    waiting_reason : str
        Why no round is open, in words (at most :data:`MAX_REASON_CHARS`).
    """

    run_id: str = ""
    sent_unix: float = 0.0
    devices_taking_part: int | None = None
    devices_needed: int | None = None
    next_round_unix: float | None = None
    open_round: int | None = None
    model_version: int | None = None
    waiting_reason: str = ""

    def to_bytes(self) -> bytes:
        return dump_message({k: v for k, v in asdict(self).items() if v is not None and v != ""})

    @classmethod
    def from_bytes(cls, payload: bytes) -> RoundOutlook:
        """Parse an outlook; MessageError if it is not JSON, of another protocol, or malformed."""
        d = load_message(payload, "round outlook")
        try:
            o = cls(**d)
            _check_seconds(o, ("sent_unix",))
            for key in ("devices_taking_part", "devices_needed", "open_round", "model_version"):
                if getattr(o, key) is not None:
                    check_count(getattr(o, key), key)
            if o.next_round_unix is not None:
                _check_seconds(o, ("next_round_unix",))
        except (TypeError, ValueError) as exc:
            raise MessageError(f"round outlook: {exc}") from None
        if not isinstance(o.run_id, str) or not isinstance(o.waiting_reason, str) or len(o.waiting_reason) > MAX_REASON_CHARS:
            raise MessageError(f"round outlook: waiting_reason must be text of at most {MAX_REASON_CHARS} characters")
        return o


MAX_REASON_CHARS = 200
"""Longest ``waiting_reason`` a coordinator status may carry (characters)."""


RECEIPT_STATES = ("accepted", "missing")


@dataclass(frozen=True)
class Receipt:
    """The coordinator's answer to an update, on the client's receipt topic (not retained).

    A client re-sends (with back-off, until the deadline) until it gets ``accepted`` for its
    transfer; ``missing`` lists the chunk indices to send again, of ``count`` announced.
    """

    run_id: str
    round: int
    stage: int
    transfer: str
    state: str
    missing: tuple[int, ...] = ()
    count: int = 0

    def to_bytes(self) -> bytes:
        return dump_message({**asdict(self), "missing": list(self.missing)})

    @classmethod
    def from_bytes(cls, payload: bytes) -> Receipt:
        """Parse a receipt; MessageError if it is not JSON, of another protocol, or malformed."""
        d = load_message(payload, "receipt")
        try:
            missing = d.get("missing", [])
            if not isinstance(missing, list) or len(missing) > 1024:
                raise ValueError("missing must be a list of at most 1024 chunk indices")
            d["missing"] = tuple(check_count(i, "missing[i]") for i in missing)
            r = cls(**d)
            check_count(r.round, "round")
            check_count(r.stage, "stage")
            check_count(r.count, "count")
        except (TypeError, ValueError) as exc:
            raise MessageError(f"receipt: {exc}") from None
        if r.state not in RECEIPT_STATES or not isinstance(r.run_id, str) or not isinstance(r.transfer, str) or len(r.transfer) != 64:
            raise MessageError(f"receipt: bad state {r.state!r:.40} or ids")
        return r


PROGRESS_VERSION = 1
"""Format version of :class:`RoundProgress`'s ``record`` (the round record's JSON form)."""

MAX_PROGRESS_BYTES = 1 << 20
"""Largest progress message, 1 MiB; the coordinator leaves the per-client parts out of a larger record."""


@dataclass(frozen=True)
class RoundProgress:
    """The retained record of a federation's last completed round, on ``Topics.progress`` (figures only, no tensors).

    ``record`` is ``coordinator.record.RoundRecord.to_json`` in format :data:`PROGRESS_VERSION`.
    """

    run_id: str
    round: int
    rounds: int
    record: dict[str, Any]
    version: int = PROGRESS_VERSION

    def to_bytes(self) -> bytes:
        """UTF-8 JSON; ValueError above :data:`MAX_PROGRESS_BYTES`."""
        d = {"protocol": PROTOCOL_VERSION, "version": self.version, "run_id": self.run_id, "round": self.round,
             "rounds": self.rounds, "record": self.record}  # fmt: skip
        out = json.dumps(d, allow_nan=True).encode()
        if len(out) > MAX_PROGRESS_BYTES:
            raise ValueError(f"round progress of round {self.round} is {len(out)} bytes, above {MAX_PROGRESS_BYTES}")
        return out

    @classmethod
    def from_bytes(cls, payload: bytes) -> RoundProgress:
        """Parse a progress message (the record is checked for its shape only).

        Raises
        ------
        MessageError
            If it is too large, not JSON, of another protocol or progress version, or malformed.
        """
        if len(payload) > MAX_PROGRESS_BYTES:
            raise MessageError(f"round progress: {len(payload)} bytes, above {MAX_PROGRESS_BYTES}")
        d = load_message(payload, "round progress")
        if d.get("version") != PROGRESS_VERSION:
            raise MessageError(f"round progress: version {d.get('version')!r:.20}, this build reads {PROGRESS_VERSION}")
        try:
            p = cls(**d)
            check_count(p.round, "round")
            check_count(p.rounds, "rounds")
        except (TypeError, ValueError) as exc:
            raise MessageError(f"round progress: {exc}") from None
        if not isinstance(p.run_id, str) or not isinstance(p.record, dict):
            raise MessageError("round progress: 'run_id' must be a string and 'record' an object")
        if p.record.get("round") != p.round:
            raise MessageError(f"round progress: the record is of round {p.record.get('round')!r:.20}, the message of {p.round}")
        return p
