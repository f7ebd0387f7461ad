"""The device program: sensors to labelled windows, local training, the MQTT agent, the app.

* :mod:`edge_client.sensors`: Android, MPU-6050 and replayed sensors behind one interface,
  and :mod:`edge_client.sensors.factory` that names them;
* :mod:`~edge_client.recorder`, :mod:`~edge_client.window_log`, :mod:`~edge_client.store`:
  labelled windows and the client's state folder;
* :mod:`~edge_client.sources`: where a client's training windows come from;
* the client round: :mod:`~edge_client.trainer` over :mod:`edge_client.backends`
  (PyTorch, numpy reference, ExecuTorch), with FedALA in :mod:`~edge_client.ala`, and
  :mod:`~edge_client.pte_fetch` (the ExecuTorch ``.pte`` files asked of the coordinator);
* :mod:`~edge_client.agent` (follows the federation over MQTT; settings in
  :mod:`~edge_client.client_config`), assembled from :mod:`~edge_client.model_intake` (models
  received, checked by hash, refused ones in :mod:`~edge_client.bad_objects`),
  :mod:`~edge_client.coordinator_watch` (the coordinator's presence), :mod:`~edge_client.rounds` and
  :mod:`~edge_client.answers` (train a round, answer each attempt once), :mod:`~edge_client.delivery`
  and :mod:`~edge_client.blob_upload` (the update until its receipt, in the round's transport) and
  :mod:`~edge_client.identity` (other users of the client id); and :mod:`~edge_client.cli`
  (``fedhar-client``, ``fedhar-record`` in :mod:`~edge_client.record_cli`);
* :mod:`~edge_client.cert_enrol`: the device's side of enrolment by certificate
  (``fedhar-client request-certificate``);
* :mod:`edge_client.app`: the Kivy app.
"""
