"""Reflect's stream processors: pure planning functions and the thin Faust agents around them."""
