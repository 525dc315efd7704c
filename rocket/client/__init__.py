"""The rocket client SDK: connect(), Admin, Producer and Consumer."""

from rocket.client.admin import Admin
from rocket.client.connection import connect
from rocket.client.consumer import Consumer, open_consumer, parse_start
from rocket.client.producer import Producer, Receipt, open_producer

__all__ = ["Admin", "Consumer", "Producer", "Receipt", "connect", "open_consumer", "open_producer", "parse_start"]
