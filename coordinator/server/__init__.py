"""The home server: a federation that runs for months on a small machine at home.

``fedhar-coordinator serve`` keeps one data folder (default ``~/.local/share/fedhar-server``,
``$STATE_DIRECTORY`` under systemd) holding the server database (``server.sqlite``: enrolled and
revoked devices, coordinator epochs, numbered model versions, per-device participation), the run's
state (``run/``), the kept model versions (``versions/``) and the enrolment bundles
(``enrolment/``). The rounds themselves are :class:`coordinator.runner.FederationRunner`'s over a
:class:`coordinator.grid.Grid` (docs/coordinator.md); the modules here are the server around them:

* serving: ``serve`` (the loop and its parts), ``serve_setup`` (settings at start), ``serve_reload``
  (SIGHUP), ``serve_versions`` (numbered versions, pin and rollback), ``serve_devices`` (upkeep between
  rounds), ``serve_page`` (the status page's wiring), ``schedule`` and ``settings``;
* the operator: ``devices_cli`` (the commands), ``operator_commands`` (where each is done),
  ``operator_channel`` and ``operator_desk`` (inside a running server), ``folder_side`` and ``data_lock``
  (when none runs), ``device_commands``, ``device_tables``, ``lifecycle``, ``model_request``, ``audit``;
* enrolment and the broker: ``enrol_desk`` (by certificate), ``qr``, ``broker_admin``, ``broker_reload``,
  ``broker_session``, ``broker_view``;
* the server's own storage: ``registry`` (with ``registry_rows``), ``sqlite_faults``, ``ownership``,
  ``backup``, ``backup_cli``, ``restore``;
* what people read: the status page (``web``, ``charts``, ``metrics``, ``monitor``, ``figures``).
"""
