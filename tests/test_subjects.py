"""Sources carry their split; one split serves the client's store and the coordinator; empty clients are found before start."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_realworld import sensor_members, standard_archives, write_dataset, zip_bytes

from edge_client.sources import ingest_source
from edge_client.store import ClientStore
from har_models.data import subjects
from har_models.data.splits import SplitSpec
from har_models.data.subjects import count_windows, drop_empty_sources, parse_source, split, union_test_set
from har_models.data.windowing import stratified_split

ROOT = Path(__file__).resolve().parents[1]
USER05 = ROOT / "datasets" / "hapt" / "user05.npz"


def test_split_spec_is_the_stratified_split():
    y = np.repeat(np.arange(6), [10, 11, 12, 13, 14, 15])
    for seed in (1, 2, 7):
        tr, te = SplitSpec(seed=seed).indices(y)
        tr2, te2 = stratified_split(y, 0.2, seed)
        assert np.array_equal(tr, tr2) and np.array_equal(te, te2)
        # round(0.2 n_c) test windows per class: 2, 2, 2, 3, 3, 3
        assert np.bincount(y[te]).tolist() == [2, 2, 2, 3, 3, 3]
    assert SplitSpec().tag() == "|seed=1" and SplitSpec(0.25, 3).tag() == "|seed=3|test=0.25"
    assert SplitSpec(seed=2).to_json() == {"kind": "stratified", "test_fraction": 0.2, "seed": 2}
    with pytest.raises(ValueError, match="test_fraction must be in"):
        SplitSpec(test_fraction=1.0)
    with pytest.raises(ValueError, match="seed must be an integer >= 0"):
        SplitSpec(seed=-1)


def test_split_seed_flows_to_the_store_and_to_the_evaluation_harness(tmp_path):
    text = f"hapt:{USER05}"
    seeds = {}
    for seed in (1, 2):
        src = parse_source(text, SplitSpec(seed=seed))
        assert src.split.seed == seed
        store = ClientStore(tmp_path / f"seed{seed}", src.labels)
        assert ingest_source(store, src) == (231, 59)
        client_test = store.windows("test")
        assert store.get_meta("split") == {"kind": "stratified", "test_fraction": 0.2, "seed": seed}
        store.close()
        harness_test = union_test_set({"hapt-05": text}, seed=seed)
        assert client_test.x.tobytes() == harness_test.x.tobytes()
        assert np.array_equal(client_test.t_start_ns, harness_test.t_start_ns)
        assert harness_test.x.tobytes() == union_test_set({"hapt-05": text}, split=SplitSpec(seed=seed)).x.tobytes()
        seeds[seed] = client_test.t_start_ns
    assert not np.array_equal(seeds[1], seeds[2])  # another seed, other test windows
    # the free function and the object agree
    src = parse_source(text)
    assert split(src.windows(), 1)[1].x.tobytes() == src.train_test()[1].x.tobytes()


def test_a_store_keeps_one_split_per_source_key(tmp_path):
    store = ClientStore(tmp_path, parse_source(f"hapt:{USER05}").labels)
    ingest_source(store, parse_source(f"hapt:{USER05}", SplitSpec(seed=1)))
    first = store.windows("test").t_start_ns
    ingest_source(store, parse_source(f"hapt:{USER05}", SplitSpec(seed=2)))  # another seed: ingested again
    assert not np.array_equal(store.windows("test").t_start_ns, first)
    store.close()


def _gyro_only_and_full(tmp_path: Path) -> Path:
    full = standard_archives()
    gyro_only = {name: data for name, data in full.items() if name.startswith("gyr_")}
    seconds = dict(full)  # acc of every activity in whole seconds: archives pair up, but no CSV is usable
    for name in [n for n in full if n.startswith("acc_")]:
        act = name.removeprefix("acc_").removesuffix("_csv.zip")
        members = sensor_members("acc", act)
        for csv in [m for m in members if m.endswith(".csv")]:
            lines = members[csv].decode().splitlines()
            members[csv] = "\n".join(
                [lines[0]] + [",".join([f[0], str(int(f[1]) // 1000), *f[2:]]) for f in (row.split(",") for row in lines[1:])]
            ).encode()
        seconds[name] = zip_bytes(members)
    return write_dataset(tmp_path, {1: full, 2: gyro_only, 3: seconds}, zipped=True)


def test_count_windows_and_dropping_empty_clients(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHAR_CACHE_DIR", str(tmp_path / "cache"))
    assert count_windows(f"hapt:{USER05}") == 290 == count_windows(parse_source(f"hapt:{USER05}"))
    root = _gyro_only_and_full(tmp_path / "data")
    text = {k: f"realworld:{root}:proband{k}:chest,shin" for k in (1, 2, 3)}
    assert count_windows(text[1]) == 32
    assert count_windows(text[3]) == 0  # pairs exist, every acc CSV is rejected (whole seconds)
    # gyro only: decided from the listing, no CSV is parsed
    monkeypatch.setattr(subjects, "load_windows", lambda spec: pytest.fail("the listing should have sufficed"))
    assert count_windows(text[2]) == 0
    monkeypatch.undo()
    monkeypatch.setenv("FEDHAR_CACHE_DIR", str(tmp_path / "cache"))
    sources = {"proband1": text[1], "proband2": text[2], "proband3": text[3], "hapt-99": f"hapt:{tmp_path / 'user99.npz'}"}
    kept, dropped = drop_empty_sources(sources)
    assert kept == {"proband1": text[1]}
    assert dropped == {
        "proband2": f"its data gives no labelled windows ({text[2]})",
        "proband3": f"its data gives no labelled windows ({text[3]})",
        "hapt-99": f"its data cannot be read: HAPT subject file {tmp_path / 'user99.npz'} does not exist "
        "(expected datasets/hapt/userXX.npz)",
    }
