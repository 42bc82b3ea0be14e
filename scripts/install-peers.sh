#!/usr/bin/env bash
# Builds today's peers and callers from their Go modules, pinned, into target/peers/: the
# programs our tests and benchmarks compare against or are driven by. Nothing of theirs is
# committed; their sources come from the Go module registry into Go's module cache, and once
# built they are reused offline.
#
#   scripts/install-peers.sh [GROUP ...]      default: every group
#   scripts/install-peers.sh --print-dir GROUP   the directory GROUP's binaries are in
#
# Groups (pinned here, and nowhere else):
#   plugins   containernetworking/plugins v1.10.0: bridge host-local loopback portmap
#             bandwidth firewall tuning ptp   -> target/peers/plugins-v1.10.0/
#   cnitool   containernetworking/cni v1.3.1's cnitool (libcni 1.3.1; the same tree as the cni
#             repository's main branch in November 2026)   -> target/peers/cnitool-v1.3.1/
#   crio-driver  our replay of CRI-O's CNI call sequence on libcni v1.3.1 (tests/go/crio-driver,
#             its go.mod pins the library; CRI-O itself is not served by the registry)
#                                                          -> target/peers/crio-driver/
#
# Idempotent: a group whose binaries and stamp (the pinned list it was built from) are present
# is not rebuilt. Safe to run concurrently (nextest runs one process per test, and each test that
# needs a peer may call this): one build at a time, under target/peers.lock, with a deadline.
# A missing Go toolchain or an unreachable registry fails the run with one line saying which:
# no test falls back to Debian's 1.1.1 silently.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PEERS="$ROOT/target/peers"

PLUGINS_VERSION=v1.10.0
PLUGINS_MODULE=github.com/containernetworking/plugins
# name -> package path inside the module
PLUGINS=(
    bridge:plugins/main/bridge
    host-local:plugins/ipam/host-local
    loopback:plugins/main/loopback
    ptp:plugins/main/ptp
    portmap:plugins/meta/portmap
    bandwidth:plugins/meta/bandwidth
    firewall:plugins/meta/firewall
    tuning:plugins/meta/tuning
)

CNITOOL_VERSION=v1.3.1
CNITOOL_MODULE=github.com/containernetworking/cni
CRIO_DRIVER_SRC="$ROOT/tests/go/crio-driver"
ALL_GROUPS=(plugins cnitool crio-driver)

log() { printf 'install-peers: %s\n' "$*" >&2; }
die() {
    log "$*"
    exit 1
}

group_dir() {
    case "$1" in
    plugins) echo "$PEERS/plugins-$PLUGINS_VERSION" ;;
    cnitool) echo "$PEERS/cnitool-$CNITOOL_VERSION" ;;
    crio-driver) echo "$PEERS/crio-driver" ;;
    *) die "unknown group '$1' (known: ${ALL_GROUPS[*]})" ;;
    esac
}

# The pinned list a group is built from: the stamp that says its build is current.
group_spec() {
    case "$1" in
    plugins) printf '%s@%s %s\n' "$PLUGINS_MODULE" "$PLUGINS_VERSION" "${PLUGINS[*]}" ;;
    cnitool) printf '%s/cnitool@%s\n' "$CNITOOL_MODULE" "$CNITOOL_VERSION" ;;
    # the driver is ours: its stamp is a digest of its sources, so an edit rebuilds it
    crio-driver) (cd "$CRIO_DRIVER_SRC" && cat go.mod go.sum ./*.go | sha256sum | cut -d' ' -f1) ;;
    esac
}

group_bins() {
    case "$1" in
    plugins) for p in "${PLUGINS[@]}"; do echo "${p%%:*}"; done ;;
    cnitool) echo cnitool ;;
    crio-driver) echo crio-driver ;;
    esac
}

is_current() {
    local g=$1 dir
    dir=$(group_dir "$g")
    [[ -f "$dir/.stamp" ]] && [[ "$(cat "$dir/.stamp")" == "$(group_spec "$g")" ]] || return 1
    local b
    for b in $(group_bins "$g"); do
        [[ -x "$dir/$b" ]] || return 1
    done
}

need_go() {
    command -v go >/dev/null 2>&1 ||
        die "no Go toolchain on PATH (go 1.26 expected in /usr/local/go/bin): cannot build the pinned peers"
}

# go install pkg@version for each package, with the flags of upstream's release build (static,
# -trimpath, the version stamped, not stripped), into a scratch GOBIN, then moved into place whole.
build_plugins() {
    local dir tmp p name pkg out
    dir=$(group_dir plugins)
    tmp="$dir.tmp"
    rm -rf "$tmp"
    mkdir -p "$tmp"
    for p in "${PLUGINS[@]}"; do
        name=${p%%:*}
        pkg=${p#*:}
        log "go install $PLUGINS_MODULE/$pkg@$PLUGINS_VERSION"
        if ! out=$(cd "$tmp" && env GOBIN="$tmp" CGO_ENABLED=0 GOFLAGS=-buildvcs=false GOTOOLCHAIN=local \
            go install -trimpath -ldflags "-X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$PLUGINS_VERSION" \
            "$PLUGINS_MODULE/$pkg@$PLUGINS_VERSION" 2>&1); then
            printf '%s\n' "$out" | tail -20 >&2
            if grep -qiE 'dial tcp|no such host|connection refused|i/o timeout|TLS handshake|proxy' <<<"$out"; then
                die "the Go module registry is unreachable: cannot fetch $PLUGINS_MODULE@$PLUGINS_VERSION"
            fi
            die "go install of $PLUGINS_MODULE/$pkg@$PLUGINS_VERSION failed (above)"
        fi
        [[ -x "$tmp/$name" ]] || die "go install of $pkg left no binary named $name"
    done
    group_spec plugins >"$tmp/.stamp"
    rm -rf "$dir"
    mv "$tmp" "$dir"
    log "built $dir"
}

# A registry failure says so in one line; anything else shows the tail of Go's output.
go_failed() {
    local what=$1 out=$2
    printf '%s\n' "$out" | tail -20 >&2
    if grep -qiE 'dial tcp|no such host|connection refused|i/o timeout|TLS handshake|proxy' <<<"$out"; then
        die "the Go module registry is unreachable: cannot fetch what $what needs"
    fi
    die "$what failed (above)"
}

# libcni's own cnitool, as upstream's Makefile builds it (static, -trimpath).
build_cnitool() {
    local dir tmp out
    dir=$(group_dir cnitool)
    tmp="$dir.tmp"
    rm -rf "$tmp"
    mkdir -p "$tmp"
    log "go install $CNITOOL_MODULE/cnitool@$CNITOOL_VERSION"
    out=$(cd "$tmp" && env GOBIN="$tmp" CGO_ENABLED=0 GOFLAGS=-buildvcs=false GOTOOLCHAIN=local \
        go install -trimpath "$CNITOOL_MODULE/cnitool@$CNITOOL_VERSION" 2>&1) ||
        go_failed "go install of $CNITOOL_MODULE/cnitool@$CNITOOL_VERSION" "$out"
    [[ -x "$tmp/cnitool" ]] || die "go install of cnitool left no binary named cnitool"
    group_spec cnitool >"$tmp/.stamp"
    rm -rf "$dir"
    mv "$tmp" "$dir"
    log "built $dir"
}

# Our CRI-O replay driver, from tests/go/crio-driver (go.mod/go.sum pin libcni v1.3.1).
build_crio_driver() {
    local dir tmp out
    dir=$(group_dir crio-driver)
    tmp="$dir.tmp"
    rm -rf "$tmp"
    mkdir -p "$tmp"
    log "go build tests/go/crio-driver"
    out=$(cd "$CRIO_DRIVER_SRC" && env CGO_ENABLED=0 GOFLAGS="-buildvcs=false -mod=readonly" GOTOOLCHAIN=local \
        go build -trimpath -o "$tmp/crio-driver" . 2>&1) ||
        go_failed "go build of tests/go/crio-driver" "$out"
    group_spec crio-driver >"$tmp/.stamp"
    rm -rf "$dir"
    mv "$tmp" "$dir"
    log "built $dir"
}

if [[ "${1:-}" == "--print-dir" ]]; then
    [[ $# -eq 2 ]] || die "usage: $0 --print-dir GROUP"
    group_dir "$2"
    exit 0
fi

groups=("$@")
((${#groups[@]})) || groups=("${ALL_GROUPS[@]}")
for g in "${groups[@]}"; do group_dir "$g" >/dev/null; done

mkdir -p "$PEERS"
exec 9>"$PEERS.lock"
if ! flock -n 9; then
    log "another run is building; waiting for it (at most 30 minutes)"
    flock -w 1800 9 || die "target/peers.lock still held after 30 minutes"
fi

for g in "${groups[@]}"; do
    if is_current "$g"; then
        log "$g: $(group_dir "$g") is current"
        continue
    fi
    need_go
    case "$g" in
    plugins) build_plugins ;;
    cnitool) build_cnitool ;;
    crio-driver) build_crio_driver ;;
    esac
done
