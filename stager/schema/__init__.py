"""What the container and the host share: the drop's and the status file's formats.

The manifest and the names in a drop (:mod:`.manifest`, :mod:`.paths`, :mod:`.params`,
:mod:`.modfile`, :mod:`.validate`), the typed records both sides read and write
(:mod:`.record`, :mod:`.statusfile`), the one crash-safe write (:mod:`.atomic`), bounded
texts (:mod:`.shown`) and the errors both raise (:mod:`.failures`). It never imports the
container's tool (the rest of :mod:`stager`).
"""
