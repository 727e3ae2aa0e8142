"""Experiments built from the library: ``extrapolate`` (train short, test long)."""
