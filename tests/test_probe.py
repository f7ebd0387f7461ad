"""The tuning probe chooses on validation windows carved leak-free from training windows, within the epoch budget."""

from __future__ import annotations

import numpy as np
import pytest

from har_models.data.splits import WINDOW_NS, SplitSpec, block_split
from har_models.data.subjects import DEFAULT_HAPT, parse_source, subject_sources
from har_models.settings import LrSchedule
from simulation.probe import (
    ProbeSetting,
    choose,
    load_clients,
    parse_candidate,
    parse_schedule,
    parse_servers,
    probe_servers,
    run_centralised,
    run_setting,
)


def test_choose_takes_the_best_validation_round_within_the_budget():
    a = ProbeSetting(0.01, 1, 4)
    b = ProbeSetting(0.1, 2, 3)
    curves = [
        (a, [{"round": r, "val_f1": f} for r, f in enumerate([0.5, 0.6, 0.7, 0.71])]),
        (b, [{"round": r, "val_f1": f} for r, f in enumerate([0.65, 0.8, 0.9])]),  # 2, 4, 6 epochs
    ]
    p, rounds, row = choose(curves, max_epochs=4)
    assert (p, rounds, row["val_f1"]) == (b, 2, 0.8)  # b's round 3 (6 epochs) is over budget
    p, rounds, _ = choose(curves, max_epochs=3)
    assert (p, rounds) == (a, 3)
    with pytest.raises(ValueError, match="no setting fits"):
        choose(curves, max_epochs=0)


def test_validation_never_shares_samples_with_probe_training_nor_test_windows():
    sources = dict(list(subject_sources("hapt", DEFAULT_HAPT).items())[:2])
    spec = SplitSpec(kind="blocks")
    clients = load_clients(sources, spec)
    for cid, text in sources.items():
        src = parse_source(text, spec)
        full = src.windows()
        t = full.t_start_ns
        session = np.concatenate([[0], np.cumsum(np.diff(t) < 0)])  # the clock restarts with each recording
        train_ids, test_ids = spec.assign(full.y, t, src.name)
        tr, va = block_split(full.y[train_ids], t[train_ids], 0.2, spec.seed + 1000)
        fit_ids, val_ids = train_ids[tr], train_ids[va]
        c = clients[cid]
        assert np.array_equal(c.val.t_start_ns, t[val_ids]) and np.array_equal(c.train.t_start_ns, t[fit_ids])
        assert len(val_ids) > 0
        for i in val_ids:
            for other in (fit_ids, test_ids):
                same = other[session[other] == session[i]]
                assert not np.any(np.abs(t[same] - t[i]) < WINDOW_NS), f"{cid}: validation window {i} shares samples"


@pytest.mark.slow
def test_a_tiny_probe_runs_and_measures_every_round():
    sources = dict(list(subject_sources("hapt", DEFAULT_HAPT).items())[:2])
    clients = load_clients(sources, SplitSpec(kind="blocks"))
    rows = run_setting(clients, ProbeSetting(0.05, 1, 2, "fedavgm", 1.0, 0.9), conv_filters=4, dense_units=8)
    assert [r["round"] for r in rows] == [0, 1]
    assert all(0.0 <= r["val_f1"] <= 1.0 and 0.0 <= r["test_f1"] <= 1.0 for r in rows)


def test_server_settings_left_out_are_the_coordinators():
    """``fedavgm`` alone means the main job's FedAvgM (eta 3, beta 0.5), not a value of the probe's own."""
    assert parse_servers("fedavgm,fedavgm:0.5:0.9,fedadam") == [
        ("fedavgm", 3.0, 0.5), ("fedavgm", 0.5, 0.9), ("fedadam", 0.01, 0.9)
    ]
    with pytest.raises(ValueError, match="unknown server 'fedsgd'; choose fedadam, fedavg, fedavgm, fedexp, fedyogi"):
        parse_servers("fedsgd")
    # The probe trains every client plainly, so it offers the registered strategies whose clients do just that.
    assert probe_servers() == ("fedadam", "fedavg", "fedavgm", "fedexp", "fedyogi")
    assert ProbeSetting(0.1, 1, 1, "fedyogi", 0.02, 0.8).label == "lr=0.1 E=1 fedyogi(eta=0.02, beta=0.8)"
    assert ProbeSetting(0.1, 1, 1).label == "lr=0.1 E=1"
    # FedExP alone keeps its cap sized by the number of clients (None), with a number the cap is fixed
    assert parse_servers("fedexp,fedexp:3:0") == [("fedexp", None, 0.5), ("fedexp", 3.0, 0.0)]
    assert ProbeSetting(0.1, 1, 1, "fedexp", None, 0.5).label == "lr=0.1 E=1 fedexp(eta=auto, beta=0.5)"


def test_a_scheduled_setting_is_chosen_only_at_its_last_round():
    """Stopped early, a cosine run is another schedule (its lr would have decayed sooner), so only its end counts."""
    flat = ProbeSetting(0.1, 1, 3)
    cos = ProbeSetting(0.1, 1, 3, schedule=LrSchedule("cosine"))
    curves = [(flat, [{"round": r, "val_f1": f} for r, f in enumerate([0.5, 0.6, 0.7])]),
              (cos, [{"round": r, "val_f1": f} for r, f in enumerate([0.5, 0.9, 0.65])])]
    p, rounds, row = choose(curves, max_epochs=3)
    assert (p, rounds, row["val_f1"]) == (flat, 3, 0.7)  # cos's 0.9 is at round 1 of 3
    assert cos.label == "lr=0.1 E=1 cosine" and [cos.round_lr(r) for r in range(3)] == pytest.approx([0.1, 0.075, 0.025])


def test_schedule_and_candidate_texts_parse_to_the_settings_they_name():
    assert parse_schedule("constant") == LrSchedule()
    assert parse_schedule("cosine:1:0.1") == LrSchedule("cosine", warmup_rounds=1, min_factor=0.1)
    assert parse_schedule("step:0:5:0.3") == LrSchedule("step", step_every=5, step_gamma=0.3)
    for bad, named in (("linear", "unknown lr schedule 'linear'"), ("cosine:1:0:3", "at most 2 numbers"),
                       ("step:x", "warmup_rounds 'x' is not a number"), ("cosine:0:2", "min_factor")):
        with pytest.raises(ValueError, match=named):
            parse_schedule(bad)
    p = parse_candidate("server=fedavgm:2:0.7 lr=0.05 E=3 batch=64 schedule=cosine:1", max_epochs=15)
    assert p == ProbeSetting(0.05, 3, 5, "fedavgm", 2.0, 0.7, 64, LrSchedule("cosine", warmup_rounds=1))
    assert p.label == "lr=0.05 E=3 fedavgm(eta=2, beta=0.7) B=64 cosine(warmup 1)"
    # Left-out keys are the main job's defaults (FedAvgM eta 3 beta 0.5, lr 0.1, E = 1, batch 32).
    assert parse_candidate("", max_epochs=15) == ProbeSetting(0.1, 1, 15, "fedexp", None, 0.5)
    assert parse_candidate("E=5 rounds=2", max_epochs=15).rounds == 2
    for bad, named in (("eta=2", "'eta=2' is not KEY=VALUE"), ("server=fedsgd", "unknown server"),
                       ("E=0", "need E >= 1"), ("lr=fast", "could not convert")):
        with pytest.raises(ValueError, match=named):
            parse_candidate(bad, max_epochs=15)


@pytest.mark.slow
def test_the_scheduled_lr_is_what_each_round_trains_at_and_the_centralised_target_runs():
    sources = dict(list(subject_sources("hapt", DEFAULT_HAPT).items())[:2])
    clients = load_clients(sources, SplitSpec(kind="blocks"))
    p = ProbeSetting(0.1, 1, 3, "fedavgm", 1.0, 0.5, 16, LrSchedule("step", warmup_rounds=1, step_every=1, step_gamma=0.5))
    rows = run_setting(clients, p, conv_filters=4, dense_units=8)
    assert [r["lr"] for r in rows] == pytest.approx([0.05, 0.1, 0.05])
    central = run_centralised(clients, 2, conv_filters=4, dense_units=8)
    assert [r["round"] for r in central] == [0, 1] and all(0.0 <= r["val_f1"] <= 1.0 for r in central)
