"""The home-server program: rounds over a transport seam, strategies, persistence, reports (docs/coordinator.md).

* :mod:`~coordinator.grid`: the seam, :class:`~coordinator.grid.Grid`, and the errors that end a federation;
* :mod:`~coordinator.runner`: the federation runner (bootstrap or resume, one round to a record, FedDist
  growth, persistence) over a grid, with the parts :func:`coordinator.rounds.compose` puts together;
* :mod:`~coordinator.round` (pure round steps: plan, quorum, evaluation, the round's line) and
  :mod:`~coordinator.exchange` (one exchange being collected, and the steering it closes by);
* :mod:`~coordinator.rounds`: round policies (synchronous, cohort, buffered) and the quality guard
  as a strategy wrapper, each with its settings table;
* :mod:`~coordinator.mqtt_grid`: the MQTT grid (the broker session, client table, dispatch,
  announcements), holding one carrier and one update intake of :mod:`~coordinator.transport`;
* :mod:`~coordinator.service`: ``fedhar-coordinator run``'s short loop; :mod:`~coordinator.server`:
  ``serve``, the home server's loop, registry, page and operator commands;
* :mod:`~coordinator.strategies`: one file per strategy and the registry, over the papers' arithmetic in
  :mod:`~coordinator.aggregation`, :mod:`~coordinator.feddwa`, :mod:`~coordinator.feddist`
  and :mod:`~coordinator.server_opt`;
* :mod:`~coordinator.admission` (who may take part), :mod:`~coordinator.client_table` over
  :mod:`~coordinator.presence`, :mod:`~coordinator.updates` (validation of uploads),
  :mod:`~coordinator.receipts`, :mod:`~coordinator.spill`, :mod:`~coordinator.pte_desk` (programs);
* :mod:`~coordinator.record`, :mod:`~coordinator.state` (SQLite + safetensors run folder),
  :mod:`~coordinator.report`, :mod:`~coordinator.guard` (the guard's rules);
* :mod:`~coordinator.config` (the settings, tables declared by their owners) and :mod:`~coordinator.cli`;
* :mod:`~coordinator.broker`: the federation's Mosquitto accounts, ACL and configuration
  (``fedhar-coordinator broker``; standard library only).
"""
