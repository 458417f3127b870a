"""Rebooting: asking the cluster for a reboot, and whether to ask now.

The request and its backends (:mod:`.request`, :mod:`.backends`), kured's windows
(:mod:`.window`) and the next kernel's gate (:mod:`.gate`).
"""
