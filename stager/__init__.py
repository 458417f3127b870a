"""modstage's container side: the manifest schema and the drop protocol.

Runs with the standard library and tomli-w alone, so a driver container image
need not carry the host service's dependencies.
"""

__version__ = "0.1.0"
