"""Publication: what the host tells the containers, the operator and the node's labels.

Each bundle's status file (:mod:`.bundle_status`), the operator's copies and digest files
(:mod:`.operator`), the node labels (:mod:`.labels`), the host's announcement of its
kernels (:mod:`.announce`) and what it reads for it: the drops not judged yet
(:mod:`.arrivals`) and the refused ones kept (:mod:`.quarantine`).
"""
