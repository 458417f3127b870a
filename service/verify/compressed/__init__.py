"""Compressed modules (``.ko.xz``, ``.ko.zst``, ``.ko.gz``): sizes, decompression, memory.

What a compressed file states about itself before it is decompressed (:mod:`.stated`),
decompression under a cap (:mod:`.decompress`), and how much memory one intake may hold
and how far one drop may expand (:mod:`.budget`).
"""
