"""The running host: its kernel's modules, sysfs, firmware, memory and taint, and its boot.

The module calls and their sandbox stand-in (:mod:`.modules`, :mod:`.recording`), sysfs
(:mod:`.sysfs`, :mod:`.pci`, :mod:`.taint`), the firmware view and memory onlining
(:mod:`.firmware`, :mod:`.memory`, :mod:`.onlining_log`), and the kernels installed and
the one the next boot runs (:mod:`.installed`, :mod:`.grub`, :mod:`.nextboot`).
"""
