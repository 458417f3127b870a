"""modstage's host side: verification, intake, state, boot loading, the daemon and status.

Submodules import their third-party dependencies themselves; importing this
package costs nothing, which keeps the boot path lean.
"""
