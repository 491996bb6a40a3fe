"""The shell sandbox's seccomp filter: no setuid or setgid file comes out of it.

A command in the sandbox writes the workspace as the sandbox's host uid, so a file it
marks setuid would run as that uid for whoever starts it on the host (a setuid-root file
when brokerd ran the sandbox as root). Like Flatpak's filter, this one makes every call
that sets a file's mode fail with EPERM when the mode has S_ISUID or S_ISGID: chmod,
fchmod, fchmodat, fchmodat2, mknod, mknodat, and open, openat and creat (a file created
with such a mode keeps it). openat2 (its mode is in a struct the filter cannot read) and
io_uring_setup (its operations never pass the filter) fail with ENOSYS, which callers
take for "not supported here" and fall back from. Everything else is allowed.

The program is classic BPF, handed to bwrap's ``--seccomp FD``. It knows the syscall
numbers of x86_64 and aarch64 only: :func:`filter_program` returns None elsewhere, and
the shell tool then refuses to run (sandbox_unavailable) rather than run unfiltered.
A call of another ABI on the same machine (i386's int 0x80, x32 on x86_64) fails with
EPERM as a whole: the filter would not know its numbers.

Pure: it builds bytes and touches nothing.
"""

from __future__ import annotations

import errno
import functools
import platform
import struct
from typing import Final

SETID_BITS: Final = 0o6000
"""S_ISUID | S_ISGID."""

# <linux/filter.h>, <linux/seccomp.h>, <linux/audit.h>
_LD_W_ABS: Final = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K: Final = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K: Final = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JSET_K: Final = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET_K: Final = 0x06  # BPF_RET | BPF_K
_RET_ALLOW: Final = 0x7FFF0000
_RET_ERRNO: Final = 0x00050000
_NR: Final = 0  # offsetof(struct seccomp_data, nr)
_ARCH: Final = 4  # offsetof(struct seccomp_data, arch)


def _arg(index: int) -> int:
    # The low 32 bits of args[index]: both architectures are little-endian, and a
    # mode is a 16-bit value.
    return 16 + 8 * index


X32_BIT: Final = 0x40000000


# Per architecture: its AUDIT_ARCH value, the syscalls whose mode argument is checked
# (number, index of the mode argument) and those refused outright.
_ARCHES: Final[dict[str, tuple[int, tuple[tuple[int, int], ...], tuple[int, ...]]]] = {
    "x86_64": (
        0xC000003E,
        (
            (2, 2),  # open(path, flags, mode)
            (85, 1),  # creat(path, mode)
            (257, 3),  # openat(dirfd, path, flags, mode)
            (90, 1),  # chmod(path, mode)
            (91, 1),  # fchmod(fd, mode)
            (268, 2),  # fchmodat(dirfd, path, mode)
            (452, 2),  # fchmodat2(dirfd, path, mode, flags)
            (133, 1),  # mknod(path, mode, dev)
            (259, 2),  # mknodat(dirfd, path, mode, dev)
        ),
        (437, 425),  # openat2, io_uring_setup
    ),
    "aarch64": (
        0xC00000B7,
        (
            (56, 3),  # openat(dirfd, path, flags, mode)
            (52, 1),  # fchmod(fd, mode)
            (53, 2),  # fchmodat(dirfd, path, mode)
            (452, 2),  # fchmodat2(dirfd, path, mode, flags)
            (33, 2),  # mknodat(dirfd, path, mode, dev)
        ),
        (437, 425),  # openat2, io_uring_setup
    ),
}


def _instruction(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


@functools.cache
def filter_program(machine: str | None = None) -> bytes | None:
    """The filter for ``machine`` (default: this one, as ``platform.machine()`` says),
    as bwrap's ``--seccomp`` reads it: ``struct sock_filter`` entries, native order.
    None for an architecture whose syscall numbers it does not know."""
    machine_name = machine or platform.machine()
    known = _ARCHES.get(machine_name)
    if known is None:
        return None
    arch, checked, refused = known
    # Built as (code, k, jump-true label, jump-false label); labels resolve to forward
    # offsets once the program's length is known. None: the next instruction.
    body: list[tuple[int, int, str | None, str | None]] = [
        (_LD_W_ABS, _ARCH, None, None),
        (_JEQ_K, arch, None, "foreign"),
        (_LD_W_ABS, _NR, None, None),
    ]
    if machine_name == "x86_64":
        body.append((_JGE_K, X32_BIT, "foreign", None))
    body += [(_JEQ_K, number, "nosys", None) for number in refused]
    labels: dict[str, int] = {}
    for index, (number, mode_arg) in enumerate(checked):
        labels[f"check{index}"] = len(body)
        more = f"check{index + 1}" if index + 1 < len(checked) else "allow"
        body += [
            (_JEQ_K, number, None, more),
            (_LD_W_ABS, _arg(mode_arg), None, None),
            (_JSET_K, SETID_BITS, "eperm", "allow"),
        ]
    end = len(body)
    returns = {
        "allow": _RET_ALLOW,
        "eperm": _RET_ERRNO | errno.EPERM,
        "foreign": _RET_ERRNO | errno.EPERM,
        "nosys": _RET_ERRNO | errno.ENOSYS,
    }
    for offset, name in enumerate(returns):
        labels[name] = end + offset

    def jump(at: int, label: str | None) -> int:
        if label is None:
            return 0
        distance = labels[label] - at - 1
        assert 0 <= distance <= 255, (label, distance)
        return distance

    program = b"".join(
        _instruction(code, k, jump(at, true), jump(at, false))
        for at, (code, k, true, false) in enumerate(body)
    )
    return program + b"".join(_instruction(_RET_K, value) for value in returns.values())
