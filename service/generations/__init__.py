"""The generation store: verified, read-only copies under ``store/<generation id>``."""
