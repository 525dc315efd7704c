"""rocket: a messaging and streaming system on Trio (see ../shared/DESIGN.md)."""

__version__ = "0.1.0"
