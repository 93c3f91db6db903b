"""Capture: from backward() to a `ca` module."""
