"""One typed configuration: defaults written once, TOML round-trip, bad keys and types named at the start."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from coordinator.cli import build_parser, config_from_args, main
from coordinator.config import CoordinatorConfig, EvaluationSettings, Timing, TrainingSettings
from coordinator.strategies.feddwa import FedDWASettings
from coordinator.strategies.fedopt import ServerOptSettings
from coordinator.strategies.fedprox import FedProxSettings
from har_io.cli import option_fields, option_flag, read_settings_file, write_settings_file
from har_models.nn.training import TrainConfig
from har_models.settings import AlaConfig, LocalTraining, from_mapping
from har_models.wire.messages import MessageError, TrainingPlan


def test_cli_without_options_gives_exactly_the_dataclass_defaults(tmp_path: Path) -> None:
    args = build_parser().parse_args([])
    assert config_from_args(args, run_dir=tmp_path) == CoordinatorConfig(run_dir=tmp_path)


def test_help_shows_each_dataclass_default() -> None:
    helps = {a.option_strings[0]: a.help or "" for a in build_parser()._actions if a.option_strings}
    for _, f, _ in option_fields(CoordinatorConfig):  # nested tables too: --prox-mu is [fedprox] mu
        default = f.default if f.default is not dataclasses.MISSING else None
        if default is None:
            continue
        m = re.search(r"\(default ([^)]*)\)$", helps[option_flag(f)])
        assert m is not None, f"{option_flag(f)}: no default in its help"
        assert m.group(1) == str(default), f"{option_flag(f)} shows {m.group(1)}, dataclass says {default}"


def test_training_defaults_have_one_source() -> None:
    # Hand-written copies of these numbers were what let six defaults drift apart.
    plan, train, cfg = TrainingPlan(), TrainConfig(), CoordinatorConfig(run_dir=Path("."))
    assert (plan.lr, train.lr, cfg.training.lr) == (LocalTraining.lr,) * 3 == (0.1,) * 3
    assert (plan.batch_size, train.batch_size, cfg.training.batch_size) == (LocalTraining.batch_size,) * 3 == (32,) * 3
    assert (plan.local_epochs, train.epochs, cfg.training.local_epochs) == (1, 1, 1)


def test_options_override_the_file_which_overrides_defaults(tmp_path: Path) -> None:
    f = tmp_path / "fed.toml"
    f.write_text('rounds = 3\nlr = 0.05\naggregation = "feddwa"\n[ala]\neta = 0.5\n')
    args = build_parser().parse_args(["--config", str(f), "--lr", "0.2"])
    cfg = config_from_args(args, run_dir=tmp_path)
    assert (cfg.rounds, cfg.training.lr, cfg.aggregation, cfg.ala.eta, cfg.ala.rand_percent) == (3, 0.2, "feddwa", 0.5, 80.0)


def test_resolved_settings_round_trip_through_toml(tmp_path: Path) -> None:
    cfg = CoordinatorConfig(
        run_dir=tmp_path, rounds=7, client_init="ala", ala=AlaConfig(eta=0.25, layer_idx=4), training=TrainingSettings(lr=0.03),
        evaluation=EvaluationSettings(split_seed=3), timing=Timing(expected_clients=None),
    )
    write_settings_file(tmp_path / "config.toml", cfg.settings())
    back = config_from_args(build_parser().parse_args(["--config", str(tmp_path / "config.toml")]), run_dir=tmp_path)
    assert back == cfg
    assert read_settings_file(tmp_path / "config.toml")["ala"]["layer_idx"] == 4


def test_strategy_settings_are_tables_with_the_old_flags_and_each_default_written_once(tmp_path: Path) -> None:
    cfg = CoordinatorConfig(run_dir=tmp_path)
    tables = cfg.strategies
    assert (tables.fedprox, tables.feddwa, tables.server_opt) == (FedProxSettings(0.01), FedDWASettings(5), ServerOptSettings())
    args = build_parser().parse_args(["--prox-mu", "0.2", "--top-k", "3", "--server-lr", "0.5", "--server-momentum", "0.1"])
    got = config_from_args(args, run_dir=tmp_path)
    t = got.strategies
    assert (t.fedprox.mu, t.feddwa.top_k, t.server_opt.lr, t.server_opt.momentum) == (0.2, 3, 0.5, 0.1)
    f = tmp_path / "fed.toml"
    f.write_text('aggregation = "feddwa"\n[strategies.feddwa]\ntop_k = 2\n[strategies.fedprox]\nmu = 0.3\n')
    got = config_from_args(build_parser().parse_args(["--config", str(f), "--prox-mu", "0.4"]), run_dir=tmp_path)
    t = got.strategies
    assert (t.feddwa.top_k, t.fedprox.mu) == (2, 0.4)  # the option wins over the file, the rest of the table stays
    doc = got.to_json()["strategies"]
    assert doc["feddwa"] == {"top_k": 2, "gram": "float32"} and doc["fedprox"] == {"mu": 0.4} and "top_k" not in doc


def test_a_file_with_the_old_flat_keys_still_loads(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    f = tmp_path / "old.toml"  # a run folder's config.toml as written before the tables
    f.write_text('aggregation = "fedavgm"\nprox_mu = 0.02\ntop_k = 4\nserver_lr = 0.7\nserver_momentum = 0.3\n')
    cfg = config_from_args(build_parser().parse_args(["--config", str(f)]), run_dir=tmp_path)
    assert cfg.strategies.fedprox == FedProxSettings(0.02) and cfg.strategies.feddwa == FedDWASettings(4)
    assert cfg.strategies.server_opt == ServerOptSettings(lr=0.7, momentum=0.3)
    assert "'prox_mu' is the old name of [strategies.fedprox] mu" in caplog.text
    f.write_text("top_k = 4\n[strategies.feddwa]\ntop_k = 3\n")
    with pytest.raises(ValueError, match=r"'top_k' and \[strategies.feddwa\] top_k both given; keep only \[strategies.feddwa\] top_k"):
        config_from_args(build_parser().parse_args(["--config", str(f)]), run_dir=tmp_path)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("rnds = 3\n", "'rnds' (did you mean 'rounds'?)"),
        ("[fedprox]\nmuu = 0.1\n", "[fedprox]: unknown setting 'muu' (did you mean 'mu'?)"),
        ("[feddwa]\ntop_k = 0\n", "FedDWASettings.top_k must be >= 1, got 0"),
        ("[server_opt]\nmomentum = 1.5\n", "momentum (--server-momentum) in [0, 1)"),
        ("fedprox = 0.1\n", "'fedprox' must be a table of settings ([strategies.fedprox])"),
        ('rounds = "ten"\n', "CoordinatorConfig.rounds = 'ten': expected an integer"),
        ("lr = true\n", "TrainingSettings.lr = True: expected a finite number"),
        ('aggregation = "fedsgd"\n', "aggregation must be one of"),
        ("[ala]\nrand_pct = 50\n", "'rand_pct' (did you mean 'rand_percent'?)"),
        ("[ala]\neta = -1.0\n", "AlaConfig.eta must be finite and >= 0, got -1.0"),
    ],
)
def test_a_bad_key_or_type_fails_at_start_with_the_key_named(tmp_path: Path, text: str, named: str) -> None:
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(ValueError) as err:
        config_from_args(build_parser().parse_args(["--config", str(f)]), run_dir=tmp_path)
    assert named in str(err.value)
    assert str(f) in str(err.value)


def test_coordinator_refuses_an_ala_typo_before_anything_is_sent(capsys: pytest.CaptureFixture[str]) -> None:
    # Port 1 is never a broker: had the options been accepted, the coordinator would fail later with exit 5.
    rc = main(["--client-init", "ala", "--ala", '{"etaa": 1}', "--broker", "127.0.0.1:1"])
    assert rc == 2
    assert "unknown setting 'etaa' (did you mean 'eta'?)" in capsys.readouterr().err


def test_a_plan_with_a_bad_ala_object_is_refused_where_it_enters_the_client() -> None:
    ok = TrainingPlan.from_json({"client_init": "ala", "ala": {"eta": 0.5}})
    assert ok.ala_config() == AlaConfig(eta=0.5)
    for bad in ({"rand_pct": 50}, {"eta": "fast"}, {"layer_idx": 1.5}, {"mode": "test"}, [1, 2]):
        with pytest.raises(MessageError, match="ala"):
            TrainingPlan.from_json({"client_init": "ala", "ala": bad})


def test_from_mapping_rejects_what_the_dataclass_does_not_declare() -> None:
    assert from_mapping(LocalTraining, {"lr": 1}) == LocalTraining(lr=1.0)
    with pytest.raises(ValueError, match="expected an integer"):
        from_mapping(LocalTraining, {"batch_size": 32.0})
    with pytest.raises(ValueError, match="one of"):
        from_mapping(AlaConfig, {"mode": "sometimes"})


def test_a_file_of_an_earlier_release_is_rewritten_in_the_tables_and_reads_as_before(tmp_path: Path) -> None:
    from coordinator.config import upgrade_file

    old = ('aggregation = "fedavgm"\nconv_filters = 4\ncohort_goal = 3\nguard = true\nguard_margin = 5.0\ntransport = "blobs"\n'
           "[server_opt]\nlr = 0.7\n[schedule]\nmin_clients = 3\n")  # fmt: skip
    f = tmp_path / "server.toml"
    f.write_text(old)
    before = from_mapping(CoordinatorConfig, CoordinatorConfig.migrate({k: v for k, v in read_settings_file(f).items()
                                                                       if k != "schedule"}), run_dir=tmp_path)  # fmt: skip
    assert upgrade_file(f) and (tmp_path / "server.toml.old").read_text() == old
    new = read_settings_file(f)
    assert new["model"] == {"conv_filters": 4} and new["cohort"] == {"goal": 3} and new["schedule"] == {"min_clients": 3}
    assert new["guard"] == {"enabled": True, "margin": 5.0} and new["strategies"] == {"server_opt": {"lr": 0.7}}
    after = from_mapping(CoordinatorConfig, {k: v for k, v in new.items() if k != "schedule"}, run_dir=tmp_path)
    assert after == before
    assert not upgrade_file(f)  # already in the tables: left alone
