"""The rocket client SDK: connect(), Admin, Producer, Consumer (pull), SimpleConsumer and PushConsumer (pop)."""

from rocket.client.admin import Admin
from rocket.client.connection import connect
from rocket.client.consumer import Consumer, open_consumer, parse_start
from rocket.client.producer import Producer, Receipt, open_producer
from rocket.client.simple import PushConsumer, SimpleConsumer

__all__ = ["Admin", "Consumer", "Producer", "PushConsumer", "Receipt", "SimpleConsumer", "connect", "open_consumer",
           "open_producer", "parse_start"]
