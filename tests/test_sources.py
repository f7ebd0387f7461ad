"""A client's windows are the same whether its recordings are replayed paced or fed at once."""

from pathlib import Path

import numpy as np
import pytest

from edge_client.sources import ingest_source
from edge_client.store import ClientStore
from har_models.data.subjects import load_windows, parse_source, split

ROOT = Path(__file__).resolve().parents[1]


def test_paced_replay_and_offline_give_the_same_stored_split(tmp_path):
    src = parse_source(f"hapt:{ROOT / 'datasets' / 'hapt' / 'user05.npz'}")
    paced = ClientStore(tmp_path / "paced", src.labels)
    offline = ClientStore(tmp_path / "offline", src.labels)
    assert ingest_source(paced, src, speed=4000.0) == ingest_source(offline, src) == (231, 59)
    for part in ("train", "test"):
        a, b = paced.windows(part), offline.windows(part)
        assert a.x.tobytes() == b.x.tobytes()
        np.testing.assert_array_equal(a.y, b.y)
    # ... and the coordinator's evaluation harness rebuilds exactly the client's test windows.
    _, test = split(load_windows(src), seed=1)
    assert test.x.tobytes() == offline.windows("test").x.tobytes()


def test_a_second_start_does_not_ingest_again(tmp_path):
    src = parse_source(f"hapt:{ROOT / 'datasets' / 'hapt' / 'user05.npz'}")
    store = ClientStore(tmp_path, src.labels)
    ingest_source(store, src)
    store.set_meta("marker", 1)
    assert ingest_source(store, src) == (231, 59)
    assert store.get_meta("marker") == 1


def test_source_text_errors_say_what_is_accepted(tmp_path):
    with pytest.raises(ValueError, match="use hapt:PATH"):
        parse_source("csv:foo")
    with pytest.raises(FileNotFoundError, match=r"user77\.npz does not exist"):
        parse_source(f"hapt:{tmp_path / 'user77.npz'}")
    with pytest.raises(ValueError, match="realworld:ROOT:probandN"):
        parse_source(f"realworld:{tmp_path}")
