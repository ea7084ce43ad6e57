#!/usr/bin/env bash
# `make image-test`: build docker/Dockerfile's `cpu` and `proxy` targets with podman, start the `cpu`
# image's entrypoint as the image's own user, and check an `auto` answer, a stream and /metrics from
# outside. Exits 0 only after an answer came from the process running inside the image.
#
# Made for a machine without a registry for base images and without `podman run` (docs/deploy.md):
#   - the base: PYTHON_IMAGE, or else localhost/python:3.11-bookworm, made once with debootstrap from
#     Debian's packages (python3.11 and venv) and this machine's CA bundle (its TLS proxy's included);
#   - CPU torch: TORCH_INDEX, or else a local index of the torch CPU wheel pip finds on this machine,
#     served on 127.0.0.1 for the build, or else the Dockerfile's default (download.pytorch.org);
#   - storage: podman's `vfs` driver; RUN steps with `--isolation chroot` on the host's network;
#   - the run: `buildah from` + `buildah run --isolation chroot --user <the image's USER>`.
# A step this machine cannot take (no podman, buildah or debootstrap) is named; the script then
# exits 77 ("skipped"), or 1 under CI=true.
set -euo pipefail
cd "$(dirname "$0")/.."

STORAGE=(--storage-driver vfs)
BASE="${PYTHON_IMAGE:-localhost/python:3.11-bookworm}"
TAG_CPU=localhost/switchyard:cpu
TAG_PROXY=localhost/switchyard:proxy
WORK="${IMAGE_TEST_DIR:-$PWD/.image-test}"
PY="${PYTHON:-python3}"
started=$(date +%s)

say() { printf 'image-test: %s\n' "$*" >&2; }
elapsed() { echo "$(($(date +%s) - $1)) s"; }
cannot() {
    say "cannot run here: $*"
    if [ "${CI:-}" = "true" ]; then exit 1; fi
    say "skipped (exit 77); under CI=true this fails"
    exit 77
}

missing=()
for tool in podman buildah; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
[ "${#missing[@]}" -eq 0 ] || cannot "${missing[*]} not installed (apt-get install podman buildah debootstrap)"
mkdir -p "$WORK"

# -- the base image ---------------------------------------------------------------------------------
if ! podman "${STORAGE[@]}" image exists "$BASE"; then
    [ "$BASE" = localhost/python:3.11-bookworm ] || cannot "PYTHON_IMAGE=$BASE is not in podman's vfs storage"
    command -v debootstrap >/dev/null 2>&1 || cannot "debootstrap not installed, and no $BASE to reuse"
    t=$(date +%s)
    say "making $BASE with debootstrap (Debian bookworm, python3.11) …"
    rootfs="$WORK/rootfs"
    rm -rf "$rootfs"
    debootstrap --variant=minbase \
        --include=python3.11,python3.11-venv,python3-distutils,python3-lib2to3,python3-pip-whl,python3-setuptools-whl,python-is-python3,ca-certificates \
        bookworm "$rootfs" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$WORK/debootstrap.log" 2>&1 \
        || { tail -5 "$WORK/debootstrap.log" >&2; cannot "debootstrap failed (log: $WORK/debootstrap.log)"; }
    # This machine's trust store, so that pip in the build trusts what this machine trusts.
    cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs/debootstrap"
    tar -C "$rootfs" -c . | podman "${STORAGE[@]}" import \
        --change "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
        --change "ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt" - "$BASE" >/dev/null
    rm -rf "$rootfs"
    say "base made in $(elapsed "$t")"
else
    say "reusing $BASE"
fi

# -- CPU torch for the build ------------------------------------------------------------------------
server_pid=""
container=""
cleanup() {
    [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null || true
    [ -n "$container" ] && buildah "${STORAGE[@]}" rm "$container" >/dev/null 2>&1 || true
    [ -n "${index_pid:-}" ] && kill "$index_pid" 2>/dev/null || true
}
trap cleanup EXIT

free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

build_args=(--build-arg "PYTHON_IMAGE=$BASE")
if [ -n "${TORCH_INDEX:-}" ]; then
    build_args+=(--build-arg "TORCH_INDEX=$TORCH_INDEX")
else
    torch_version=$(grep -o '"torch==[^"]*"' pyproject.toml | tr -d '"' | cut -d= -f3)
    wheels="$WORK/index"
    rm -rf "$wheels" && mkdir -p "$wheels/simple/torch"
    # pip's find-links folders (this machine keeps its CPU torch there): never a download.
    links="${PIP_FIND_LINKS:-} $("$PY" -m pip config get global.find-links 2>/dev/null || true)"
    found=""
    for folder in $links; do
        folder="${folder#file://}"
        for file in "$folder"/torch-"$torch_version"+cpu-cp311-cp311-*x86_64.whl; do
            [ -f "$file" ] && found="$file" && break 2
        done
    done
    if [ -n "$found" ]; then
        cp "$found" "$wheels/"
        wheel=$(basename "$found")
        printf '<html><body><a href="../../%s">%s</a></body></html>\n' "${wheel//+/%2B}" "$wheel" \
            >"$wheels/simple/torch/index.html"
        port=$(free_port)
        "$PY" -m http.server "$port" --bind 127.0.0.1 --directory "$wheels" >"$WORK/index.log" 2>&1 &
        index_pid=$!
        build_args+=(--build-arg "TORCH_INDEX=http://127.0.0.1:$port/simple")
        say "CPU torch from this machine: $wheel, served on 127.0.0.1:$port"
    else
        say "no CPU torch wheel on this machine: the Dockerfile's default index"
    fi
fi

# -- disk -------------------------------------------------------------------------------------------
# The vfs driver stores every layer as a full copy of the filesystem. Builds run with --layers=false
# (one committed image per target, no cached intermediate layer), and the images these tags pointed
# at before are removed once the new ones are built, so runs do not pile up gigabytes.
graphroot=$(podman "${STORAGE[@]}" info --format '{{.Store.GraphRoot}}')
need_gb="${IMAGE_TEST_NEED_GB:-16}"
free_gb=$(($(df --output=avail -k "$graphroot" | tail -1) / 1048576))
if [ "$free_gb" -lt "$need_gb" ]; then
    say "not enough disk for the builds: $free_gb GB free where podman stores images ($graphroot), $need_gb GB needed"
    say "podman --storage-driver vfs images lists what is stored there; podman --storage-driver vfs image prune removes unused images"
    exit 1
fi
say "$free_gb GB free in $graphroot"
previous=()
for tag in "$TAG_CPU" "$TAG_PROXY"; do
    id=$(podman "${STORAGE[@]}" image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
    [ -n "$id" ] && previous+=("$id")
done

# -- build ------------------------------------------------------------------------------------------
for target in cpu proxy; do
    t=$(date +%s)
    say "building target $target …"
    podman "${STORAGE[@]}" build --isolation chroot --format docker --layers=false -f docker/Dockerfile --target "$target" \
        "${build_args[@]}" -t "localhost/switchyard:$target" . >"$WORK/build-$target.log" 2>&1 \
        || { tail -30 "$WORK/build-$target.log" >&2; say "build of $target failed (log: $WORK/build-$target.log)"; exit 1; }
    size=$(podman "${STORAGE[@]}" image inspect --format '{{.Size}}' "localhost/switchyard:$target")
    say "built localhost/switchyard:$target in $(elapsed "$t"): $((size / 1000000)) MB"
done

# The images the tags pointed at before this run: no longer named, so removed (unless a container uses one).
for id in "${previous[@]}"; do
    for tag in "$TAG_CPU" "$TAG_PROXY"; do
        [ "$(podman "${STORAGE[@]}" image inspect --format '{{.Id}}' "$tag")" = "$id" ] && continue 2
    done
    podman "${STORAGE[@]}" rmi "$id" >/dev/null 2>&1 && say "removed the previous image ${id:0:12}" || true
done

# -- run the cpu image's entrypoint as its user -----------------------------------------------------
entrypoint=$(podman "${STORAGE[@]}" image inspect --format '{{join .Config.Entrypoint " "}}' "$TAG_CPU")
user=$(podman "${STORAGE[@]}" image inspect --format '{{.Config.User}}' "$TAG_CPU")
[ -n "$entrypoint" ] && [ -n "$user" ] || { say "$TAG_CPU has no ENTRYPOINT or USER"; exit 1; }
port=$(free_port)
container=$(buildah "${STORAGE[@]}" from "$TAG_CPU")
buildah "${STORAGE[@]}" config --env "SWITCHYARD__SERVER__PORT=$port" "$container"
t=$(date +%s)
say "starting '$entrypoint' as $user inside $TAG_CPU on 127.0.0.1:$port …"
# shellcheck disable=SC2086  # the entrypoint is words
buildah "${STORAGE[@]}" run --isolation chroot --network host --user "$user" "$container" -- $entrypoint \
    >"$WORK/serve.log" 2>&1 &
server_pid=$!
"$PY" docker/image_check.py --url "http://127.0.0.1:$port" --pid "$server_pid" --log "$WORK/serve.log" \
    --image "$TAG_CPU" --user "$user"
say "answered from inside the image $(elapsed "$t") after its start; whole run $(elapsed "$started")"
