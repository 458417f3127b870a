"""The module file as the kernel's loader reads it, before any rule about the target.

The ELF checks (:mod:`.elf`), the symbol table (:mod:`.symtab`), ``.modinfo`` and
``__versions`` (:mod:`.modinfo`) and parameter strings (:mod:`.params`). Nothing here
knows the target kernel: the rules that compare a module with it are
:mod:`service.verify.loadrules` and :mod:`service.verify.linking`.
"""
