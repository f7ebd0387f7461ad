"""fedhar's I/O adapters, shared by the edge client and the coordinator.

The pure core (:mod:`har_models`) holds math and formats; what touches the network, the
command line, credentials or the operating system's memory lives here:
:mod:`har_io.mqtt_link` (the MQTT link), :mod:`har_io.broker_config` (where the broker is and how to
log in: address, credentials, TLS), :mod:`har_io.link_status` (the link's connection state and why
an attempt failed, in words), :mod:`har_io.enrolment` (a device's enrolment bundle: everything it
needs to join, checked), :mod:`har_io.cert_enrolment` and :mod:`har_io.device_key` (enrolment by
certificate: the invitation, request and reply; the device's own key, request and enrolment code, with
openssl), :mod:`har_io.cli` (options generated from the
typed settings, TOML files, logging) and :mod:`har_io.memory` (returning freed heap to
the OS). Files are written through :mod:`har_models.files`, the one crash-safe writer,
which the core's own caches (datasets, ExecuTorch programs) use too.
"""
