"""The home server: a federation that runs for months on a small machine at home.

``fedhar-coordinator serve`` keeps one data folder (default ``~/.local/share/fedhar-server``,
``$STATE_DIRECTORY`` under systemd) holding the server database (``server.sqlite``: enrolled and
revoked devices, coordinator epochs, numbered model versions, per-device participation), the run's
state (``run/``), the kept model versions (``versions/``) and the enrolment bundles
(``enrolment/``). The modules here add the schedule that decides when a round may start, device
enrolment and revocation against the broker (enrolment by certificate in
:mod:`~coordinator.server.enrol_desk`), and the read-only status page and metrics; the rounds
themselves are the runner's (:class:`coordinator.runner.FederationRunner`) over the MQTT grid, as in
``fedhar-coordinator run`` (docs/coordinator.md).
"""
