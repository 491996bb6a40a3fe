#!/usr/bin/env bash
# The device check: boxmaker against a real llama-server.
#
#   [BOXMAKER_MODEL_URL=http://127.0.0.1:8080 [BOXMAKER_MODEL_NAME=default]] tools/check-device.sh
#
# With BOXMAKER_MODEL_URL, it reads that server's GET /slots first and stops unless slot 0
# is idle ("is_processing": false); without it, it checks the built-in model (llama.cpp's
# own server from the xllamacpp wheel: its real /slots, its real tool-call parsing),
# which `bxctl up` starts, and reads its /slots once it is up. Then, on a temporary home, it runs brokerd, inferproxy and loopd
# (bxctl up) with one ask grant for read_file, runs `bxctl chat --say`, waits for the
# approval in `bxctl approvals`, checks the block names the grant and the call,
# approves, and checks that `bxctl audit verify` passes with decision, approval and
# result records. Everything it started is stopped again. Exit 0: passed; 1: a check
# failed. PYTHON picks the interpreter boxmaker is installed in (default: python3);
# `nox -s device` runs it so.
set -euo pipefail

url="${BOXMAKER_MODEL_URL:-}"
name="${BOXMAKER_MODEL_NAME:-default}"
python="${PYTHON:-python3}"
bxctl() { "$python" -m boxmaker.cli.app "$@" --home "$home"; }
fail() { echo "device check: FAILED: $*" >&2; exit 1; }

# Slot 0 of the server at $1 (http(s)://… or unix:///path.sock) must be idle.
check_slot() {
    "$python" - "$1" <<'EOF'
import http.client, json, socket, sys, urllib.request
url = sys.argv[1].rstrip("/")

class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost", timeout=10)
        self.unix_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(self.unix_path)

try:
    if url.startswith("unix://"):
        connection = UnixConnection(url[len("unix://"):])
        connection.request("GET", "/slots")
        slots = json.load(connection.getresponse())
    else:
        with urllib.request.urlopen(url + "/slots", timeout=10) as response:
            slots = json.load(response)
except Exception as exc:
    sys.exit(f"device check: FAILED: GET {url}/slots: {exc}")
slot = next((s for s in slots if isinstance(s, dict) and s.get("id") == 0), None)
if slot is None or slot.get("is_processing") is not False:
    sys.exit(f"device check: FAILED: slot 0 is not idle: {json.dumps(slot)[:300]}")
print("slot 0 is idle")
EOF
}

if [ -n "$url" ]; then
    check_slot "$url" || exit 1
fi

home="$(mktemp -d /tmp/bx-check-XXXXXX)"
chat_pid=""
cleanup() {
    set +e  # every step of the cleanup runs, whatever failed before
    [ -n "$chat_pid" ] && kill "$chat_pid" 2>/dev/null
    bxctl down >/dev/null 2>&1
    rm -rf "$home"
}
trap cleanup EXIT

bxctl init >/dev/null
if [ -n "$url" ]; then
    model_table="$(printf '[model]\nurl = "%s"\nname = "%s"\n' "$url" "$name")"
else
    model_table="# No [model] url: the built-in model."
fi
cat >"$home/config.toml" <<EOF
$model_table

[loop]
first_step = "tool"
max_steps = 4
EOF
cat >"$home/grants.toml" <<'EOF'
[[grant]]
id = "check-read"
tool = "read_file"
mode = "ask"
paths = ["notes.txt"]
note = "the device check"
EOF
echo "Buy milk." >"$home/workspace/notes.txt"

bxctl up
if [ -z "$url" ]; then
    url="$(cat "$home/run/model.url")"
    echo "the built-in model: $url"
    check_slot "$url" || exit 1
fi
bxctl chat --say 'Read the file at path "notes.txt" and tell me what it says.' --json \
    >"$home/chat.jsonl" 2>"$home/chat.err" &
chat_pid=$!

approval=""
for _ in $(seq 1 600); do
    approval="$(bxctl approvals --json | "$python" -c \
        'import json, sys; e = json.load(sys.stdin); print(e[0]["approval"] if e else "")')"
    [ -n "$approval" ] && break
    kill -0 "$chat_pid" 2>/dev/null || fail "the turn ended without asking: $(cat "$home/chat.jsonl" "$home/chat.err")"
    sleep 0.1
done
[ -n "$approval" ] || fail "no approval appeared within 60 s"

block="$(bxctl approvals)"
call="$(bxctl approvals --json | "$python" -c 'import json, sys; print(json.load(sys.stdin)[0]["call"])')"
grep -q "grant      check-read (mode ask)" <<<"$block" || fail "the block does not name the grant: $block"
grep -q "call       $call" <<<"$block" || fail "the block does not name the call: $block"
echo "$block"

bxctl approve "$approval"
wait "$chat_pid" || fail "bxctl chat failed: $(cat "$home/chat.err")"
chat_pid=""

bxctl audit verify || fail "the ledger does not verify"
kinds="$(bxctl audit show --call "$call" --json | "$python" -c \
    'import json, sys; print(" ".join(json.loads(line)["kind"] for line in sys.stdin))')"
[ "$kinds" = "decision approval result" ] || fail "the call's records are: $kinds"
echo "device check: passed (call $call: $kinds)"
