"""The catalogue and argument checking (the pipeline's step 3)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from boxmaker.core.catalogue import (
    MAX_BYTES,
    MAX_COMMAND_BYTES,
    TOOL_NAMES,
    TOOL_SCHEMAS,
    ArgumentProblem,
    CheckedArguments,
    HttpGetArgs,
    ReadFileArgs,
    ShellArgs,
    catalogue_tools,
    check_arguments,
    result_label,
)
from boxmaker.core.hosts import Destination
from boxmaker.core.labels import HTTP_GET_LABEL, Label, LabelRules, Taint
from boxmaker.core.reasons import Reason


def checked(tool: str, arguments: Any, workspace: str | None = None) -> CheckedArguments:
    result = check_arguments(tool, arguments, workspace=workspace)
    assert isinstance(result, CheckedArguments), result
    return result


def bad(tool: str, arguments: Any) -> str:
    result = check_arguments(tool, arguments)
    assert isinstance(result, ArgumentProblem), result
    assert result.reason is Reason.BAD_ARGUMENTS
    return result.detail


def test_the_catalogue_lists_the_five_tools_in_openai_format() -> None:
    tools = catalogue_tools()
    assert [t["type"] for t in tools] == ["function"] * 5
    assert [t["function"]["name"] for t in tools] == list(TOOL_NAMES)
    for tool in tools:
        function = tool["function"]
        assert set(function) == {"name", "description", "parameters"}
        assert function["parameters"]["type"] == "object"
        assert function["parameters"]["additionalProperties"] is False
    orjson.dumps(tools)


def test_catalogue_tools_is_a_copy() -> None:
    catalogue_tools()[0]["function"]["parameters"]["required"].append("x")
    assert TOOL_SCHEMAS["read_file"]["parameters"]["required"] == ["path"]


def test_unknown_tool() -> None:
    assert check_arguments("rm", {}) == ArgumentProblem(Reason.UNKNOWN_TOOL, "unknown tool 'rm'")
    assert check_arguments("", {}) == ArgumentProblem(Reason.UNKNOWN_TOOL, "unknown tool ''")


def test_good_arguments_of_each_tool() -> None:
    assert checked("read_file", {"path": "a/./b"}).to_json() == {"path": "a/b"}
    assert checked("read_file", {"path": "a", "max_bytes": MAX_BYTES}).to_json() == {
        "path": "a",
        "max_bytes": MAX_BYTES,
    }
    assert checked("list_dir", {"path": ""}).to_json() == {"path": "."}
    assert checked("write_file", {"path": "o.txt", "content": ""}).to_json() == {
        "path": "o.txt",
        "content": "",
    }
    assert checked("shell", {"command": "ls -la"}).value == ShellArgs("ls -la")
    assert checked("http_get", {"url": "https://a.org/x?q=1"}).value == HttpGetArgs(
        "https://a.org/x?q=1"
    )


def test_checked_arguments_expose_what_grants_match() -> None:
    read = checked("read_file", {"path": "notes/../x.txt"})
    assert (read.paths, read.command, read.host) == (("x.txt",), None, None)
    assert read.value == ReadFileArgs("x.txt")
    shell = checked("shell", {"command": "git status"})
    assert (shell.paths, shell.command, shell.host) == ((), "git status", None)
    http = checked("http_get", {"url": "HTTPS://Docs.Python.org:443/3/"})
    assert (http.paths, http.command, http.host) == ((), None, "docs.python.org")
    assert http.destination == Destination("https", "docs.python.org", 443)
    assert checked("http_get", {"url": "http://[0::1]:81/"}).destination == Destination(
        "http", "::1", 81
    )
    assert (read.destination, shell.destination) == (None, None)
    assert checked("list_dir", {"path": "."}).match_paths == ("",)


def test_a_subject_of_200_characters_is_whole_and_a_longer_one_is_cut_at_200() -> None:
    assert checked("shell", {"command": "x" * 200}).subject() == "x" * 200
    assert checked("shell", {"command": "x" * 200 + "y"}).subject() == "x" * 200 + "…"


def test_absolute_path_inside_the_workspace() -> None:
    assert checked("read_file", {"path": "/w/notes/a"}, workspace="/w").paths == ("notes/a",)
    outside = check_arguments("read_file", {"path": "/etc/passwd"}, workspace="/w")
    assert outside == ArgumentProblem(
        Reason.BAD_ARGUMENTS, "argument 'path': absolute path outside the workspace"
    )


@pytest.mark.parametrize(
    ("tool", "arguments", "detail"),
    [
        ("read_file", [], "arguments must be a JSON object"),
        ("read_file", None, "arguments must be a JSON object"),
        ("read_file", {}, "missing argument 'path'"),
        ("read_file", {"path": "a", "mode": "r"}, "unknown argument 'mode'"),
        ("read_file", {"path": 5}, "argument 'path' must be a string"),
        ("read_file", {"path": None}, "argument 'path' must be a string"),
        ("read_file", {"path": ["a"]}, "argument 'path' must be a string"),
        ("read_file", {"path": "../a"}, "argument 'path': '..' leaves the workspace"),
        (
            "read_file",
            {"path": "/etc/passwd"},
            "argument 'path': absolute path outside the workspace",
        ),
        ("read_file", {"path": "a\x00"}, "argument 'path': NUL byte in path"),
        ("read_file", {"path": "a", "max_bytes": "10"}, "argument 'max_bytes' must be an integer"),
        ("read_file", {"path": "a", "max_bytes": True}, "argument 'max_bytes' must be an integer"),
        ("read_file", {"path": "a", "max_bytes": 1.0}, "argument 'max_bytes' must be an integer"),
        ("read_file", {"path": "a", "max_bytes": 0}, "argument 'max_bytes' must be at least 1"),
        (
            "read_file",
            {"path": "a", "max_bytes": MAX_BYTES + 1},
            f"argument 'max_bytes' must be at most {MAX_BYTES}",
        ),
        ("list_dir", {}, "missing argument 'path'"),
        ("write_file", {"path": "a"}, "missing argument 'content'"),
        ("write_file", {"path": "a", "content": 1}, "argument 'content' must be a string"),
        (
            "write_file",
            {"path": "a", "content": "é" * (MAX_BYTES // 2 + 1)},
            "argument 'content' is over 1 MiB",
        ),
        ("shell", {"command": ""}, "argument 'command' must not be empty"),
        ("shell", {"command": "ls\x00"}, "argument 'command' contains a NUL byte"),
        ("shell", {"cmd": "ls"}, "unknown argument 'cmd'"),
        (
            "shell",
            {"command": "x" * (MAX_COMMAND_BYTES + 1)},
            "argument 'command' is longer than 65536 bytes",
        ),
        (
            "shell",
            {"command": "é" * (MAX_COMMAND_BYTES // 2 + 1)},
            "argument 'command' is longer than 65536 bytes",
        ),
        (
            "read_file",
            {"path": "src/" + "test/" * 13000 + "x.py"},
            "argument 'path': the path is longer than 4096 bytes",
        ),
        (
            "write_file",
            {"path": "a" * 256, "content": ""},
            "argument 'path': a segment of the path is longer than 255 bytes",
        ),
        ("list_dir", {"path": "a/" * 2049}, "argument 'path': the path is longer than 4096 bytes"),
        ("http_get", {"url": "ftp://a.org/"}, "argument 'url' must be an http or https URL"),
        ("http_get", {"url": "file:///etc/passwd"}, "argument 'url' must be an http or https URL"),
        ("http_get", {"url": "a.org"}, "argument 'url' must be an http or https URL"),
        ("http_get", {"url": "https:///x"}, "argument 'url' has no host"),
        (
            "http_get",
            {"url": "https://a.org@evil.net/"},
            "argument 'url' must not carry a user or password",
        ),
        (
            "http_get",
            {"url": "https://evil.net\\@a.org/"},
            "argument 'url' must be printable ASCII without spaces or backslashes",
        ),
        (
            "http_get",
            {"url": "https://a.org/ x"},
            "argument 'url' must be printable ASCII without spaces or backslashes",
        ),
        *[
            (
                "http_get",
                {"url": f"https://a.org/{char}"},
                "argument 'url' must be printable ASCII without spaces or backslashes",
            )
            for char in ("\x00", "\x1f", "\x7f", "\x80", "é", "\u202e", "\t")
        ],
        ("http_get", {"url": "https://[::1/"}, "argument 'url' is not a valid URL"),
        ("http_get", {"url": "https://a.org:99999/"}, "argument 'url' is not a valid URL"),
        (
            "http_get",
            {"url": "http://*.example.com/"},
            "argument 'url': the host '*.example.com' is not a host name or IP address: "
            "it has glob characters or escapes",
        ),
        (
            "http_get",
            {"url": "https://Example.COM./x"},
            "argument 'url': the host 'example.com.' is not a host name or IP address: "
            "it ends in a dot",
        ),
        (
            "http_get",
            {"url": "http://[v1.fe]:8080/"},
            "argument 'url': the host 'v1.fe' is not a host name or IP address: "
            "in brackets, it is not an IPv6 address without a zone",
        ),
        (
            "http_get",
            {"url": "http://a..example/"},
            "argument 'url': the host 'a..example' is not a host name or IP address: "
            "a host name is labels of letters, digits, '-' and '_', joined by dots",
        ),
        (
            "http_get",
            {"url": "http://" + "a" * 120 + "*/"},
            f"argument 'url': the host {'a' * 100!r} is not a host name or IP address: "
            "it has glob characters or escapes",
        ),
        (
            "http_get",
            {"url": "http://a.org:0/"},
            "argument 'url' has port 0 (a port is 1 to 65535)",
        ),
    ],
)
def test_bad_arguments_name_the_argument(tool: str, arguments: Any, detail: str) -> None:
    assert bad(tool, arguments) == detail


def test_a_url_of_port_1_or_65535_an_ip_address_or_an_upper_case_host_is_accepted() -> None:
    assert checked("http_get", {"url": "http://a.org:1/"}).destination == Destination(
        "http", "a.org", 1
    )
    assert checked("http_get", {"url": "https://A.Org:65535/"}).destination == Destination(
        "https", "a.org", 65535
    )
    assert checked("http_get", {"url": "http://10.0.0.1/"}).host == "10.0.0.1"
    assert checked("http_get", {"url": "http://[::1]/"}).host == "::1"


def test_a_huge_url_is_refused_by_its_length_first() -> None:
    """A host of 800,000 characters took 0.7 s of brokerd's one thread (the address
    parser and the host-name regex ran on it before its length was looked at). Each host
    here has another fault too (a bad character, a trailing dot): the detail naming the
    length shows that the length was looked at first, before any parser ran."""
    for host in ("a." * 400_000 + "!", "_." * 400_000 + ".", "a." * 400_000):
        detail = bad("http_get", {"url": f"http://{host}/"})
        assert detail.endswith("is not a host name or IP address: it is longer than 253 characters")
    assert checked("http_get", {"url": "http://a.org/" + "x" * (MAX_BYTES - 20)})


def test_content_of_exactly_one_mib_is_accepted() -> None:
    assert checked("write_file", {"path": "a", "content": "x" * MAX_BYTES})


def test_arguments_of_exactly_the_length_limits_are_accepted() -> None:
    assert MAX_COMMAND_BYTES == 64 * 1024
    assert checked("shell", {"command": "x" * MAX_COMMAND_BYTES}).command == "x" * (64 * 1024)
    assert checked("read_file", {"path": "a/" * 2047 + "bc"}).paths == ("a/" * 2047 + "bc",)
    assert checked("list_dir", {"path": "s" * 255}).paths == ("s" * 255,)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=6,
)


@given(
    st.sampled_from([*TOOL_NAMES, "nope"]),
    st.dictionaries(
        st.sampled_from(["path", "max_bytes", "content", "command", "url", "x"]),
        json_values,
        max_size=3,
    )
    | json_values,
)
def test_check_arguments_is_total(tool: str, arguments: Any) -> None:
    result = check_arguments(tool, arguments)
    assert isinstance(result, CheckedArguments | ArgumentProblem)
    if isinstance(result, CheckedArguments):
        orjson.dumps(result.to_json())


def test_result_labels() -> None:
    rules = LabelRules()
    assert result_label(checked("read_file", {"path": ".env"}), rules, None) == Label(
        Taint.SECRET, False
    )
    assert result_label(checked("list_dir", {"path": "notes"}), rules, None) == Label(
        Taint.INTERNAL, False
    )
    assert result_label(checked("list_dir", {"path": "secrets"}), rules, None) == Label(
        Taint.SECRET, False
    )
    assert result_label(checked("write_file", {"path": ".env", "content": ""}), rules, None) == (
        Label(Taint.PUBLIC, False)
    )
    assert result_label(checked("shell", {"command": "ls"}), rules, None) == Label(
        Taint.INTERNAL, False
    )
    assert result_label(checked("shell", {"command": "ls"}), rules, Taint.SECRET) == Label(
        Taint.SECRET, False
    )
    assert result_label(checked("http_get", {"url": "http://a.org"}), rules, None) == (
        HTTP_GET_LABEL
    )
