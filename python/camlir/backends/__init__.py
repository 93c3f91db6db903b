"""Backends that run a captured `ca` module."""
