"""The kernel a module is judged for, read from its own files.

Its release, vermagic and build configuration (:mod:`.kernel`, :mod:`.kconfig`), and
every symbol it exports (:mod:`.exports`, read from its image by :mod:`.kimage` and from
its in-tree modules, cached per release by :mod:`.exports_cache`).
"""
