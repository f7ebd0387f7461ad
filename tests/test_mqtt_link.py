"""The MQTT adapter's network thread: a publish from the program's thread is written at once.

The link runs paho's network loop in paho's own thread (``loop_start``), which also creates
the socket pair through which another thread's publish wakes the loop's select(). Here the
loop's select() timeout is raised from paho's 1 s to an hour: with the pair, a publish and its
acknowledgement go through at once; without it nothing wakes the loop and the publish is never
sent (a bounded wait then fails), whatever the machine's speed.
"""

from __future__ import annotations

import pytest

from har_io import mqtt_link
from har_io.broker_config import BrokerConfig
from har_io.mqtt_link import MqttLink
from har_models.wire.chunking import Reassembler

WAIT_S = 20.0


@pytest.fixture
def slow_select(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the link's network loop wait up to an hour in select() when nothing wakes it."""
    monkeypatch.setattr(mqtt_link._Client, "loop_timeout_s", 3600.0)


def test_publishes_from_the_program_thread_wake_the_network_loop(mosquitto: int, slow_select: None) -> None:
    cfg = BrokerConfig(host="127.0.0.1", port=mosquitto, mqtt_version="3.1.1", max_message_bytes=64 * 1024)
    topic = "fedhar/v1/test/wake"
    receiver = MqttLink(cfg, "wake-receiver", subscriptions=[(f"{topic}/+", 1)])
    sender = MqttLink(cfg, "wake-sender")
    try:
        assert receiver.start(wait_s=WAIT_S) and sender.start(wait_s=WAIT_S)
        # One lone QoS 1 message: nothing else is in flight that could wake the loop instead.
        sender.publish(f"{topic}/lone", b"hello", timeout=WAIT_S)
        # A chunked payload, each chunk acknowledged before the window moves on, arrives whole.
        payload = bytes(range(256)) * 1024  # 256 KiB -> 5 chunks of 64 KiB
        n = sender.publish_chunks(lambda i: f"{topic}/{i}", payload, timeout=WAIT_S)
        assert n == 5
        got = receiver.inbox.get(timeout=WAIT_S)
        assert got[0] == f"{topic}/lone" and got[1] == b"hello"
        reasm = Reassembler()
        done = None
        for _ in range(n):
            done = reasm.add("test", receiver.inbox.get(timeout=WAIT_S)[1])
        assert done is not None and done[1] == payload
    finally:
        sender.stop()
        receiver.stop()


def test_the_network_loop_resumes_after_a_race_in_paho_s_queue_and_reports_one_that_keeps_coming(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """paho's loop raising "OrderedDict mutated during iteration" is resumed; the sixth time in a minute ends it, reported."""
    import paho.mqtt.client as mqtt

    script: list[BaseException | None] = []

    def paho_loop(self: mqtt.Client, timeout: float = 1.0, retry_first_connection: bool = False) -> mqtt.MQTTErrorCode:
        step = script.pop(0)
        if step is not None:
            raise step
        return mqtt.MQTTErrorCode.MQTT_ERR_SUCCESS

    monkeypatch.setattr(mqtt.Client, "loop_forever", paho_loop)
    client = mqtt_link._Client(mqtt.CallbackAPIVersion.VERSION2, client_id="t-loop")
    resumed: list[Exception] = []
    errors: list[Exception] = []
    client.on_loop_resumed, client.on_loop_error = resumed.append, errors.append
    race = RuntimeError("OrderedDict mutated during iteration")
    script[:] = [race, race, None]
    assert client.loop_forever() == mqtt.MQTTErrorCode.MQTT_ERR_SUCCESS
    assert (len(resumed), errors) == (2, [])
    resumed.clear()
    script[:] = [race] * (mqtt_link.MAX_LOOP_RESUMES + 1)
    assert client.loop_forever() == mqtt.MQTTErrorCode.MQTT_ERR_UNKNOWN
    assert len(resumed) == mqtt_link.MAX_LOOP_RESUMES and errors == [race] and script == []
    other = RuntimeError("some other fault")  # not the race: reported at once, never resumed
    resumed.clear()
    errors.clear()
    script[:] = [other]
    assert client.loop_forever() == mqtt.MQTTErrorCode.MQTT_ERR_UNKNOWN
    assert resumed == [] and errors == [other]
