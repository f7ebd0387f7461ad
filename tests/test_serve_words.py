"""The words serve shows name its settings as server.toml holds them, not the options of ``fedhar-coordinator run``."""

from __future__ import annotations

from coordinator.server.serve_setup import setting_words


def test_flags_of_federation_settings_read_as_keys_of_server_toml() -> None:
    text = "1 update(s) with training windows, below the quorum of 2 (--min-clients); raise --round-timeout or --prox-mu"
    assert setting_words(text) == ("1 update(s) with training windows, below the quorum of 2 (min_clients in server.toml); "
                                   "raise [timing] round_timeout_s in server.toml or [strategies.fedprox] mu in server.toml")  # fmt: skip
    assert setting_words("fedhar-client --client-id x") == "fedhar-client --client-id x"  # not a federation setting: kept
