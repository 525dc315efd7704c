"""MQTT: the gateway's bounds on what devices send and hold, and its defaults."""

from rocket.errors import invariant
from rocket.limits.units import MiB

mqtt_packet_bytes_max = 1 * MiB  # one MQTT packet (EMQX's default); the protocol allows 256 MiB, which no device needs
mqtt_connect_s = 10.0  # a connection's CONNECT must arrive within this (a slowloris holds a socket no longer)
mqtt_connections_max = 100_000  # open MQTT connections per broker: devices are many and mostly idle
mqtt_park_after_s = 1.0  # a woken connection's task ends once idle this long (parking.py): sooner, a wake per packet
mqtt_client_id_bytes_max = 256  # a client id; MQTT asks servers to take 23, and ids become KV keys and group names
mqtt_message_overhead_bytes = 256  # a message's bytes besides its body, as counted toward a batch (Batcher)
mqtt_publishes_waiting_max = 1000  # PUBLISHes of one connection read and not yet stored: past it, reading waits
mqtt_in_flight_max = 64  # QoS 1 and 2 deliveries unacknowledged per connection, below the client's Receive Maximum
mqtt_receive_messages_max = 32  # messages one subscription's receive asks for at once
# An idle subscription waits for its topic's watch (one per topic, gateway/reads.py Tails) to see new data, or for its
# unacknowledged messages to come back: at most this long, so that a wake missed (there should be none) costs a delay
mqtt_idle_recheck_s = 300.0
mqtt_receive_retry_s = 5.0  # a subscription's receive that failed (its storage group is down) goes again after this
mqtt_attempts_max = 16  # deliveries of a message a session left unacknowledged, before its group's dead letters
mqtt_invisible_s = 30.0  # a delivery unacknowledged this long (its broker died) goes out again
mqtt_topic_aliases_max = 64  # Topic Alias Maximum announced to MQTT 5 clients: aliases held per connection
mqtt_retained_per_subscribe_max = 1000  # retained messages sent for one SUBSCRIBE filter
mqtt_subscriptions_max = 100  # filters one session holds
mqtt_will_delay_s_max = 3600  # a will's delay is cut to this (it waits in the broker's memory)

invariant(mqtt_receive_messages_max <= mqtt_in_flight_max, "one receive's messages fit the in-flight window")
