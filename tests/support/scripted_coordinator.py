"""A scripted coordinator for the app's tests: only its retained status, refreshed, with a last will; no rounds.

Usage: python tests/support/scripted_coordinator.py PORT TOPIC

Publishes :class:`~har_models.wire.messages.CoordinatorStatus` "online" on TOPIC (retained,
``refresh_s`` 0.5) every 0.25 s, saying one device takes part, three are needed, the next round
is an hour away and the shared model is version 7; its will is "offline". A line "pause" on
stdin stops the refreshes (the status goes stale while the connection stays), "resume" starts
them again; each status sent prints "sent <sent_unix>". Killing the process lets the broker
deliver the will.
"""

from __future__ import annotations

import sys
import threading
import time

import paho.mqtt.client as mqtt

from har_models.wire.messages import CoordinatorStatus, RoundOutlook


def main() -> None:
    port, topic = int(sys.argv[1]), sys.argv[2]
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="scripted-coordinator", protocol=mqtt.MQTTv311)
    c.will_set(topic, CoordinatorStatus("offline", "run-s", "a1").to_bytes(), qos=1, retain=True)
    c.connect("127.0.0.1", port, keepalive=60)
    c.loop_start()
    paused = threading.Event()

    def commands() -> None:
        for line in sys.stdin:
            (paused.set if line.strip() == "pause" else paused.clear)()

    threading.Thread(target=commands, daemon=True).start()
    while True:
        if not paused.is_set():
            now = time.time()
            st = CoordinatorStatus("online", "run-s", "a1", sent_unix=now, refresh_s=0.5)
            outlook = RoundOutlook("run-s", now, devices_taking_part=1, devices_needed=3, next_round_unix=now + 3600, model_version=7)
            c.publish(topic.replace("/status", "/outlook"), outlook.to_bytes(), qos=1, retain=True).wait_for_publish(5)
            c.publish(topic, st.to_bytes(), qos=1, retain=True).wait_for_publish(5)
            print("sent", now, flush=True)
        time.sleep(0.25)


if __name__ == "__main__":
    main()
