"""The kernel's BER decoder (lib/asn1_decoder.c, Linux 6.1), run on its own compiled grammars.

modstage does not guess what the kernel's PKCS#7 and X.509 parsers accept: it runs the
same bytecode (:mod:`service.verify.signature.asn1_machines`) through a line-by-line port of
``asn1_ber_decoder``, with the same limits: a blob over 65,535 bytes is ``EMSGSIZE``,
long-form tags, length fields of more than 2 octets, a constructed nesting deeper than
10, an overrun or a missing end-of-contents are ``EBADMSG``. Bytes after the top-level
element are ignored, as the kernel ignores them. Actions receive the same
``(hdrlen, tag, offset, length)`` the C actions receive and raise :class:`Asn1Error`
to stop, with the errno the C action would have returned.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Sequence

MAX_BLOB = 65535
_STACK = 10
_CONS = 0x20
_INDEFINITE, _MATCHED, _LAST_MATCHED = 0x01, 0x02, 0x04
_OP_SKIP, _OP_ACT, _OP_JUMP, _OP_ANY, _OP_COND = 0x01, 0x02, 0x04, 0x08, 0x10
_OP_MATCHES_TAG = 0x1B
_OP_COND_FAIL, _OP_COMPLETE, _OP_ACT_ONLY, _OP_MAYBE_ACT, _OP_RETURN = 0x1C, 0x1D, 0x1E, 0x1F, 0x28
_END_SET, _END_OF, _END_ACT = 0x01, 0x02, 0x04
_LENGTHS = {
    **dict.fromkeys((0x00, 0x01, 0x11), 2),
    **dict.fromkeys((0x02, 0x03, 0x04, 0x05, 0x13, 0x15), 3),
    **dict.fromkeys((0x08, 0x09, 0x18, 0x19, 0x1C, 0x1D, 0x20, 0x21, 0x28), 1),
    **dict.fromkeys((0x0A, 0x0B, 0x1A, 0x1B, 0x1E, 0x1F, 0x22, 0x23, 0x24, 0x25), 2),
    **dict.fromkeys((0x26, 0x27), 3),
}
_JUMPS = (0x04, 0x05, 0x15)


class Asn1Error(Exception):
    """The decoder or an action stopped with ``code`` (an errno) for ``why``."""

    def __init__(self, code: int, why: str) -> None:
        self.code = code
        self.why = why
        super().__init__(f"{errno.errorcode.get(code, code)}: {why}")


Action = Callable[[int, int, int, int], None]  # (hdrlen, tag, value offset, value length)


def bad(why: str) -> Asn1Error:
    """The decoder's own failures are all ``EBADMSG``."""
    return Asn1Error(errno.EBADMSG, why)


def _indefinite_length(data: bytes, datalen: int, dp: int) -> int:
    """``asn1_find_indefinite_length``: bytes from ``dp`` to just after the matching EOC."""
    start, level = dp, 1
    while True:
        if datalen - dp < 2:
            raise bad("missing EOC in indefinite length" if datalen == dp else "data overrun")
        tag = data[dp]
        dp += 1
        if tag == 0:
            if data[dp] != 0:
                raise bad("invalid length EOC")
            dp += 1
            level -= 1
            if level <= 0:
                return dp - start
            continue
        if tag & 0x1F == 0x1F:
            while True:
                if datalen - dp < 2:
                    raise bad("data overrun")
                more = data[dp] & 0x80
                dp += 1
                if not more:
                    break
        length = data[dp]
        dp += 1
        if length == 0x80:
            if not tag & _CONS:
                raise bad("indefinite length primitive")
            level += 1
            continue
        if length > 0x7F:
            n = length - 0x80
            if n > 7:
                raise bad("unsupported length")
            if n > datalen - dp:
                raise bad("data overrun")
            length = int.from_bytes(data[dp : dp + n], "big")
            dp += n
        if length > datalen - dp:
            raise bad("data overrun")
        dp += length


class _Decoder:
    """One run of the bytecode over ``data``; the C function's locals as attributes."""

    def __init__(self, machine: bytes, actions: Sequence[Action], data: bytes) -> None:
        self.machine, self.actions, self.data = machine, actions, data
        self.datalen = len(data)
        self.pc = self.dp = self.tdp = self.length = 0
        self.tag = self.hdr = self.flags = 0
        self.cons: list[tuple[int, int, int]] = []  # (dp, datalen, hdrlen)
        self.jumps: list[int] = []

    def _op_length(self, op: int) -> int:
        size = _LENGTHS.get(op)
        if size is None:
            raise bad(f"reserved opcode {op}")
        if self.pc + size > len(self.machine):
            raise bad("machine overrun")
        return size

    def _match(self, op: int) -> bool:
        """Read a tag and length; False when an optional element was skipped."""
        data, machine = self.data, self.machine
        self.flags, self.hdr = 0, 2
        if self.datalen - self.dp < 2:
            raise bad("data overrun")
        tag = data[self.dp]
        self.dp += 1
        if tag & 0x1F == 0x1F:
            raise bad("long tag not supported")
        self.tag = tag
        if not op & _OP_ANY:
            optag = machine[self.pc + 1]
            self.flags |= optag & _CONS
            if (optag ^ tag) & ~(optag & _CONS) & 0xFF:
                if op & _OP_SKIP:
                    self.pc += _LENGTHS[op]
                    self.dp -= 1
                    return False
                raise bad("unexpected tag")
        self.flags |= _MATCHED
        self.length = self._read_length(tag)
        if self.flags & _CONS:
            self._push_cons()
        self.tdp = self.dp
        return True

    def _read_length(self, tag: int) -> int:
        """The element's length octets (definite, short or long form, or indefinite)."""
        data = self.data
        length = data[self.dp]
        self.dp += 1
        if length > 0x7F:
            if length == 0x80:
                if not tag & _CONS:
                    raise bad("indefinite length primitive")
                self.flags |= _INDEFINITE
                if self.datalen - self.dp < 2:
                    raise bad("data overrun")
            else:
                n = length - 0x80
                if n > 2:
                    raise bad(f"unsupported length ({n} length octets)")
                if n > self.datalen - self.dp:
                    raise bad("data overrun")
                self.hdr += n
                length = int.from_bytes(data[self.dp : self.dp + n], "big")
                self.dp += n
                if length > self.datalen - self.dp:
                    raise bad("data overrun")
        elif length > self.datalen - self.dp:
            raise bad("data overrun")
        return length

    def _push_cons(self) -> None:
        """Enter a constructed element: bound the data to it (definite length)."""
        if len(self.cons) >= _STACK:
            raise bad("cons stack overflow")
        if not self.flags & _INDEFINITE:
            self.cons.append((self.dp, self.datalen, self.hdr))
            self.datalen = self.dp + self.length
        else:
            self.cons.append((self.dp, 0, self.hdr))

    def _matched(self, op: int) -> None:
        if not self.flags & _CONS and self.flags & _INDEFINITE:
            self.length = _indefinite_length(self.data, self.datalen, self.dp)
        if op & _OP_ACT:
            act = self.machine[self.pc + (1 if op & _OP_ANY else 2)]
            self.actions[act](self.hdr, self.tag, self.dp, self.length)
        if not self.flags & _CONS:
            self.dp += self.length
        self.pc += _LENGTHS[op]

    def _end(self, op: int) -> None:
        data = self.data
        if op & _END_SET and not op & _END_OF and not self.flags & _MATCHED:
            raise bad("unexpected tag")
        if not self.cons:
            raise bad("cons stack underflow")
        tdp, datalen, self.hdr = self.cons.pop()
        self.tdp = tdp
        length = self.length = self.datalen  # C's ``len`` outlives the op: ACT reads it
        if datalen == 0:
            self.datalen = length
            if self.datalen - self.dp < 2:
                raise bad("data overrun")
            if data[self.dp] != 0:
                if op & _END_OF:
                    self.cons.append((tdp, 0, self.hdr))
                    self.pc = self.machine[self.pc + 1]
                    return
                raise bad("missing EOC in indefinite length constructed")
            if data[self.dp + 1] != 0:
                raise bad("invalid length EOC")
            self.dp += 2
            length = self.length = self.dp - tdp - 2
        else:
            if self.dp < length and op & _END_OF:
                self.cons.append((tdp, datalen, self.hdr))
                self.pc = self.machine[self.pc + 1]
                return
            self.datalen = datalen
            if self.dp != length:
                raise bad("cons length error")
            length = self.length = length - tdp
        if op & _END_ACT:
            act = self.machine[self.pc + (2 if op & _END_OF else 1)]
            self.actions[act](self.hdr, 0, tdp, length)
        self.pc += _LENGTHS[op]

    def run(self) -> None:
        while True:
            if self.pc >= len(self.machine):
                raise bad("machine overrun")
            op = self.machine[self.pc]
            self._op_length(op)
            if op <= _OP_MATCHES_TAG:
                if (op & _OP_COND and self.flags & _MATCHED) or (
                    op & _OP_SKIP and self.dp == self.datalen
                ):
                    self.flags &= ~_LAST_MATCHED
                    self.pc += _LENGTHS[op]
                    continue
                if not self._match(op):
                    continue
                if op in _JUMPS:
                    if len(self.jumps) >= _STACK:
                        raise bad("jump stack overflow")
                    self.jumps.append(self.pc + _LENGTHS[op])
                    self.pc = self.machine[self.pc + 2]
                else:
                    self._matched(op)
            elif op == _OP_COND_FAIL:
                if not self.flags & _MATCHED:
                    raise bad("unexpected tag")
                self.pc += 1
            elif op == _OP_COMPLETE:
                if self.jumps or self.cons:
                    raise bad("stacks not empty at completion")
                return
            elif op in (_OP_ACT_ONLY, _OP_MAYBE_ACT):
                if op == _OP_ACT_ONLY or self.flags & _LAST_MATCHED:
                    act = self.machine[self.pc + 1]
                    self.actions[act](self.hdr, self.tag, self.tdp, self.length)
                self.pc += 2
            elif op == _OP_RETURN:
                if not self.jumps:
                    raise bad("jump stack underflow")
                self.pc = self.jumps.pop()
                self.flags |= _MATCHED | _LAST_MATCHED
            else:
                self._end(op)


def ber_decode(machine: bytes, actions: Sequence[Action], data: bytes) -> None:
    """Run ``machine`` over ``data`` calling ``actions``; raises :class:`Asn1Error`."""
    if len(data) > MAX_BLOB:
        raise Asn1Error(errno.EMSGSIZE, f"{len(data)} bytes is over the decoder's {MAX_BLOB}")
    _Decoder(machine, actions, data).run()
