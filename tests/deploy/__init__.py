"""Tests of deploy/: the driver image builder (``build-image``)."""
