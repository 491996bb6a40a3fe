"""The sandbox's seccomp filter, by behaviour: its bytes run in a small classic-BPF
interpreter (the kernel's semantics for the instructions a seccomp filter may use) over
every syscall number, every architecture value and arguments that exercise each checked
bit, and every answer is compared with the policy written here as data.

Nothing is read from seccomp.py but the program: the syscall numbers are the probe's
(tests/hostile/syscall_probe.py), checked against the kernel's headers where the host has
them, and the policy below says by name what each call gets. A wrong jump, a mode read
from the wrong argument, a dropped architecture or x32 check each change some answer.
"""

from __future__ import annotations

import errno
import re
import struct
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Final

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.hostile.syscall_probe import NUMBERS

from boxmaker.broker.seccomp import filter_program

MACHINES: Final = ("x86_64", "aarch64")
AUDIT_ARCH: Final = {
    # <linux/audit.h>: EM_* | __AUDIT_ARCH_64BIT (0x80000000) | __AUDIT_ARCH_LE (0x40000000)
    "x86_64": 0xC000003E,
    "aarch64": 0xC00000B7,
    "i386": 0x40000003,
    "arm": 0x40000028,
    "unknown": 0x12345678,
}
X32_BIT: Final = 0x40000000
U64: Final = (1 << 64) - 1

# --- the policy, by name ----------------------------------------------------------------

ALLOW: Final = "allow"
EPERM: Final = "EPERM"
ENOSYS: Final = "ENOSYS"
REFUSED_EPERM: Final = frozenset(
    {"unshare", "setns", "mount", "umount2", "pivot_root", "chroot"}
    | {"add_key", "request_key", "keyctl"}
    | {"bpf", "perf_event_open", "userfaultfd"}
)
REFUSED_ENOSYS: Final = frozenset(
    {"clone3", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick"}
    | {"mount_setattr", "openat2", "io_uring_setup"}
)
MODE_ARG: Final = {
    "open": 2,  # open(path, flags, mode)
    "creat": 1,  # creat(path, mode)
    "openat": 3,  # openat(dirfd, path, flags, mode)
    "chmod": 1,  # chmod(path, mode)
    "fchmod": 1,  # fchmod(fd, mode)
    "fchmodat": 2,  # fchmodat(dirfd, path, mode)
    "fchmodat2": 2,  # fchmodat2(dirfd, path, mode, flags)
    "mknod": 1,  # mknod(path, mode, dev)
    "mknodat": 2,  # mknodat(dirfd, path, mode, dev)
}
SETID: Final = 0o6000
CLONE_FLAGS_ARG: Final = 0
"""clone's flags come first on x86_64 and aarch64 (not CONFIG_CLONE_BACKWARDS2)."""
CLONE_NEWUSER: Final = 0x10000000
TIOCSTI, TIOCLINUX = 0x5412, 0x541C
IOCTL_REQUEST_ARG: Final = 1


def expected(machine: str, arch: int, number: int, args: Sequence[int]) -> str:
    """What the filter for ``machine`` must answer. Every checked value is 32 bits as
    the kernel reads it (umode_t, clone's lower_32_bits, an unsigned int request)."""
    if arch != AUDIT_ARCH[machine]:
        return EPERM
    if machine == "x86_64" and number >= X32_BIT:
        return EPERM
    names = [name for name, value in NUMBERS[machine].items() if value == number]
    name = names[0] if names else None
    low = [arg & 0xFFFFFFFF for arg in args]
    if name in REFUSED_EPERM:
        return EPERM
    if name in REFUSED_ENOSYS:
        return ENOSYS
    if name in MODE_ARG:
        return EPERM if low[MODE_ARG[name]] & SETID else ALLOW
    if name == "clone":
        return EPERM if low[CLONE_FLAGS_ARG] & CLONE_NEWUSER else ALLOW
    if name == "ioctl":
        return EPERM if low[IOCTL_REQUEST_ARG] in (TIOCSTI, TIOCLINUX) else ALLOW
    return ALLOW


# --- a classic BPF interpreter ----------------------------------------------------------

LD_W_ABS, JA, RET_K = 0x20, 0x05, 0x06
CONDITIONS: Final[dict[int, Callable[[int, int], bool]]] = {
    0x15: lambda a, k: a == k,  # BPF_JMP | BPF_JEQ | BPF_K
    0x25: lambda a, k: a > k,  # BPF_JGT
    0x35: lambda a, k: a >= k,  # BPF_JGE
    0x45: lambda a, k: a & k != 0,  # BPF_JSET
}
SECCOMP_DATA_SIZE: Final = 64
MAX_INSTRUCTIONS: Final = 4096  # BPF_MAXINSNS


class Filter:
    """A decoded program: ``struct sock_filter`` entries, native order."""

    def __init__(self, program: bytes) -> None:
        assert len(program) % 8 == 0
        self.code = [struct.unpack_from("=HBBI", program, at) for at in range(0, len(program), 8)]
        assert 0 < len(self.code) <= MAX_INSTRUCTIONS

    def run(self, arch: int, number: int, args: Sequence[int]) -> str:
        """The answer to one call, as its seccomp_data says (little-endian: both
        architectures are): "allow" or the errno's name."""
        data = struct.pack("<IIQ6Q", number, arch, 0x7FFF0000_1000, *args)
        at, accumulator = 0, 0
        while True:
            # Past the end is an IndexError: the kernel would have rejected the program.
            code, jt, jf, k = self.code[at]
            if code == LD_W_ABS:
                assert k % 4 == 0, (at, k)
                assert k + 4 <= SECCOMP_DATA_SIZE, (at, k)
                accumulator = struct.unpack_from("<I", data, k)[0]
                at += 1
            elif code in CONDITIONS:
                at += 1 + (jt if CONDITIONS[code](accumulator, k) else jf)
            elif code == JA:
                at += 1 + k
            elif code == RET_K:
                return answer(k)
            else:
                raise AssertionError(f"instruction {at}: code {code:#x} is not expected here")


def answer(value: int) -> str:
    if value == 0x7FFF0000:  # SECCOMP_RET_ALLOW
        return ALLOW
    assert value & 0xFFFF0000 == 0x00050000, hex(value)  # SECCOMP_RET_ERRNO
    return errno.errorcode[value & 0xFFFF]


def program_for(machine: str) -> Filter:
    program = filter_program(machine)
    assert program is not None
    return Filter(program)


def compare(
    machine: str, cases: Iterable[tuple[int, int, Sequence[int]]]
) -> dict[tuple[str, int, tuple[int, ...]], tuple[str, str]]:
    """The cases where the filter and the policy differ: (arch, number, args) ->
    (filter's answer, policy's), with the arch by name and numbers in hex."""
    program = program_for(machine)
    names = {value: name for name, value in AUDIT_ARCH.items()}
    wrong = {}
    for arch, number, args in cases:
        got, want = program.run(arch, number, args), expected(machine, arch, number, args)
        if got != want:
            wrong[names.get(arch, hex(arch)), number, tuple(args)] = (got, want)
    return wrong


def one_at(value: int, index: int) -> tuple[int, ...]:
    return tuple(value if at == index else 0 for at in range(6))


def test_the_interpreter_runs_the_kernels_instructions() -> None:
    # A hand-made filter: EPERM for number 7 when args[1] has bit 0x4, ENOSYS for a
    # foreign arch, else allow. Checks the interpreter before it checks anything.
    def insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
        return struct.pack("=HBBI", code, jt, jf, k)

    program = Filter(
        insn(LD_W_ABS, 4)
        + insn(0x15, 0xC000003E, 1, 0)
        + insn(RET_K, 0x00050000 | errno.ENOSYS)
        + insn(LD_W_ABS, 0)
        + insn(0x15, 7, 0, 2)
        + insn(LD_W_ABS, 24)
        + insn(0x45, 0x4, 1, 0)
        + insn(RET_K, 0x7FFF0000)
        + insn(RET_K, 0x00050000 | errno.EPERM)
    )
    x86 = AUDIT_ARCH["x86_64"]
    assert program.run(x86, 7, one_at(0x4, 1)) == EPERM
    assert program.run(x86, 7, one_at(0x4 << 32, 1)) == ALLOW  # the high half is not read
    assert program.run(x86, 7, one_at(0x4, 2)) == ALLOW
    assert program.run(x86, 8, one_at(0x4, 1)) == ALLOW
    assert program.run(AUDIT_ARCH["i386"], 7, one_at(0, 0)) == ENOSYS


# --- the whole table, every architecture ------------------------------------------------

SETID_EVERYWHERE: Final = [one_at(SETID, index) for index in range(6)]
CLONE_EVERYWHERE: Final = [one_at(CLONE_NEWUSER, index) for index in range(6)]
IOCTL_EVERYWHERE: Final = [one_at(TIOCSTI, index) for index in range(6)]
BASIC_ARGS: Final = [
    (0,) * 6,
    (U64,) * 6,
    ((U64 << 32) & U64,) * 6,  # high halves only: the kernel reads none of it
    *SETID_EVERYWHERE,
    *CLONE_EVERYWHERE,
    *IOCTL_EVERYWHERE,
    one_at(TIOCLINUX, 1),
]
NUMBERS_TO_TRY: Final = [
    *range(1024),
    *range(X32_BIT - 4, X32_BIT + 1024),
    0x7FFFFFFF,
    0x80000000,
    0xC000003E,
    0xFFFFFFFF,
]


@pytest.mark.parametrize("machine", MACHINES)
def test_every_number_on_every_architecture(machine: str) -> None:
    cases = (
        (arch, number, args)
        for arch in AUDIT_ARCH.values()
        for number in NUMBERS_TO_TRY
        for args in (BASIC_ARGS if arch == AUDIT_ARCH[machine] else BASIC_ARGS[:4])
    )
    assert compare(machine, cases) == {}


@pytest.mark.parametrize(
    ("machine", "name"),
    # aarch64 has only the *at calls, and fchmod.
    [(machine, name) for machine in MACHINES for name in MODE_ARG if name in NUMBERS[machine]],
)
def test_every_mode_in_every_argument(machine: str, name: str) -> None:
    arch, number = AUDIT_ARCH[machine], NUMBERS[machine][name]
    modes = [*range(0o10000), 0o4000 | 1 << 32, 0o755 | 1 << 32, 0o2000 | U64 << 16 & U64]
    cases = [(arch, number, one_at(mode, index)) for mode in modes for index in range(6)]
    # The same calls through the other ABIs: refused whatever the mode.
    cases += [(AUDIT_ARCH["i386"], number, one_at(0o755, MODE_ARG[name]))]
    if machine == "x86_64":
        cases += [(arch, X32_BIT | number, one_at(mode, MODE_ARG[name])) for mode in (0, 0o755)]
    assert compare(machine, cases) == {}
    # And the policy means what it says: a setid mode is refused, a plain one allowed.
    program = program_for(machine)
    assert program.run(arch, number, one_at(0o4755, MODE_ARG[name])) == EPERM
    assert program.run(arch, number, one_at(0o755, MODE_ARG[name])) == ALLOW


@pytest.mark.parametrize("machine", MACHINES)
def test_clone_flags_bit_by_bit(machine: str) -> None:
    arch, number = AUDIT_ARCH[machine], NUMBERS[machine]["clone"]
    bits = [1 << bit for bit in range(64)]
    flags = [*bits, *(bit | CLONE_NEWUSER for bit in bits), U64 ^ CLONE_NEWUSER, U64]
    cases = [(arch, number, one_at(value, index)) for value in flags for index in range(6)]
    assert compare(machine, cases) == {}
    program = program_for(machine)
    assert program.run(arch, number, one_at(CLONE_NEWUSER | 0x11, 0)) == EPERM
    assert program.run(arch, number, one_at(0x11, 0)) == ALLOW  # fork's flags
    assert program.run(arch, number, one_at(CLONE_NEWUSER << 32, 0)) == ALLOW


@pytest.mark.parametrize("machine", MACHINES)
def test_ioctl_requests_on_their_low_32_bits(machine: str) -> None:
    arch, number = AUDIT_ARCH[machine], NUMBERS[machine]["ioctl"]
    requests = [TIOCSTI, TIOCLINUX, 0x5401, TIOCSTI - 1, TIOCSTI + 1, TIOCLINUX + 1]
    requests += [request | 1 << bit for request in (TIOCSTI, TIOCLINUX) for bit in range(32, 64)]
    requests += [TIOCSTI ^ 1 << bit for bit in range(32)]
    cases = [(arch, number, one_at(value, index)) for value in requests for index in range(6)]
    assert compare(machine, cases) == {}
    program = program_for(machine)
    assert program.run(arch, number, one_at(TIOCSTI | U64 << 32 & U64, 1)) == EPERM


ARCH_VALUES: Final = st.sampled_from(sorted(AUDIT_ARCH.values()))
INTERESTING: Final = [0, SETID, 0o4000, 0o2000, CLONE_NEWUSER, TIOCSTI, TIOCLINUX, U64]
ARG: Final = st.one_of(
    st.integers(0, U64),
    st.sampled_from(INTERESTING),
    st.tuples(st.sampled_from(INTERESTING), st.integers(0, U64 >> 32)).map(
        lambda pair: pair[0] | pair[1] << 32 & U64
    ),
)


@pytest.mark.parametrize("machine", MACHINES)
@settings(max_examples=500)
@given(data=st.data())
def test_any_call_any_arguments(machine: str, data: st.DataObject) -> None:
    known = sorted(NUMBERS[machine].values())
    number = data.draw(
        st.one_of(
            st.sampled_from(known),
            st.sampled_from(known).map(lambda value: value | X32_BIT),
            st.integers(0, 0xFFFFFFFF),
        )
    )
    arch = data.draw(st.one_of(st.just(AUDIT_ARCH[machine]), ARCH_VALUES))
    args = tuple(data.draw(st.lists(ARG, min_size=6, max_size=6)))
    assert compare(machine, [(arch, number, args)]) == {}


# --- the numbers are the kernel's -------------------------------------------------------

HEADERS: Final = {
    "x86_64": Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
    "aarch64": Path("/usr/include/asm-generic/unistd.h"),
}
NEWER_THAN_SOME_HEADERS: Final = frozenset({"fchmodat2"})
"""Linux 6.6; Debian 12's headers (6.1) do not have it."""


@pytest.mark.parametrize("machine", MACHINES)
def test_the_numbers_are_the_kernel_headers(machine: str) -> None:
    header = HEADERS[machine]
    if not header.exists():
        pytest.skip(f"{header} is not installed (linux-libc-dev)")
    defined = {
        name: int(value)
        for name, value in re.findall(r"#define __NR(?:3264)?_(\w+)\s+(\d+)", header.read_text())
    }
    table = NUMBERS[machine]
    assert {name: defined[name] for name in table if name in defined} == {
        name: number for name, number in table.items() if name in defined
    }
    assert set(table) - set(defined) <= NEWER_THAN_SOME_HEADERS
