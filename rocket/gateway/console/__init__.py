"""The web console (issue 34): read-only pages on the node's HTTP/1.1 listener. `server.py` reads the node's methods
and keeps the rate history (`history.py`); `pages.py` and `charts.py` render HTML and SVG from what they answered
(pure); `static/console.css` is the stylesheet.
"""

from rocket.gateway.console.server import Console

__all__ = ["Console"]
