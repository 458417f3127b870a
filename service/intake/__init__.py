"""Drop intake: a complete drop judged, copied into the store and made a pending generation.

What a drop must satisfy first (:mod:`.admit`, :mod:`.bundlerules`, :mod:`.firmware_names`,
:mod:`.owners`, :mod:`.memory_owner`), the scan over the incoming directories
(:mod:`.scan`, :mod:`.drops`), what became of one drop (:mod:`.outcome`) and a refused
drop's reasons (:mod:`.rejection`).
"""
