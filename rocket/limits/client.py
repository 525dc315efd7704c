"""Client defaults (producers, consumers, simple consumers), the command line's, and shutdown."""

from rocket.errors import invariant
from rocket.limits.units import GiB, KiB, MiB

producer_linger_ms_default = 5  # how long a producer waits to fill a batch
producer_batch_bytes_default = 1 * MiB  # bytes after which a producer sends a batch at once
producer_in_flight_batches_max = 64  # batches sent and not yet acknowledged, per producer
# Idempotent produce (store/producers.py): what a storage group remembers of each producer, per queue.
producer_sequences_kept_max = producer_in_flight_batches_max  # the last batches' answers: a retry of any batch in flight
# finds its own; one older than these gets UNKNOWN_SEQUENCE
producer_states_per_group_max = 10_000  # (producer, queue) pairs a storage group remembers; past it the least recently
# used is forgotten (its retries would be stored again), so state is bounded however many producers come and go
producer_state_idle_s_max = 86_400  # a producer silent this long on a queue is forgotten (Kafka's producer.id.expiration)
consumer_pull_bytes_default = 4 * MiB  # bytes a consumer asks for per pull: many batches per round trip
consumer_wait_ms_default = 1000  # how long a consumer's pull waits on empty queues before it polls again
simple_invisible_s_default = 30.0  # RocketMQ's default invisible duration for a received message
simple_receive_messages_default = 32  # messages one SimpleConsumer.receive asks for (RocketMQ's receive batch)
simple_receive_wait_s_default = 5.0  # how long one receive waits for messages to arrive
simple_listener_tasks_default = 16  # messages a push-style listener handles at once
connect_timeout_s = 5.0  # a peer that does not accept a connection by then counts as down
request_timeout_s_default = 30.0  # an RPC without an answer by then fails with TIMEOUT
send_first_batch_bytes = 64 * KiB  # rocket send's first batch for each queue: a short file still reaches every queue
bench_topic_retention_s = 60.0  # what a bench topic made up for one run keeps, once the run is over
bench_probe_bytes_min = 256 * MiB  # the disk probe beside a bench writes at least this much, for a steady figure ...
bench_probe_bytes_max = 4 * GiB  # ... and at most this much (or what the bench sends, between the two)
shutdown_grace_s = 10.0  # SIGTERM drains for at most this long before cancelling

invariant(producer_sequences_kept_max >= producer_in_flight_batches_max,
          "a storage group remembers the answer of every batch a producer may have in flight")
invariant(send_first_batch_bytes <= producer_batch_bytes_default, "rocket send's first batches are smaller ones")
invariant(bench_probe_bytes_min <= bench_probe_bytes_max, "the bench's disk probe bounds are ordered")
