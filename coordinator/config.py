"""Configuration of the coordinator: one typed object, the same names on the CLI and in reports."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from har_io.mqtt_link import BrokerConfig
from har_models.protocol import check_client_id

AGGREGATIONS = ("fedavg", "fedprox", "fedper", "feddwa")
GROWTHS = ("none", "feddist")
CLIENT_INITS = ("overwrite", "ala")
GROWTH_MODES = ("auto", "paper", "function_preserving")


@dataclass(frozen=True)
class CoordinatorConfig:
    """Everything the coordinator needs to run a federation.

    Parameters
    ----------
    run_dir : Path
        Run folder: state database, models, report.
    broker : BrokerConfig
    federation : str
        Topic namespace ``fedhar/v1/{federation}``.
    run_id : str
        Identifies the run (clients keep per-run state apart).
    rounds : int
        Communication rounds R.
    expected_clients : int, optional
        Start as soon as this many clients are online (else wait ``start_timeout_s``).
    min_clients : int
        Fewest clients a round may start with.
    start_timeout_s : float
        Seconds to wait for ``expected_clients`` before starting with those present.
    start_settle_s : float
        Without ``expected_clients``: start once ``min_clients`` are online and no further
        client has come online for this many seconds.
    round_timeout_s : float
        Deadline of each exchange, seconds after its announcement.
    fraction : float
        Share of eligible clients selected per round (1.0 = all, as FedDist).
    seed : int
        Seeds the initial model, client selection and the clients' local shuffling.
    local_epochs, lr, batch_size, class_weights :
        Local training (FedDist: E = 5, lr 0.01, batch 32, balanced class weights).
    aggregation : {"fedavg", "fedprox", "fedper", "feddwa"}
    growth : {"none", "feddist"}
    client_init : {"overwrite", "ala"}
    prox_mu : float
        FedProx mu.
    top_k : int
        FedDWA K.
    feddist_mode : {"auto", "paper", "function_preserving"}
        Outgoing weights of new units copied from the source client (with the paper's
        intermediate layer-wise rounds) or zero (no client's function changes). "auto"
        (default) picks "paper" for plain FedDist (FedAvg aggregation, overwrite
        initialisation: comparable with the paper) and "function_preserving" when growth
        is combined with personalisation (reference/algorithms.md section 5.2, step 6).
    feddist_k0, feddist_delta, feddist_period, feddist_max_width_factor :
        k_r = k0 + delta * floor(r / period); width cap relative to round 0.
    ala : dict
        FedALA settings passed to clients (eta, rand_percent, layer_idx, threshold, ...).
    conv_filters, dense_units : int
        Initial widths of the CNN (196, 1024).
    generalisation_every : int
        Evaluate every client's model on the union test set every this many rounds (and
        in the last round); it costs one full evaluation per client. 0 = last round only.
    max_update_bytes : int
        Largest update envelope accepted (bytes).
    resume : bool
        Continue the run found in ``run_dir`` after its last completed round.
    """

    run_dir: Path
    broker: BrokerConfig = field(default_factory=BrokerConfig)
    federation: str = "default"
    run_id: str = "run"
    rounds: int = 10
    expected_clients: int | None = None
    min_clients: int = 1
    start_timeout_s: float = 300.0
    start_settle_s: float = 10.0
    round_timeout_s: float = 600.0
    fraction: float = 1.0
    seed: int = 1
    local_epochs: int = 1
    lr: float = 0.01
    batch_size: int = 32
    class_weights: str = "balanced"
    aggregation: str = "fedavg"
    growth: str = "none"
    client_init: str = "overwrite"
    prox_mu: float = 0.01
    top_k: int = 5
    feddist_mode: str = "auto"
    feddist_k0: float = 3.0
    feddist_delta: float = 0.25
    feddist_period: int = 5
    feddist_max_width_factor: float = 2.0
    ala: dict[str, Any] = field(default_factory=dict)
    conv_filters: int = 196
    dense_units: int = 1024
    generalisation_every: int = 5
    max_update_bytes: int = 512 * 1024 * 1024
    resume: bool = False

    def __post_init__(self) -> None:
        check_client_id(self.run_id)
        for name, allowed in (
            ("aggregation", AGGREGATIONS),
            ("growth", GROWTHS),
            ("client_init", CLIENT_INITS),
            ("feddist_mode", GROWTH_MODES),
            ("class_weights", ("balanced", "none")),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.rounds < 1 or self.min_clients < 1 or not 0 < self.fraction <= 1:
            raise ValueError(
                f"need rounds >= 1, min_clients >= 1, 0 < fraction <= 1; got {self.rounds}, {self.min_clients}, {self.fraction}"
            )
        if self.round_timeout_s <= 0 or self.start_timeout_s < 0:
            raise ValueError("round_timeout_s must be > 0 and start_timeout_s >= 0")

    @property
    def growth_mode(self) -> str:
        """The FedDist mode in force ("paper" or "function_preserving"), with "auto" resolved."""
        if self.feddist_mode != "auto":
            return self.feddist_mode
        plain = self.aggregation in ("fedavg", "fedprox") and self.client_init == "overwrite"
        return "paper" if plain else "function_preserving"

    def to_json(self) -> dict[str, Any]:
        """Plain-JSON form for the state database and the report (password left out)."""
        d = asdict(self)
        d["run_dir"] = str(self.run_dir)
        d["feddist_mode_in_force"] = self.growth_mode
        d["broker"] = {k: v for k, v in asdict(self.broker).items() if k != "password"}
        return d

    @property
    def strategy_label(self) -> str:
        """Human-readable combination, e.g. ``feddwa + feddist(paper) + ala``."""
        parts = [self.aggregation]
        if self.growth != "none":
            parts.append(f"{self.growth}({self.growth_mode})")
        if self.client_init != "overwrite":
            parts.append(self.client_init)
        return " + ".join(parts)
