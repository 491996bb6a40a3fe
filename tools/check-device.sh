#!/usr/bin/env bash
# The device check: boxmaker against a real llama-server.
#
#   BOXMAKER_MODEL_URL=http://127.0.0.1:8080 [BOXMAKER_MODEL_NAME=default] tools/check-device.sh
#
# It reads GET /slots first and stops unless slot 0 is idle ("is_processing": false);
# then, on a temporary home, starts brokerd, inferproxy and loopd (bxctl up) with one
# ask grant for read_file, runs `bxctl chat --say`, waits for the approval in
# `bxctl approvals`, checks the block names the grant and the call, approves, and checks
# that `bxctl audit verify` passes with decision, approval and result records.
# Everything it started is stopped again. Exit 0: passed; 1: a check failed.
# PYTHON picks the interpreter boxmaker is installed in (default: python3).
set -euo pipefail

url="${BOXMAKER_MODEL_URL:?set BOXMAKER_MODEL_URL to the llama-server URL}"
name="${BOXMAKER_MODEL_NAME:-default}"
python="${PYTHON:-python3}"
bxctl() { "$python" -m boxmaker.cli.app "$@" --home "$home"; }
fail() { echo "device check: FAILED: $*" >&2; exit 1; }

"$python" - "$url" <<'EOF' || exit 1
import json, sys, urllib.request
url = sys.argv[1].rstrip("/") + "/slots"
try:
    with urllib.request.urlopen(url, timeout=10) as response:
        slots = json.load(response)
except Exception as exc:
    sys.exit(f"device check: FAILED: GET {url}: {exc}")
slot = next((s for s in slots if isinstance(s, dict) and s.get("id") == 0), None)
if slot is None or slot.get("is_processing") is not False:
    sys.exit(f"device check: FAILED: slot 0 is not idle: {json.dumps(slot)[:300]}")
print("slot 0 is idle")
EOF

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
cat >"$home/config.toml" <<EOF
[model]
url = "$url"
name = "$name"

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
