"""The paper's leaky split, the leak-free blocks split and the label-skewed partition: known answers, no leak, both sides agree."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edge_client.sources import ingest_source
from edge_client.store import ClientStore
from har_models.data.splits import (
    DEFAULT_SPLIT,
    WINDOW_NS,
    SplitSpec,
    block_split,
    kept_and_split,
    skewed_classes,
    window_segments,
)
from har_models.data.subjects import parse_source, union_test_set

ROOT = Path(__file__).resolve().parents[1]
HAPT = ROOT / "datasets" / "hapt"
STEP_NS = 64 * 20_000_000  # 1.28 s between window starts


def _shared_samples(t_a: int, t_b: int) -> bool:
    """Two windows of one session share raw samples when their 2.56 s intervals meet (independent check)."""
    return max(t_a, t_b) < min(t_a, t_b) + 128 * 20_000_000


def test_block_split_known_answer_one_segment():
    # 10 overlapping windows of one class: k = round(0.2 * 10) = 2; default_rng(1).integers(2) = 0 -> block at the start,
    # window 2 shares samples with window 1 (the gap) and is dropped; 3..9 train.
    y, t = np.zeros(10, np.int64), np.arange(10) * STEP_NS
    tr, te = block_split(y, t, 0.2, 1)
    assert te.tolist() == [0, 1] and tr.tolist() == [3, 4, 5, 6, 7, 8, 9]


def test_block_split_known_answer_two_segments():
    # Class 0 (10 windows) then, after a 10 s pause, class 1 (5 windows). Coins of default_rng(1): 0, 1.
    y = np.array([0] * 10 + [1] * 5)
    t = np.concatenate([np.arange(10) * STEP_NS, 30_000_000_000 + np.arange(5) * STEP_NS])
    assert window_segments(y, t).tolist() == [0] * 10 + [1] * 5
    tr, te = block_split(y, t, 0.2, 1)
    # segment 0: test 0, 1 (start), gap 2; segment 1: k = round(1.0) = 1 at the end -> test 14, gap 13
    assert te.tolist() == [0, 1, 14] and tr.tolist() == [3, 4, 5, 6, 7, 8, 9, 10, 11, 12]


def test_short_segments_give_no_test_block_and_sessions_restart_their_clock():
    # Two windows: k = min(round(0.4), 0) = 0 -> all train. Second session restarts at t = 0: another segment.
    y = np.zeros(4, np.int64)
    t = np.array([0, STEP_NS, 0, STEP_NS])
    assert window_segments(y, t).tolist() == [0, 0, 1, 1]
    tr, te = block_split(y, t, 0.2, 1)
    assert te.size == 0 and tr.tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_blocks_leave_no_test_sample_in_any_training_window_on_hapt(seed):
    for sid in ("01", "05", "17"):
        src = parse_source(f"hapt:{HAPT / f'user{sid}.npz'}", SplitSpec(seed=seed, kind="blocks"))
        w = src.windows()
        t = w.t_start_ns
        session = np.concatenate([[0], np.cumsum(np.diff(t) < 0)])
        tr, te = src.split.assign(w.y, t, src.name)
        assert np.intersect1d(tr, te).size == 0
        for i in te:
            same = tr[session[tr] == session[i]]
            assert not any(_shared_samples(int(t[i]), int(t[j])) for j in same), f"user{sid}: test window {i} leaks"
        # every class keeps test windows, and the test share stays near 20 % of the kept windows
        assert set(np.unique(w.y[te])) == set(np.unique(w.y))
        assert 0.17 < te.size / (tr.size + te.size) < 0.26
        # what is dropped is exactly the training-side neighbours of test windows
        dropped = np.setdiff1d(np.arange(len(w)), np.union1d(tr, te))
        for j in dropped:
            assert any(session[i] == session[j] and _shared_samples(int(t[i]), int(t[j])) for i in te)


def test_the_paper_split_leaks():
    # HAPT subject 1: most of its 67 random test windows share samples with training windows (issue 13: 62 of 67).
    src = parse_source(f"hapt:{HAPT / 'user01.npz'}")
    w = src.windows()
    tr, te = src.split.assign(w.y, w.t_start_ns, src.name)
    t = w.t_start_ns
    session = np.concatenate([[0], np.cumsum(np.diff(t) < 0)])
    leaky = sum(any(session[j] == session[i] and _shared_samples(int(t[i]), int(t[j])) for j in tr) for i in te)
    assert te.size == 67 and leaky == 62


def test_label_skew_known_class_sets():
    # default_rng([seed, crc32(subject)]): count 2 + integers(2), then that many classes without replacement.
    six = np.arange(6)
    assert skewed_classes(six, "user01", 1).tolist() == [2, 5]
    assert skewed_classes(six, "user02", 1).tolist() == [0, 4]
    assert skewed_classes(six, "user03", 1).tolist() == [1, 4, 5]
    assert skewed_classes(six, "user04", 1).tolist() == [4, 5]
    assert skewed_classes(six, "user01", 2).tolist() == [1, 2]
    assert skewed_classes(np.array([3]), "user01", 1).tolist() == [3]  # never more than present


@pytest.mark.parametrize("kind", ["paper", "blocks"])
def test_label_skew_keeps_exactly_the_drawn_classes(kind):
    spec = SplitSpec(kind=kind, partition="label_skew")
    for sid, classes in (("01", [2, 5]), ("02", [0, 4]), ("03", [1, 4, 5])):
        src = parse_source(f"hapt:{HAPT / f'user{sid}.npz'}", spec)
        train, test = src.train_test()
        assert sorted(set(train.y.tolist())) == classes and sorted(set(test.y.tolist())) == classes
    with pytest.raises(ValueError, match="needs the subject name"):
        spec.assign(np.zeros(3, np.int64), np.zeros(3, np.int64))


@pytest.mark.parametrize("text", ["blocks", "blocks+label_skew", "paper+label_skew", "blocks+label_skew2"])
def test_client_store_and_evaluation_harness_split_identically(tmp_path, text):
    source_text = f"hapt:{HAPT / 'user05.npz'}"
    spec = SplitSpec.parse(text, seed=3)
    store = ClientStore(tmp_path / "client", parse_source(source_text).labels)
    n_train, n_test = ingest_source(store, parse_source(source_text, spec))
    client_train, client_test = store.windows("train"), store.windows("test")
    assert store.get_meta("split") == spec.to_json()
    store.close()
    harness_test = union_test_set({"hapt-05": source_text}, split=spec)
    assert (n_train, n_test) == (len(client_train), len(client_test))
    assert np.array_equal(client_test.t_start_ns, harness_test.t_start_ns)
    assert client_test.x.tobytes() == harness_test.x.tobytes()
    harness_train = parse_source(source_text, spec).train_test()[0]
    assert np.array_equal(client_train.t_start_ns, harness_train.t_start_ns)
    # another seed: other blocks
    other = union_test_set({"hapt-05": source_text}, split=SplitSpec.parse(text, seed=4))
    assert not np.array_equal(other.t_start_ns, harness_test.t_start_ns)


def test_kept_and_split_indexes_the_kept_windows():
    src = parse_source(f"hapt:{HAPT / 'user01.npz'}", SplitSpec(kind="blocks"))
    w = src.windows()
    kept, fixed = kept_and_split(w, src.split, src.name)
    tr, te = fixed.indices(kept.y)
    assert np.array_equal(np.sort(np.concatenate([tr, te])), np.arange(len(kept)))
    assert np.array_equal(kept.subset(te).t_start_ns, src.train_test()[1].t_start_ns)
    with pytest.raises(ValueError, match="labels differ"):
        fixed.indices(kept.y[::-1])


def test_spec_text_tag_and_errors():
    assert SplitSpec.parse("blocks+label_skew", seed=2) == SplitSpec(seed=2, kind="blocks", partition="label_skew")
    assert SplitSpec.parse("paper").plain and SplitSpec.parse("paper").text == "paper"
    assert SplitSpec(kind="blocks").tag() == "|seed=1|split=blocks"
    assert SplitSpec().tag() == "|seed=1"  # the paper split keeps its old store key
    assert SplitSpec(kind="blocks").to_json() == {"kind": "blocks", "partition": "subject", "test_fraction": 0.2, "seed": 1}
    with pytest.raises(ValueError, match="kind must be one of"):
        SplitSpec.parse("random")
    with pytest.raises(ValueError, match="partition must be one of"):
        SplitSpec.parse("blocks+dirichlet")
    with pytest.raises(ValueError, match="needs window times"):
        SplitSpec(kind="blocks").indices(np.zeros(3, np.int64))
    assert WINDOW_NS == 2_560_000_000


@pytest.mark.slow  # three programs started for --help
def test_simulate_and_client_accept_the_split_option():
    for module in ("simulation.simulate", "edge_client.cli", "simulation.baselines"):
        out = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, cwd=ROOT, check=False)
        assert "--split " in out.stdout or "--split SPLIT" in out.stdout, module


def test_every_program_defaults_to_the_leak_free_split():
    """Clients, the simulation and the coordinator's evaluation harness must agree when nobody passes --split."""
    from coordinator.cli import build_parser as coordinator_parser
    from edge_client.cli import build_parser as client_parser
    from simulation.simulate import build_parser as simulate_parser

    assert DEFAULT_SPLIT == "blocks"
    assert client_parser().parse_args(["--client-id", "c1", "--source", "hapt:x.npz"]).split == "blocks"
    assert simulate_parser().parse_args([]).split == "blocks"
    assert coordinator_parser().parse_args([]).eval_split == "blocks"


def test_label_skew2_known_class_sets():
    # the same generator as label_skew: a client that drew 2 classes keeps them, one that drew 3 keeps 2 others
    six = np.arange(6)
    assert skewed_classes(six, "user01", 1, n_keep=2).tolist() == [2, 5]  # label_skew: [2, 5]
    assert skewed_classes(six, "user03", 1, n_keep=2).tolist() == [1, 5]  # label_skew: [1, 4, 5]
    assert skewed_classes(six, "user01", 2, n_keep=2).tolist() == [1, 2]
    with pytest.raises(ValueError, match="n_keep must be at least 1"):
        skewed_classes(six, "user01", 1, n_keep=0)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["paper", "blocks"])
def test_label_skew2_gives_every_hapt_client_exactly_two_classes_and_loses_no_other_window(kind):
    spec = SplitSpec.parse(f"{kind}+label_skew2", seed=1)
    assert spec.partition == "label_skew2" and spec.text == f"{kind}+label_skew2"
    plain = SplitSpec(seed=1, kind=kind)
    for sid in range(1, 31):
        src = parse_source(f"hapt:{HAPT / f'user{sid:02d}.npz'}", spec)
        w = src.windows()
        tr, te = spec.assign(w.y, w.t_start_ns, src.name)
        kept = skewed_classes(w.y, src.name, 1, n_keep=2)
        assert kept.size == 2 and set(np.unique(w.y[tr])) == set(np.unique(w.y[te])) == set(kept.tolist()), sid
        of_kept = np.flatnonzero(np.isin(w.y, kept))
        # the kept classes' windows split as the partition by subject would split them alone
        sub_tr, sub_te = plain.assign(w.y[of_kept], w.t_start_ns[of_kept], src.name)
        assert np.array_equal(tr, of_kept[sub_tr]) and np.array_equal(te, of_kept[sub_te])
        if kind == "paper":  # nothing but the other classes is dropped
            assert np.array_equal(np.union1d(tr, te), of_kept)
        else:  # and under blocks only the gap next to test windows (at most one window each side of a block)
            n_segments = len(np.unique(window_segments(w.y[of_kept], w.t_start_ns[of_kept])))
            assert np.setdiff1d(of_kept, np.union1d(tr, te)).size <= 2 * n_segments


def test_label_skew2_is_the_same_for_the_same_seed_and_differs_for_another():
    def classes(seed: int) -> list[list[int]]:
        return [skewed_classes(np.arange(6), f"user{sid:02d}", seed, n_keep=2).tolist() for sid in range(1, 31)]

    assert classes(1) == classes(1)
    assert classes(1) != classes(2)
    src = parse_source(f"hapt:{HAPT / 'user05.npz'}")
    w = src.windows()
    a = SplitSpec.parse("blocks+label_skew2", seed=3).assign(w.y, w.t_start_ns, src.name)
    b = SplitSpec.parse("blocks+label_skew2", seed=3).assign(w.y, w.t_start_ns, src.name)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    with pytest.raises(ValueError, match="the label_skew2 partition needs the subject name"):
        SplitSpec.parse("blocks+label_skew2").assign(np.zeros(3, np.int64), np.zeros(3, np.int64))
