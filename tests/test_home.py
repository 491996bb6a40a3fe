"""The home and config.toml (docs/runbook.md#config): paths, modes, defaults, errors."""

from __future__ import annotations

import os
import re
import stat
import tomllib
from pathlib import Path

import attrs
import pytest

from boxmaker.core.labels import LabelRules
from boxmaker.home.config import (
    BrokerConfig,
    Config,
    ConfigError,
    EgressConfig,
    LoopConfig,
    ModelConfig,
    ProxyConfig,
    RunnerConfig,
    load_config,
    parse_config,
)
from boxmaker.home.defaults import DEFAULT_GRANTS_TEXT, default_config_text, initial_config_text
from boxmaker.home.paths import Home, HomeError, resolve_home


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.fixture
def home(tmp_path: Path) -> Home:
    return Home(tmp_path / "home")


def test_paths(home: Home) -> None:
    root = home.root
    assert home.config_toml == root / "config.toml"
    assert home.grants_toml == root / "grants.toml"
    assert home.run_dir == root / "run"
    assert home.broker_sock == root / "run" / "broker.sock"
    assert home.admin_sock == root / "run" / "admin.sock"
    assert home.loop_sock == root / "run" / "loop.sock"
    assert home.infer_sock == root / "run" / "infer.sock"
    assert home.audit_log == root / "ledger" / "audit.jsonl"
    assert home.sessions_dir == root / "state" / "sessions"
    assert home.conversations_dir == root / "state" / "conversations"
    assert home.logs_dir == root / "logs"
    assert home.default_workspace == root / "workspace"
    assert home.session_state("s-0123456789ab") == root / "state/sessions/s-0123456789ab.json"
    assert home.conversation("s-0123456789ab") == root / "state/conversations/s-0123456789ab.jsonl"
    assert home.pid_file("brokerd") == root / "run" / "brokerd.pid"
    assert home.log_file("loopd") == root / "logs" / "loopd.log"


@pytest.mark.parametrize("bad", ["../../etc/passwd", "s-0123456789AB", "s-0123456789ab/x", ""])
def test_session_paths_refuse_anything_but_an_id(home: Home, bad: str) -> None:
    with pytest.raises(ValueError, match="session id"):
        home.session_state(bad)
    with pytest.raises(ValueError, match="session id"):
        home.conversation(bad)


def test_program_names_are_plain(home: Home) -> None:
    with pytest.raises(ValueError, match="program"):
        home.pid_file("../x")


def test_resolve_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("BOXMAKER_HOME", raising=False)
    assert resolve_home(None).root == tmp_path / ".local/state/boxmaker"
    monkeypatch.setenv("BOXMAKER_HOME", str(tmp_path / "env"))
    assert resolve_home(None).root == tmp_path / "env"
    assert resolve_home(str(tmp_path / "arg")).root == tmp_path / "arg"
    assert resolve_home("~/x").root == tmp_path / "x"
    monkeypatch.chdir(tmp_path)
    assert resolve_home("rel").root == tmp_path / "rel"


def test_create_makes_every_directory_0700(home: Home) -> None:
    old = os.umask(0o022)
    try:
        home.create()
    finally:
        os.umask(old)
    for directory in home.directories:
        assert directory.is_dir()
        assert mode(directory) == 0o700
    assert set(home.directories) >= {
        home.root,
        home.run_dir,
        home.ledger_dir,
        home.sessions_dir,
        home.conversations_dir,
        home.logs_dir,
        home.default_workspace,
    }


def test_create_tightens_and_is_idempotent(home: Home) -> None:
    home.create()
    home.run_dir.chmod(0o755)
    home.root.chmod(0o777)
    home.sessions_dir.chmod(0o500)
    home.create()
    assert mode(home.root) == mode(home.run_dir) == mode(home.sessions_dir) == 0o700


def test_a_umask_cannot_loosen_or_break_it(home: Home) -> None:
    old = os.umask(0o777)
    try:
        home.create()
    finally:
        os.umask(old)
    assert all(mode(directory) == 0o700 for directory in home.directories)


def test_ensure_run_dir(home: Home) -> None:
    assert home.ensure_run_dir() == home.run_dir
    assert mode(home.root) == mode(home.run_dir) == 0o700
    home.run_dir.chmod(0o711)
    home.ensure_run_dir()
    assert mode(home.run_dir) == 0o700


def test_run_dir_that_is_a_symlink_or_file_is_refused(home: Home, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    home.root.mkdir()
    home.run_dir.symlink_to(elsewhere)
    with pytest.raises(HomeError, match=r"run: a symlink"):
        home.ensure_run_dir()
    home.run_dir.unlink()
    home.run_dir.write_text("")
    with pytest.raises(HomeError, match=r"run: not a directory"):
        home.ensure_run_dir()


def test_the_root_may_be_a_symlink(home: Home, tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o755)
    home.root.symlink_to(real)
    home.create()
    assert mode(real) == 0o700


@pytest.mark.skipif(os.getuid() != 0, reason="chown to another uid needs root")
def test_a_run_dir_owned_by_another_user_is_refused(home: Home) -> None:
    home.create()
    os.chown(home.run_dir, 12345, 12345)
    with pytest.raises(HomeError, match=r"run: owned by uid 12345, not by you"):
        home.ensure_run_dir()
    with pytest.raises(HomeError, match="owned by uid 12345"):
        home.create()


def test_another_owner_is_refused_without_root(home: Home) -> None:
    home.create()
    with pytest.raises(HomeError, match=r"owned by uid \d+, not by you \(uid 54321\)"):
        home.ensure_run_dir(uid=54321)


def test_write_defaults_writes_0600_once(home: Home) -> None:
    home.create()
    assert home.write_defaults() == [home.config_toml, home.grants_toml]
    assert mode(home.config_toml) == mode(home.grants_toml) == 0o600
    # The defaults, with the one key the built-in model needs set (README.md).
    assert home.config_toml.read_text() == initial_config_text()
    assert initial_config_text() == default_config_text().replace(
        '# first_step = "auto"', 'first_step = "named"'
    )
    assert load_config(home).loop.first_step == "named"
    assert home.grants_toml.read_text() == DEFAULT_GRANTS_TEXT
    home.config_toml.write_text("# mine\n")
    assert home.write_defaults() == []
    assert home.config_toml.read_text() == "# mine\n"


# ---------------------------------------------------------------------------------------
# config.toml


def test_a_missing_file_is_all_defaults(home: Home) -> None:
    config = load_config(home)
    assert config == Config.defaults(home)
    assert config.workspace == home.root / "workspace"
    assert config.model == ModelConfig(url=None, name="default", max_tokens=1024)
    assert config.broker == BrokerConfig(pending_timeout=300.0)
    assert config.loop == LoopConfig(max_steps=16, reply_timeout=10.0, first_step="auto")
    assert config.proxy == ProxyConfig(tcp_port=0, token_file=None)
    assert config.labels == LabelRules(
        secret=("**/.env", "**/*.pem", "secrets/**"), untrusted=("downloads/**",)
    )
    assert config.runner == RunnerConfig(shell_timeout=30.0, output_cap=65536)
    assert config.runner == RunnerConfig(
        sandbox_uid=None,
        memory_limit_mib=1024,
        process_limit=256,
        file_size_limit_mib=1024,
        cpu_time_limit=None,
    )
    assert config.egress == EgressConfig(
        tunnels_per_call=16, bytes_per_call=4 << 30, idle_timeout_s=120.0
    )


def test_the_default_text_is_all_comments_and_says_the_defaults(home: Home) -> None:
    text = default_config_text()
    assert parse_config(text, home) == Config.defaults(home)
    uncommented = re.sub(r"(?m)^# (\w+ = )", r"\1", text)
    assert tomllib.loads(uncommented)["broker"]["pending_timeout"] == 300.0
    config = parse_config(uncommented, home)
    # The keys without a default value in TOML show an example instead.
    expected = attrs_evolve_model_url(Config.defaults(home), "http://127.0.0.1:8080")
    expected = attrs_evolve_token_file(expected, "proxy.token")
    notify = ("notify-send", "boxmaker", "a call waits: bxctl approvals")
    assert config == attrs.evolve(expected, notify=attrs.evolve(expected.notify, command=notify))


def test_a_notify_command_is_an_argv_with_an_absolute_or_bare_program(home: Home) -> None:
    config = parse_config('[notify]\ncommand = ["notify-send", "boxmaker"]\n', home)
    assert config.notify.command == ("notify-send", "boxmaker")
    for bad, problem in [
        ('"notify-send boxmaker"', "expected a list"),
        ('["./notify.sh"]', "the program is an absolute path or a bare name"),
        ('["notify-send", ""]', "expected a list of non-empty strings (argv)"),
    ]:
        with pytest.raises(ConfigError) as raised:
            parse_config(f"[notify]\ncommand = {bad}\n", home)
        assert str(raised.value) == f"config.toml: [notify] command: {problem}"


def attrs_evolve_model_url(config: Config, url: str) -> Config:
    import attrs

    return attrs.evolve(config, model=attrs.evolve(config.model, url=url))


def attrs_evolve_token_file(config: Config, token_file: str) -> Config:
    import attrs

    return attrs.evolve(config, proxy=attrs.evolve(config.proxy, token_file=token_file))


def test_every_key_is_read(home: Home, tmp_path: Path) -> None:
    home.create()
    home.config_toml.write_text(
        f"""
workspace = "{tmp_path / "work"}"
[model]
url = "http://127.0.0.1:9999"
name = "m"
max_tokens = 64
[broker]
pending_timeout = 2
[loop]
max_steps = 3
reply_timeout = 0.5
first_step = "tool"
[proxy]
tcp_port = 8081
token_file = "secret/proxy.token"
[labels]
secret = ["keys/**"]
untrusted = []
[runner]
shell_timeout = 1.5
output_cap = 100
sandbox_uid = 1000
memory_limit_mib = 512
process_limit = 64
file_size_limit_mib = 8
cpu_time_limit = 5
"""
    )
    config = load_config(home)
    assert config.workspace == tmp_path / "work"
    assert config.model == ModelConfig(url="http://127.0.0.1:9999", name="m", max_tokens=64)
    assert config.broker == BrokerConfig(pending_timeout=2.0)
    assert isinstance(config.broker.pending_timeout, float)
    assert config.loop == LoopConfig(max_steps=3, reply_timeout=0.5, first_step="tool")
    assert config.proxy == ProxyConfig(tcp_port=8081, token_file="secret/proxy.token")
    assert config.labels == LabelRules(secret=("keys/**",), untrusted=())
    assert config.runner == RunnerConfig(
        shell_timeout=1.5,
        output_cap=100,
        sandbox_uid=1000,
        memory_limit_mib=512,
        process_limit=64,
        file_size_limit_mib=8,
        cpu_time_limit=5,
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("workspace = 'workspace/sub'", "workspace/sub"),
        ("workspace = '~/agent'", "~/agent"),
        ("workspace = '/abs/w'", "/abs/w"),
    ],
)
def test_workspace_forms(
    home: Home, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, text: str, expected: str
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    want = Path(expected).expanduser()
    want = want if want.is_absolute() else home.root / want
    assert parse_config(text, home).workspace == want


@pytest.mark.parametrize(
    "workspace", [".", "..", "/", "ledger", "run/../state", "workspace/../grants.toml"]
)
def test_a_workspace_that_exposes_the_home_is_refused(home: Home, workspace: str) -> None:
    with pytest.raises(ConfigError, match=r"^config\.toml: workspace: "):
        parse_config(f"workspace = {workspace!r}", home)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[broker]\npending_timeout = 'soon'", "[broker] pending_timeout: expected a number"),
        ("[broker]\npending_timeout = true", "[broker] pending_timeout: expected a number"),
        ("[broker]\npending_timeout = nan", "[broker] pending_timeout: expected a finite"),
        ("[broker]\npending_timeout = 0", "[broker] pending_timeout: expected a number above 0"),
        ("[broker]\nloopd_uid = 1000", "[broker] loopd_uid: no longer supported: loopd runs"),
        ("[broker]\nloopd_uid = -1", "see docs/runbook.md#loopd-uid)"),
        ("[proxy]\ntoken_file = 5", "[proxy] token_file: expected a string"),
        ("[broker]\npending = 1", "[broker] pending: unknown key"),
        ("[model]\nmax_tokens = '5'", "[model] max_tokens: expected an integer"),
        ("[model]\nmax_tokens = 0", "[model] max_tokens: expected at least 1"),
        ("[model]\nurl = 8080", "[model] url: expected a string"),
        (
            "[loop]\nfirst_step = 'always'",
            '[loop] first_step: expected "auto" or "tool" or "named"',
        ),
        ("[loop]\nmax_steps = 0", "[loop] max_steps: expected at least 1"),
        ("[proxy]\ntcp_port = 70000", "[proxy] tcp_port: expected a port"),
        ("[runner]\noutput_cap = 'big'", "[runner] output_cap: expected an integer"),
        # The sandbox never runs as host root (docs/runbook.md#sandbox-as-root).
        ("[runner]\nsandbox_uid = 0", "[runner] sandbox_uid: expected at least 1"),
        ("[runner]\nsandbox_uid = 'nobody'", "[runner] sandbox_uid: expected an integer"),
        ("[runner]\nmemory_limit_mib = 0", "[runner] memory_limit_mib: expected at least 1"),
        ("[runner]\nprocess_limit = 0", "[runner] process_limit: expected at least 1"),
        ("[runner]\nfile_size_limit_mib = -1", "[runner] file_size_limit_mib: expected at least 1"),
        ("[runner]\ncpu_time_limit = 0", "[runner] cpu_time_limit: expected at least 1"),
        ("[runner]\ncpu_time_limit = 1.5", "[runner] cpu_time_limit: expected an integer"),
        ("[egress]\ntunnels_per_call = 0", "[egress] tunnels_per_call: expected at least 1"),
        ("[egress]\nbytes_per_call = 0", "[egress] bytes_per_call: expected at least 1"),
        ("[egress]\nidle_timeout_s = 0", "[egress] idle_timeout_s: expected a number above 0"),
        ("[egress]\ntunnels = 4", "[egress] tunnels: unknown key"),
        ("[labels]\nsecret = 'x'", "[labels] secret"),
        ("[labels]\nsecret = ['ok', 5]", "[labels] secret[1]: expected a string"),
        # core.labels words its own glob problems; the table is named either way.
        ("[labels]\nsecret = ['']", "labels"),
        ("[labels]\nsecrets = []", "[labels] secrets: unknown key"),
        ("[extra]\na = 1", "extra: unknown key"),
        ("workspace = 5", "workspace: expected a non-empty string"),
        ("workspace = ''", "workspace: expected a non-empty string"),
        ("broker = 5", "broker: expected an object"),
        ("model = [1]", "model: expected an object"),
    ],
)
def test_errors_name_the_file_and_the_key(home: Home, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(text, home)
    assert str(raised.value).startswith("config.toml: ")
    assert message in str(raised.value)


def test_every_problem_is_reported(home: Home) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config("[broker]\npending_timeout = 'x'\nfoo = 1\n[loop]\nmax_steps = 'y'", home)
    assert raised.value.problems == (
        "config.toml: [broker] pending_timeout: expected a number",
        "config.toml: [broker] foo: unknown key",
        "config.toml: [loop] max_steps: expected an integer",
    )


def test_toml_syntax_errors_name_the_file(home: Home) -> None:
    with pytest.raises(ConfigError, match=r"^config\.toml: TOML syntax: .*line 2"):
        parse_config("[broker]\npending_timeout = = 3\n", home)


def test_load_config_errors(home: Home) -> None:
    home.create()
    home.config_toml.write_bytes(b"name = '\xff'\n")
    with pytest.raises(ConfigError, match=r"^config\.toml: not UTF-8"):
        load_config(home)
    home.config_toml.unlink()
    home.config_toml.mkdir()
    with pytest.raises(ConfigError, match=r"^config\.toml: not a regular file \(a directory\)$"):
        load_config(home)
