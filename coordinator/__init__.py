"""The home-server program: the round state machine over MQTT, strategies, persistence, reports.

* :mod:`~coordinator.round`: one round as pure steps over typed values (select, configure,
  aggregate with failures, evaluate, close);
* :mod:`~coordinator.runner`: the federation runner (bootstrap or resume, one round to a
  record, FedDist growth, persistence) over the transport seam :class:`~coordinator.runner.Grid`;
* :mod:`~coordinator.mqtt_grid`: the MQTT grid (the broker session, client table, update
  intake, model publishing, delivery of ExecuTorch ``.pte`` files by :mod:`~coordinator.pte_desk`);
* :mod:`~coordinator.service`: ``fedhar-coordinator run``'s short loop over the runner and the grid;
* :mod:`~coordinator.admission`: who may take part, the one eligibility rule with a reason for
  each device left out;
* :mod:`~coordinator.cohort`: cohorts with a goal count, a minimum fraction and a deadline, and
  pace steering (when devices check in again);
* :mod:`~coordinator.strategies`: one file per strategy (its settings and state) and the
  registry, the only list of their names; over the papers' arithmetic in
  :mod:`~coordinator.aggregation`, :mod:`~coordinator.feddwa`, :mod:`~coordinator.feddist`
  and :mod:`~coordinator.server_opt`;
* :mod:`~coordinator.client_table` (each device's last status with its presence, read the same
  way by the grid, the status page's monitor and the device commands) over
  :mod:`~coordinator.presence`;
* :mod:`~coordinator.updates` (validation of uploads), :mod:`~coordinator.receipts`,
  :mod:`~coordinator.spill`;
* :mod:`~coordinator.record`: the typed record of a completed round (what the report, the
  study and the retained progress message carry);
* :mod:`~coordinator.state` (SQLite + safetensors run folder) and :mod:`~coordinator.report`;
* :mod:`~coordinator.config` and :mod:`~coordinator.cli` (``fedhar-coordinator``);
* :mod:`~coordinator.broker`: the federation's Mosquitto accounts, ACL and configuration
  (``fedhar-coordinator broker``; standard library only).
"""
