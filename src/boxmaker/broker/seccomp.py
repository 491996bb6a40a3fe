"""The shell sandbox's seccomp filter: no setuid or setgid file comes out of it, and the
command cannot reach the kernel's namespace, mount, keyring and tracing interfaces.

A command in the sandbox writes the workspace as the sandbox's host uid, so a file it
marks setuid would run as that uid for whoever starts it on the host (a setuid-root file
when brokerd ran the sandbox as root). Like Flatpak's filter, this one makes every call
that sets a file's mode fail with EPERM when the mode has S_ISUID or S_ISGID: chmod,
fchmod, fchmodat, fchmodat2, mknod, mknodat, and open, openat and creat (a file created
with such a mode keeps it).

A user namespace of its own would give the command every capability over a network
namespace and mounts of its own: the way in to most recent local privilege escalations
(nf_tables, fs_context). bwrap's ``--disable-userns`` stops that (sandbox_plan.py); this filter
is the second wall, with Flatpak's list (``setup_seccomp`` in flatpak-run.c): unshare,
setns, mount, umount2, pivot_root, chroot and a clone whose flags have CLONE_NEWUSER fail
with EPERM; so do the keyring (add_key, keyctl, request_key), bpf, perf_event_open and
userfaultfd (docs/decisions.md, "Setuid files"), and the ioctls TIOCSTI and TIOCLINUX,
which type into a terminal (compared on the request's low 32 bits, all the kernel reads:
Flatpak's CVE-2019-10063). Calls whose arguments a filter cannot read fail with ENOSYS,
which callers take for "not supported here" and fall back from: clone3 (libc then uses
clone), the new mount API (open_tree, move_mount, fsopen, fsconfig, fsmount, fspick,
mount_setattr), openat2 (its mode is in a struct) and io_uring_setup (its operations
never pass the filter). Everything else is allowed.

The program is classic BPF, handed to bwrap's ``--seccomp FD``, built from a table of
syscall numbers per architecture (from the kernel's tables: arch/x86/entry/syscalls/
syscall_64.tbl, include/uapi/asm-generic/unistd.h). It knows x86_64 and aarch64 only:
:func:`filter_program` returns None elsewhere, and the shell tool then refuses to run
(sandbox_unavailable) rather than run unfiltered. A call of another ABI on the same
machine (i386's int 0x80, x32 on x86_64) fails with EPERM as a whole: the filter would
not know its numbers. tests/broker/test_seccomp_filter.py runs the program over every
syscall number and architecture against a policy written apart.

Pure: it builds bytes and touches nothing.
"""

from __future__ import annotations

import errno
import functools
import platform
import struct
from collections.abc import Mapping
from typing import Final

import attrs

SETID_BITS: Final = 0o6000
"""S_ISUID | S_ISGID."""
CLONE_NEWUSER: Final = 0x10000000
TIOCSTI: Final = 0x5412
TIOCLINUX: Final = 0x541C
"""<asm-generic/ioctls.h>, which x86_64 and aarch64 both use."""
X32_BIT: Final = 0x40000000

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
    # The low 32 bits of args[index]: both architectures are little-endian, and every
    # value checked is 32 bits as the kernel reads it (a mode, clone's flags, an ioctl
    # request), whatever the register's high half holds.
    return 16 + 8 * index


@attrs.frozen
class Syscalls:
    """One architecture's numbers, as the filter needs them."""

    audit_arch: int
    """AUDIT_ARCH_* of its native calls; any other arch value is refused."""
    x32: bool
    """Numbers from X32_BIT up are another ABI on the same arch value (x86_64)."""
    mode_arg: Mapping[int, int]
    """Calls that set a file's mode: number -> index of the mode argument."""
    eperm: tuple[int, ...]
    enosys: tuple[int, ...]
    clone: tuple[int, int]
    """clone's number and the index of its flags argument."""
    ioctl: int


_ENOSYS_COMMON: Final = (
    435,  # clone3
    428,  # open_tree
    429,  # move_mount
    430,  # fsopen
    431,  # fsconfig
    432,  # fsmount
    433,  # fspick
    442,  # mount_setattr
    437,  # openat2
    425,  # io_uring_setup
)
"""The same numbers on both: calls added after 2019 are numbered alike everywhere."""

SYSCALLS: Final[Mapping[str, Syscalls]] = {
    "x86_64": Syscalls(
        audit_arch=0xC000003E,
        x32=True,
        mode_arg={
            2: 2,  # open(path, flags, mode)
            85: 1,  # creat(path, mode)
            257: 3,  # openat(dirfd, path, flags, mode)
            90: 1,  # chmod(path, mode)
            91: 1,  # fchmod(fd, mode)
            268: 2,  # fchmodat(dirfd, path, mode)
            452: 2,  # fchmodat2(dirfd, path, mode, flags)
            133: 1,  # mknod(path, mode, dev)
            259: 2,  # mknodat(dirfd, path, mode, dev)
        },
        eperm=(
            272,  # unshare
            308,  # setns
            165,  # mount
            166,  # umount2
            155,  # pivot_root
            161,  # chroot
            248,  # add_key
            249,  # request_key
            250,  # keyctl
            321,  # bpf
            298,  # perf_event_open
            323,  # userfaultfd
        ),
        enosys=_ENOSYS_COMMON,
        clone=(56, 0),  # clone(flags, stack, ...)
        ioctl=16,
    ),
    "aarch64": Syscalls(
        audit_arch=0xC00000B7,
        x32=False,
        mode_arg={
            56: 3,  # openat(dirfd, path, flags, mode)
            52: 1,  # fchmod(fd, mode)
            53: 2,  # fchmodat(dirfd, path, mode)
            452: 2,  # fchmodat2(dirfd, path, mode, flags)
            33: 2,  # mknodat(dirfd, path, mode, dev)
        },
        eperm=(
            97,  # unshare
            268,  # setns
            40,  # mount
            39,  # umount2
            41,  # pivot_root
            51,  # chroot
            217,  # add_key
            218,  # request_key
            219,  # keyctl
            280,  # bpf
            241,  # perf_event_open
            282,  # userfaultfd
        ),
        enosys=_ENOSYS_COMMON,
        clone=(220, 0),  # clone(flags, stack, ...)
        ioctl=29,
    ),
}

# An instruction before its jumps are resolved: (code, k, jump-true label, jump-false
# label); None is the next instruction.
_Step = tuple[int, int, str | None, str | None]
_RETURNS: Final = {
    "allow": _RET_ALLOW,
    "eperm": _RET_ERRNO | errno.EPERM,
    "foreign": _RET_ERRNO | errno.EPERM,
    "nosys": _RET_ERRNO | errno.ENOSYS,
}


def _instruction(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def _blocks(calls: Syscalls) -> tuple[list[_Step], dict[str, list[_Step]]]:
    """The dispatch on the syscall number, and the argument checks it jumps to."""
    dispatch: list[_Step] = [
        (_LD_W_ABS, _ARCH, None, None),
        (_JEQ_K, calls.audit_arch, None, "foreign"),
        (_LD_W_ABS, _NR, None, None),
    ]
    if calls.x32:
        dispatch.append((_JGE_K, X32_BIT, "foreign", None))
    dispatch += [(_JEQ_K, number, "eperm", None) for number in calls.eperm]
    dispatch += [(_JEQ_K, number, "nosys", None) for number in calls.enosys]
    clone, flags_arg = calls.clone
    dispatch += [(_JEQ_K, clone, "clone", None), (_JEQ_K, calls.ioctl, "ioctl", None)]
    checks: dict[str, list[_Step]] = {
        "clone": [
            (_LD_W_ABS, _arg(flags_arg), None, None),
            (_JSET_K, CLONE_NEWUSER, "eperm", "allow"),
        ],
        "ioctl": [
            (_LD_W_ABS, _arg(1), None, None),
            (_JEQ_K, TIOCSTI, "eperm", None),
            (_JEQ_K, TIOCLINUX, "eperm", "allow"),
        ],
    }
    # One check per argument index that carries a mode, shared by its calls.
    for number, index in calls.mode_arg.items():
        dispatch.append((_JEQ_K, number, f"mode{index}", None))
        checks[f"mode{index}"] = [
            (_LD_W_ABS, _arg(index), None, None),
            (_JSET_K, SETID_BITS, "eperm", "allow"),
        ]
    code, k, true, _ = dispatch[-1]
    dispatch[-1] = (code, k, true, "allow")
    return dispatch, checks


@functools.cache
def filter_program(machine: str | None = None) -> bytes | None:
    """The filter for ``machine`` (default: this one, as ``platform.machine()`` says),
    as bwrap's ``--seccomp`` reads it: ``struct sock_filter`` entries, native order.
    None for an architecture whose syscall numbers it does not know."""
    calls = SYSCALLS.get(machine or platform.machine())
    if calls is None:
        return None
    dispatch, checks = _blocks(calls)
    body = list(dispatch)
    labels: dict[str, int] = {}
    for name, block in checks.items():
        labels[name] = len(body)
        body += block
    for offset, name in enumerate(_RETURNS):
        labels[name] = len(body) + offset

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
    return program + b"".join(_instruction(_RET_K, value) for value in _RETURNS.values())
