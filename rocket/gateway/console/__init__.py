"""The web console (issue 34): read-only pages on the node's HTTP/1.1 listener: the cluster, topics, consumer
groups, storage groups, messages, and charts of the last hour's rates. `server.py` reads the node's methods and keeps
the rate history (`history.py`); `pages.py` and `charts.py` render HTML and SVG from what they answered (pure)."""

from rocket.gateway.console.server import Console

__all__ = ["Console"]
