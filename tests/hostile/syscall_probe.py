"""Raw system calls for tests/hostile/test_nested_namespaces.py, run by the host's
/usr/bin/python3 inside the shell sandbox (and on the host, as the control that each
call is the call it claims to be). It imports nothing of boxmaker.

    python3 syscall_probe.py NAME...

Each NAME is one call (see PROBES); the last line of stdout is ``PROBE-RAN`` and a JSON
object: NAME -> "ok" (the call succeeded) or the errno's name ("EPERM"). Files are made
in the current directory under names the test knows (``chmod-4755``).

The numbers come from the kernel's tables (<asm/unistd_64.h>, <asm/unistd_32.h>,
<asm-generic/unistd.h>; fchmodat2, Linux 6.6: arch/x86/entry/syscalls/syscall_64.tbl
and include/uapi/asm-generic/unistd.h), written here independently of
src/boxmaker/broker/seccomp.py.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import mmap
import os
import platform
import signal
import struct
import sys
import termios
from collections.abc import Callable

NUMBERS = {
    "x86_64": {
        "open": 2, "creat": 85, "openat": 257, "chmod": 90, "fchmod": 91, "fchmodat": 268,
        "fchmodat2": 452, "mknod": 133, "mknodat": 259, "clone": 56, "clone3": 435,
        "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155,
        "chroot": 161, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
        "fsmount": 432, "fspick": 433, "mount_setattr": 442, "ioctl": 16, "add_key": 248,
        "request_key": 249, "keyctl": 250, "bpf": 321, "perf_event_open": 298,
        "userfaultfd": 323, "openat2": 437, "io_uring_setup": 425, "getpid": 39,
    },
    "aarch64": {
        "openat": 56, "fchmod": 52, "fchmodat": 53, "fchmodat2": 452, "mknodat": 33,
        "clone": 220, "clone3": 435, "unshare": 97, "setns": 268, "mount": 40,
        "umount2": 39, "pivot_root": 41, "chroot": 51, "open_tree": 428, "move_mount": 429,
        "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
        "mount_setattr": 442, "ioctl": 29, "add_key": 217, "request_key": 218,
        "keyctl": 219, "bpf": 280, "perf_event_open": 241, "userfaultfd": 282,
        "openat2": 437, "io_uring_setup": 425, "getpid": 172,
    },
}  # fmt: skip
NR = NUMBERS.get(platform.machine(), {})
X32_BIT = 0x40000000
I386_CHMOD, I386_GETPID = 15, 20  # <asm/unistd_32.h>
AT_FDCWD = -100
CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
TCGETS, TIOCSTI, TIOCLINUX = 0x5401, 0x5412, 0x541C  # <asm-generic/ioctls.h>
HIGH = 0xFFFFFFFF00000000
"""Bits a 32-bit argument (an ioctl request) has in the register, ignored by the kernel."""
KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING = 0, -3
MAP_32BIT = 0x40
NOWHERE = b"/nonexistent-bx-probe"

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def outcome(result: int) -> str:
    return "ok" if result >= 0 else errno.errorcode[ctypes.get_errno()]


def word(value: int | bytes | None) -> ctypes.c_ulong | ctypes.c_char_p:
    if value is None or isinstance(value, bytes):
        return ctypes.c_char_p(value)
    return ctypes.c_ulong(value & 0xFFFFFFFFFFFFFFFF)


def result_of(number: int, *args: int | bytes | None) -> int:
    """libc's syscall(): the result, or -1 with errno set."""
    ctypes.set_errno(0)
    return int(libc.syscall(ctypes.c_long(number), *(word(arg) for arg in args)))


def raw(number: int, *args: int | bytes | None) -> str:
    """The call: "ok" or the errno's name."""
    return outcome(result_of(number, *args))


def call(name: str, *args: int | bytes | None) -> str:
    return raw(NR[name], *args)


def fresh(path: bytes) -> None:
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644))


def setid(name: str, mode: int) -> str:
    """``name`` (a call that sets a file's mode) with ``mode``, on ``NAME-MODE``."""
    path = f"{name}-{mode:o}".encode()
    flags = os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC
    regular = 0o100000 | mode  # S_IFREG
    if name in ("chmod", "fchmodat", "fchmodat2"):
        fresh(path)
    if name == "fchmod":
        fd = os.open(path, flags, 0o644)
        try:
            return call(name, fd, mode)
        finally:
            os.close(fd)
    args: dict[str, tuple[int | bytes, ...]] = {
        "chmod": (path, mode),
        "fchmodat": (AT_FDCWD, path, mode),
        "fchmodat2": (AT_FDCWD, path, mode, 0),
        "open": (path, flags, mode),
        "openat": (AT_FDCWD, path, flags, mode),
        "creat": (path, mode),
        "mknod": (path, regular, 0),
        "mknodat": (AT_FDCWD, path, regular, 0),
    }
    result = result_of(NR[name], *args[name])
    said = outcome(result)
    if result >= 0 and name in ("open", "openat", "creat"):
        os.close(result)
    return said


def clone(flags: int) -> str:
    """A raw clone(flags) with SIGCHLD: fork's shape; the child leaves at once."""
    pid = result_of(NR["clone"], flags | signal.SIGCHLD, 0, 0, 0, 0)
    if pid == 0:
        os._exit(0)
    if pid > 0:
        os.waitpid(pid, 0)
    return outcome(pid)


def clone3(flags: int | None) -> str:
    """clone3 with struct clone_args (size 64, version 0), or none at all (None)."""
    if flags is None:
        return call("clone3", None, 0)
    args = ctypes.create_string_buffer(struct.pack("=8Q", flags, 0, 0, 0, signal.SIGCHLD, 0, 0, 0))
    ctypes.set_errno(0)
    pid = int(libc.syscall(ctypes.c_long(NR["clone3"]), args, ctypes.c_size_t(64)))
    if pid == 0:
        os._exit(0)
    if pid > 0:
        os.waitpid(pid, 0)
    return outcome(pid)


def terminal_ioctl(request: int) -> str:
    """``request`` on a fresh pseudo-terminal (made here: nothing else's terminal) that
    is the controlling terminal of a new session, as a command's own terminal would be
    (without that the kernel itself refuses TIOCSTI), with one byte as the argument."""
    primary, secondary = os.openpty()
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:
        said = "setup failed"
        try:
            os.setsid()
            fcntl.ioctl(secondary, termios.TIOCSCTTY, 0)
            byte = ctypes.create_string_buffer(b"\n", 64)
            said = call("ioctl", secondary, request, ctypes.addressof(byte))
        finally:
            os.write(writer, said.encode())
            os._exit(0)
    os.close(writer)
    os.waitpid(child, 0)
    with os.fdopen(reader) as answer:
        said = answer.read()
    os.close(primary)
    os.close(secondary)
    return said


def page(prot: int, flags: int = 0) -> tuple[mmap.mmap, int]:
    area = mmap.mmap(
        -1, mmap.PAGESIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | flags, prot=prot
    )
    return area, ctypes.addressof(ctypes.c_char.from_buffer(area))


def int80(number: int, first: bytes | None = None, second: int = 0) -> int:
    """The i386 entry (``int 0x80``) from this 64-bit process: eax = number, ebx = a
    string in the low 4 GiB (a MAP_32BIT page), ecx = second. Returns eax."""
    data, data_at = page(mmap.PROT_READ | mmap.PROT_WRITE, MAP_32BIT)
    if first is not None:
        data[: len(first) + 1] = first + b"\0"
    assert data_at < 1 << 32, hex(data_at)
    # push rbx; mov eax, number; mov ebx, edi; mov ecx, esi; int 0x80; pop rbx; ret
    code = b"\x53\xb8" + struct.pack("<I", number) + b"\x89\xfb\x89\xf1\xcd\x80\x5b\xc3"
    text, text_at = page(mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    text[: len(code)] = code
    function = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint, ctypes.c_uint)(text_at)
    return int(function(data_at if first is not None else 0, second))


def int80_outcome(result: int) -> str:
    return "ok" if result >= 0 else errno.errorcode[-result]


def x32_chmod(mode: int) -> str:
    path = f"x32-{mode:o}".encode()
    fresh(path)
    return raw(X32_BIT | NR["chmod"], path, mode)


def i386_chmod(mode: int) -> str:
    path = f"i386-{mode:o}".encode()
    fresh(path)
    return int80_outcome(int80(I386_CHMOD, path, mode))


def i386_getpid() -> str:
    """ "pid" when int 0x80 answered this process's pid."""
    pid = int80(I386_GETPID)
    return "pid" if pid == os.getpid() else int80_outcome(pid)


PROBES: dict[str, Callable[[], str]] = {}
for _name in ("chmod", "fchmod", "fchmodat", "fchmodat2", "open", "openat", "creat",
              "mknod", "mknodat"):  # fmt: skip
    for _mode in (0o4755, 0o2755, 0o6755, 0o755):
        PROBES[f"{_name} {_mode:o}"] = lambda n=_name, m=_mode: setid(n, m)
PROBES.update({
    "x32 chmod 4755": lambda: x32_chmod(0o4755),
    "x32 getpid": lambda: raw(X32_BIT | NR["getpid"]),
    "i386 chmod 4755": lambda: i386_chmod(0o4755),
    "i386 chmod 755": lambda: i386_chmod(0o755),
    "i386 getpid": i386_getpid,
    "clone": lambda: clone(0),
    "clone NEWUSER": lambda: clone(CLONE_NEWUSER),
    "clone NEWUSER|NEWNET": lambda: clone(CLONE_NEWUSER | CLONE_NEWNET),
    "clone3 NEWUSER": lambda: clone3(CLONE_NEWUSER),
    "clone3 no args": lambda: clone3(None),
    "unshare NEWUSER": lambda: call("unshare", CLONE_NEWUSER),
    "unshare bad flags": lambda: call("unshare", 0x1),
    "setns": lambda: call("setns", -1, 0),
    "TCGETS": lambda: terminal_ioctl(TCGETS),
    "TIOCSTI": lambda: terminal_ioctl(TIOCSTI),
    "TIOCSTI high": lambda: terminal_ioctl(HIGH | TIOCSTI),
    "TIOCLINUX": lambda: terminal_ioctl(TIOCLINUX),
    "TIOCLINUX high": lambda: terminal_ioctl(HIGH | TIOCLINUX),
    "mount": lambda: call("mount", b"none", NOWHERE, b"tmpfs", 0, None),
    "umount2": lambda: call("umount2", NOWHERE, 0),
    "pivot_root": lambda: call("pivot_root", NOWHERE, NOWHERE),
    "chroot": lambda: call("chroot", NOWHERE),
    "open_tree": lambda: call("open_tree", AT_FDCWD, NOWHERE, 0),
    "move_mount": lambda: call("move_mount", -1, b"", -1, b"", 0),
    "fsopen": lambda: call("fsopen", b"no-such-fs-bx", 0),
    "fsconfig": lambda: call("fsconfig", -1, 0, None, None, 0),
    "fsmount": lambda: call("fsmount", -1, 0, 0),
    "fspick": lambda: call("fspick", AT_FDCWD, NOWHERE, 0),
    "mount_setattr": lambda: call("mount_setattr", -1, b"", 0, None, 0),
    "add_key": lambda: call("add_key", b"no-such-type-bx", b"bx", None, 0, 0),
    "request_key": lambda: call("request_key", b"no-such-type-bx", b"bx", None, 0),
    "keyctl": lambda: call("keyctl", KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0),
    "bpf": lambda: call("bpf", 0xFFFF, None, 0),
    "perf_event_open": lambda: call("perf_event_open", None, 0, -1, -1, 0),
    "userfaultfd": lambda: call("userfaultfd", 0xFFFF),
})  # fmt: skip


if __name__ == "__main__":
    os.umask(0)
    found = {name: PROBES[name]() for name in sys.argv[1:]}
    print("PROBE-RAN " + json.dumps(found), flush=True)
