"""read_file on the trio thread when the kernel can serve it from its caches
(broker/nowait.py, docs/decisions.md): it may only ever give what the worker-thread
path gives, and must refuse — hand over to the thread — everything else."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from tests.harness.runner import spec_for

from boxmaker.broker import nowait
from boxmaker.broker.run_spec import RunResult, ToolFailed
from boxmaker.broker.runner import execute
from boxmaker.broker.tools import files
from boxmaker.broker.tools.files import CACHED_READ_MAX
from boxmaker.broker.tools.host import REAL_HOST, Host
from boxmaker.core.labels import Label, Taint
from boxmaker.core.reasons import Reason

INTERNAL = Label(Taint.INTERNAL, False)
SECRET = Label(Taint.SECRET, False)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A workspace with what read_file meets: files, links in and out, a directory, a
    FIFO, a file over the cached-read limit, a secret."""
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (tmp_path / "outside.txt").write_text("outside\n")
    (ws / "notes.txt").write_text("notes\n")
    (ws / "sub" / "deep.txt").write_text("deep\n")
    (ws / ".env").write_text("TOKEN=1\n")
    (ws / "empty.txt").write_text("")
    (ws / "big.txt").write_bytes(b"b" * (CACHED_READ_MAX + 1))
    (ws / "latin.txt").write_bytes(b"caf\xe9\n")
    (ws / "in-link").symlink_to("sub/deep.txt")
    (ws / "secret-link").symlink_to(".env")
    (ws / "abs-in-link").symlink_to(ws / "notes.txt")
    (ws / "out-link").symlink_to("../outside.txt")
    (ws / "abs-out-link").symlink_to(tmp_path / "outside.txt")
    (ws / "proc-link").symlink_to("/proc/self/fd/0")
    (ws / "loop").symlink_to("loop")
    os.mkfifo(ws / "fifo")
    # Read once through the page cache, as a file the owner just wrote usually is.
    for path in ws.rglob("*"):
        if path.is_symlink():
            # A link followed within a clock tick of its creation still needs its
            # access time written (relatime), which RESOLVE_CACHED refuses: made as if
            # it had been read a second after it was made, as any older link has been.
            made = path.lstat().st_mtime_ns
            os.utime(path, ns=(made + 10**9, made), follow_symlinks=False)
        elif path.is_file():
            path.read_bytes()
    return ws


@pytest.fixture
def supported(tree: Path) -> None:
    """Skips where the kernel (before 5.12) or a seccomp filter refuses the calls."""
    if nowait.read_cached_beneath(str(tree), "notes.txt", 4096) is None:
        pytest.skip("this kernel cannot open or read without blocking")


PATHS = [
    "notes.txt",
    "sub/deep.txt",
    "sub/../notes.txt",
    ".env",
    "empty.txt",
    "big.txt",
    "latin.txt",
    "in-link",
    "secret-link",
    "abs-in-link",
    "out-link",
    "abs-out-link",
    "proc-link",
    "loop",
    "fifo",
    "sub",
    ".",
    "missing.txt",
    "sub/missing.txt",
    "notes.txt/x",
]


def thread_path(spec: Any, path: str) -> RunResult:
    value = spec.arguments.value
    try:
        return files.read_file(spec, value, REAL_HOST)
    except ToolFailed as failed:
        return RunResult.failure(failed.reason, failed.detail, spec.label)


def test_a_small_cached_file_is_read_with_its_real_path(tree: Path, supported: None) -> None:
    cached = nowait.read_cached_beneath(str(tree), "in-link", 4096)
    assert cached == nowait.CachedFile(b"deep\n", "sub/deep.txt")
    assert nowait.read_cached_beneath(str(tree), "empty.txt", 4096) == nowait.CachedFile(
        b"", "empty.txt"
    )


@pytest.mark.parametrize(
    "path",
    [
        "out-link",
        "abs-out-link",
        "abs-in-link",  # absolute: RESOLVE_BENEATH refuses it; the thread path decides
        "proc-link",
        "../outside.txt",
        "loop",
        "fifo",
        "sub",
        ".",
        "missing.txt",
        "big.txt",
    ],
)
def test_everything_but_the_plain_case_goes_to_the_thread(tree: Path, path: str) -> None:
    assert nowait.read_cached_beneath(str(tree), path, CACHED_READ_MAX) is None


def test_a_path_with_a_nul_byte_is_never_cut_short(tree: Path) -> None:
    assert nowait.read_cached_beneath(str(tree), "notes.txt\x00.env", 4096) is None


def test_a_file_over_the_size_given_goes_to_the_thread(tree: Path) -> None:
    assert nowait.read_cached_beneath(str(tree), "notes.txt", len("notes\n") - 1) is None


def test_a_file_whose_data_is_not_cached_goes_to_the_thread(tree: Path, supported: None) -> None:
    target = tree / "cold.txt"
    target.write_bytes(b"c" * 8192)
    fd = os.open(target, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    cold = nowait.read_cached_beneath(str(tree), "cold.txt", CACHED_READ_MAX)
    if cold is not None:
        pytest.skip("this filesystem keeps the pages (tmpfs): nothing to evict")
    target.read_bytes()
    assert nowait.read_cached_beneath(str(tree), "cold.txt", CACHED_READ_MAX) is not None


def test_without_openat2_nothing_is_tried(tree: Path) -> None:
    assert nowait.read_cached_beneath(str(tree), "notes.txt", 4096, syscall=None) is None


SERVED = {"notes.txt", "sub/deep.txt", "sub/../notes.txt", ".env", "empty.txt", "latin.txt"}
SERVED |= {"in-link", "secret-link"}
"""What the cache serves in this tree: small regular files, through links that stay in."""


def serves(tree: Path, max_bytes: int | None) -> set[str]:
    """What the cache serves for a read of at most ``max_bytes``: a file over it goes to
    the thread, which cuts it."""
    return {
        path for path in SERVED if max_bytes is None or (tree / path).stat().st_size <= max_bytes
    }


def holding_everything(root: str, path: str, max_size: int) -> nowait.CachedFile | None:
    """The cached read as a kernel that holds every path and page in its caches answers
    (nowait's ``cached_only=False``): what it serves depends on the tree alone, not on
    what the machine happens to have cached at that moment."""
    return nowait.read_cached_beneath(root, path, max_size, cached_only=False)


@pytest.fixture
def openat2(tree: Path) -> None:
    """Skips where the kernel has no openat2 (before 5.6) or a seccomp filter refuses it."""
    if holding_everything(str(tree), "notes.txt", 4096) is None:
        pytest.skip("this kernel cannot open with openat2")


@pytest.mark.parametrize("max_bytes", [None, 1, 5, 6, 100])
async def test_the_cached_read_gives_what_the_thread_gives(
    tree: Path, openat2: None, max_bytes: int | None
) -> None:
    """Both ways on purpose, each case's way asserted: execute() with the cached read of a
    kernel that holds everything (its seam, Host.read_cached) answers what it serves
    from the cache, without a thread, and hands everything else to the thread; either
    way the answer is the thread's own read's."""
    host = Host(read_cached=holding_everything)
    threads: list[object] = []

    async def to_thread(work: Any, *args: Any, **_: Any) -> Any:
        threads.append(work)
        return work(*args)

    served = set()
    for path in PATHS:
        arguments: dict[str, Any] = {"path": path}
        if max_bytes is not None:
            arguments["max_bytes"] = max_bytes
        spec = spec_for("read_file", arguments, tree)
        threads.clear()
        answer = await execute(spec, host=host, to_thread=to_thread)
        assert answer == thread_path(spec, path), path
        assert threads in ([], [files.read_file]), (path, threads)
        if not threads:
            served.add(path)
    # Everything else went to the thread; a file over max_bytes too (the thread cuts it).
    assert served == serves(tree, max_bytes)


@pytest.mark.parametrize("max_bytes", [None, 6])
def test_what_the_real_cache_serves_is_what_the_thread_gives(
    tree: Path, supported: None, max_bytes: int | None
) -> None:
    """The machine's own caches: whatever they serve now (a cold cache only serves less,
    so this holds under any load) is what the thread gives, and only what a cache may
    serve."""
    served = set()
    for path in PATHS:
        arguments: dict[str, Any] = {"path": path}
        if max_bytes is not None:
            arguments["max_bytes"] = max_bytes
        spec = spec_for("read_file", arguments, tree)
        cached = files.read_file_cached(spec, spec.arguments.value)  # type: ignore[arg-type]
        if cached is not None:
            assert cached == thread_path(spec, path), path
            served.add(path)
    assert served <= serves(tree, max_bytes)


async def test_the_runner_reads_a_cached_file_without_a_thread(tree: Path, supported: None) -> None:
    async def no_thread(*_: object, **__: object) -> None:
        raise AssertionError("a worker thread was used")

    result = await execute(
        spec_for("read_file", {"path": "secret-link"}, tree), to_thread=no_thread
    )
    assert (result.ok, result.content, result.label) == (True, "TOKEN=1\n", SECRET)
    # The control: a file over the limit does go to a thread (and execute() reports the
    # failure it met there as the tool's).
    big = await execute(spec_for("read_file", {"path": "big.txt"}, tree), to_thread=no_thread)
    assert big.reason is Reason.TOOL_ERROR
    assert big.detail is not None
    assert "a worker thread was used" in big.detail


async def test_what_the_cache_cannot_serve_is_read_in_a_thread(tree: Path) -> None:
    result = await execute(spec_for("read_file", {"path": "big.txt", "max_bytes": 3}, tree))
    assert result.ok
    assert result.content == f"bbb\n[file cut at 3 of {CACHED_READ_MAX + 1} bytes]"
    assert result.label == INTERNAL
