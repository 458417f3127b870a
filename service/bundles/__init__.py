"""The bundle state machine: ``state.json``'s records, its phases and the transitions.

The records and the phase table (:mod:`.records`, :mod:`.phase`), the transitions
(:mod:`.state`), the file on disk with its lock (:mod:`.statefile`), a corrupt state rebuilt
(:mod:`.recover`), what a boot into a kernel brings up (:mod:`.cover`) and the admin's verbs
(:mod:`.verbs`).
"""
