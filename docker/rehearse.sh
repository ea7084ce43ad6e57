#!/usr/bin/env bash
# Rehearse the image's `cpu` target without a container engine: install exactly the folders the
# Dockerfile COPYs into a fresh virtualenv (as its build stages do), `switchyard models install`, start
# `switchyard serve` from that virtualenv in an empty home directory, and ask it one `auto`
# question. Catches a package folder missing from the COPY lines, a dependency the wheel does not
# declare, or a default that needs the repository. Needs Python 3.11 and the package index; about
# 3 minutes and 2 GB in a temporary directory (kept on failure, removed on success).
#
#   bash docker/rehearse.sh            # from the repository root
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d -t switchyard-rehearse-XXXX)
port=${PORT:-18080}
python=${PYTHON:-python3.11}
command -v "$python" >/dev/null || python=python3

# The build stage's COPY lines (`COPY <src> ./<dest>`), not the runtime stages' `COPY --from`.
mkdir -p "$work/src"
grep -E '^COPY [^-]' "$root/docker/Dockerfile" | while read -r _ sources; do
    for source in ${sources% *}; do cp -a "$root/$source" "$work/src/"; done
done
find "$work/src" -name __pycache__ -prune -exec rm -rf {} +

echo "installing the image's virtualenv in $work/venv ..."
"$python" -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet --disable-pip-version-check "$work/src"
"$work/venv/bin/switchyard" models install --quiet  # as the Dockerfile's build-cpu stage does

mkdir -p "$work/home"
cd "$work/home"
HOME="$work/home" SWITCHYARD__SERVER__PORT=$port "$work/venv/bin/switchyard" serve >"$work/serve.log" 2>&1 &
server=$!
trap 'kill -INT $server 2>/dev/null || true; wait $server 2>/dev/null || true' EXIT

for _ in $(seq 1 180); do
    curl -sf "http://127.0.0.1:$port/health/ready" >/dev/null && break
    kill -0 $server 2>/dev/null || { echo "switchyard exited; its log: $work/serve.log" >&2; exit 1; }
    sleep 1
done
answer=$(curl -sf "http://127.0.0.1:$port/v1/chat/completions" -H 'content-type: application/json' \
    -d '{"model": "auto", "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8}') || {
    echo "no answer; the server's log: $work/serve.log" >&2
    exit 1
}
echo "$answer" | "$work/venv/bin/python" -c 'import json, sys; a = json.load(sys.stdin); print("answered by", a["model"] + ":", repr(a["choices"][0]["message"]["content"]))'
kill -INT $server
wait $server || true
trap - EXIT
rm -rf "$work"
echo "rehearsal passed"
