"""Placement and health scoring: pure cores that take loads and return decisions."""
