"""The web console (issue 34): read-only pages on the node's HTTP/1.1 listener: the cluster, topics, consumer
groups, storage groups, messages, and charts of the last hour's rates. `server.py` reads the node's methods and keeps
the rate history (`history.py`); `pages.py` and `charts.py` render HTML and SVG from what they answered (pure).
Messages are looked up by id, by key and by time. With auth on, a failed sign-in goes through `Access.failed`, as
any other. `static/console.css` is the stylesheet.
"""

from rocket.gateway.console.server import Console

__all__ = ["Console"]
