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
#   containerd  github.com/containerd/containerd/v2 v2.4.2: containerd ctr
#             containerd-shim-runc-v2         -> target/peers/containerd-v2.4.2/
#   cri-tools sigs.k8s.io/cri-tools v1.37.0: crictl critest -> target/peers/cri-tools-v1.37.0/
#   kubelet   k8s.io/kubernetes v1.37.2 (cmd/kubelet, with the k8s.io/* v0.37.2 staging
#             modules)                        -> target/peers/kubelet-v1.37.2/
#
# Flags follow each project's own release build: containerd's Makefile (cgo on for the daemon,
# off and static for the shim, tags urfave_cli_no_docs; plus no_btrfs, as Debian has no btrfs
# headers here and the tests use overlayfs), cri-tools' Makefile (CGO_ENABLED=0, -trimpath, critest
# is `go test -c` of cmd/critest), kubernetes' hack/lib/golang.sh (CGO_ENABLED=0, version stamped).
# Modules that cannot be `go install`ed (cri-tools builds from a vendor dir the module zip lacks;
# kubernetes' go.mod replaces its staging modules by paths) are built from a scratch module this
# script writes under target/peers/src/ — nothing of theirs is committed.
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
ALL_GROUPS=(plugins cnitool crio-driver containerd cri-tools kubelet)

CONTAINERD_VERSION=v2.4.2
CONTAINERD_MODULE=github.com/containerd/containerd/v2
CONTAINERD_BINS=(containerd:cmd/containerd ctr:cmd/ctr containerd-shim-runc-v2:cmd/containerd-shim-runc-v2)

CRITOOLS_VERSION=v1.37.0
CRITOOLS_MODULE=sigs.k8s.io/cri-tools

KUBERNETES_VERSION=v1.37.2
KUBERNETES_MODULE=k8s.io/kubernetes
# the staging modules' tag for this release: v1.X.Y -> v0.X.Y
KUBERNETES_STAGING_VERSION=v0.${KUBERNETES_VERSION#v1.}


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
    containerd) echo "$PEERS/containerd-$CONTAINERD_VERSION" ;;
    cri-tools) echo "$PEERS/cri-tools-$CRITOOLS_VERSION" ;;
    kubelet) echo "$PEERS/kubelet-$KUBERNETES_VERSION" ;;
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
    containerd) printf '%s@%s %s\n' "$CONTAINERD_MODULE" "$CONTAINERD_VERSION" "${CONTAINERD_BINS[*]}" ;;
    cri-tools) printf '%s@%s crictl critest\n' "$CRITOOLS_MODULE" "$CRITOOLS_VERSION" ;;
    kubelet) printf '%s@%s kubelet staging@%s\n' "$KUBERNETES_MODULE" "$KUBERNETES_VERSION" "$KUBERNETES_STAGING_VERSION" ;;
    esac
}

group_bins() {
    case "$1" in
    plugins) for p in "${PLUGINS[@]}"; do echo "${p%%:*}"; done ;;
    cnitool) echo cnitool ;;
    crio-driver) echo crio-driver ;;
    containerd) for p in "${CONTAINERD_BINS[@]}"; do echo "${p%%:*}"; done ;;
    cri-tools) echo crictl critest ;;
    kubelet) echo kubelet ;;
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

# Run a go command (the rest of the arguments, in directory $1, with the environment already set
# by the caller); on failure print its tail and die with one line saying what: $2.
run_go() {
    local dir=$1 what=$2 out
    shift 2
    log "$what"
    if ! out=$(cd "$dir" && env GOFLAGS="${GOFLAGS_EXTRA:--buildvcs=false}" GOTOOLCHAIN=local "$@" 2>&1); then
        printf '%s\n' "$out" | tail -20 >&2
        if grep -qiE 'dial tcp|no such host|connection refused|i/o timeout|TLS handshake|proxy' <<<"$out"; then
            die "the Go module registry is unreachable: $what"
        fi
        die "$what failed (above)"
    fi
}

# Move a finished scratch dir into place with its stamp.
finish_group() {
    local g=$1 tmp=$2 dir b
    dir=$(group_dir "$g")
    for b in $(group_bins "$g"); do
        [[ -x "$tmp/$b" ]] || die "$g: the build left no binary named $b"
    done
    group_spec "$g" >"$tmp/.stamp"
    rm -rf "$dir"
    mv "$tmp" "$dir"
    log "built $dir"
}

# containerd: `go install` of each command, the daemon and ctr with cgo (its Makefile's default),
# the shim static without cgo and with no_grpc (SHIM_CGO_ENABLED=0, SHIM_GO_BUILDTAGS).
build_containerd() {
    local dir tmp p name pkg cgo tags ld
    dir=$(group_dir containerd)
    tmp="$dir.tmp"
    rm -rf "$tmp"
    mkdir -p "$tmp"
    ld="-X $CONTAINERD_MODULE/version.Version=$CONTAINERD_VERSION -X $CONTAINERD_MODULE/version.Package=$CONTAINERD_MODULE"
    for p in "${CONTAINERD_BINS[@]}"; do
        name=${p%%:*}
        pkg=${p#*:}
        cgo=1
        tags="urfave_cli_no_docs no_btrfs"
        if [[ "$name" == containerd-shim-runc-v2 ]]; then
            cgo=0
            tags="$tags no_grpc"
        fi
        run_go "$tmp" "go install $CONTAINERD_MODULE/$pkg@$CONTAINERD_VERSION" \
            env GOBIN="$tmp" CGO_ENABLED=$cgo go install -trimpath -tags "$tags" -ldflags "$ld" \
            "$CONTAINERD_MODULE/$pkg@$CONTAINERD_VERSION"
    done
    finish_group containerd "$tmp"
}

# A writable copy of a module's source (the module cache is read-only), for builds that need
# their own go.mod resolution (-mod=mod instead of the vendor dir the module zip lacks).
module_copy() {
    local mod=$1 ver=$2 dest=$3 src
    src=$(cd "$PEERS" && env GOTOOLCHAIN=local GOFLAGS=-mod=mod go mod download -json "$mod@$ver" 2>&1 |
        sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p') || true
    [[ -n "$src" && -d "$src" ]] || die "cannot download $mod@$ver from the Go module registry"
    rm -rf "$dest"
    mkdir -p "$(dirname "$dest")"
    cp -r "$src" "$dest"
    chmod -R u+w "$dest"
}

# cri-tools: crictl is `go build`, critest is `go test -c` of cmd/critest (its Makefile), both
# CGO_ENABLED=0 with the version stamped.
build_cri_tools() {
    local dir tmp src ld
    dir=$(group_dir cri-tools)
    tmp="$dir.tmp"
    src="$PEERS/src/cri-tools-$CRITOOLS_VERSION"
    rm -rf "$tmp"
    mkdir -p "$tmp"
    module_copy "$CRITOOLS_MODULE" "$CRITOOLS_VERSION" "$src"
    ld="-X $CRITOOLS_MODULE/pkg/version.Version=${CRITOOLS_VERSION#v}"
    GOFLAGS_EXTRA="-buildvcs=false -mod=mod" run_go "$src" "go build $CRITOOLS_MODULE/cmd/crictl@$CRITOOLS_VERSION" \
        env CGO_ENABLED=0 go build -trimpath -ldflags "$ld" -o "$tmp/crictl" ./cmd/crictl
    GOFLAGS_EXTRA="-buildvcs=false -mod=mod" run_go "$src" "go test -c $CRITOOLS_MODULE/cmd/critest@$CRITOOLS_VERSION" \
        env CGO_ENABLED=0 go test -c -trimpath -ldflags "$ld" -o "$tmp/critest" ./cmd/critest
    finish_group cri-tools "$tmp"
}

# kubelet: kubernetes' go.mod replaces every k8s.io/* staging module by a path inside its own
# tree, so `go install k8s.io/kubernetes/cmd/kubelet@v1.X.Y` is refused. The usual recipe: a
# scratch module requiring k8s.io/kubernetes and replacing each staging module (the list read from
# kubernetes' own go.mod) by its published v0.X.Y tag; then `go build` of cmd/kubelet in it.
build_kubelet() {
    local dir tmp src gomod staging ld m
    dir=$(group_dir kubelet)
    tmp="$dir.tmp"
    src="$PEERS/src/kubelet-$KUBERNETES_VERSION"
    rm -rf "$tmp" "$src"
    mkdir -p "$tmp" "$src"
    gomod=$(cd "$PEERS" && env GOTOOLCHAIN=local GOFLAGS=-mod=mod go mod download -json "$KUBERNETES_MODULE@$KUBERNETES_VERSION" 2>&1 |
        sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p') || true
    [[ -n "$gomod" && -f "$gomod" ]] || die "cannot download $KUBERNETES_MODULE@$KUBERNETES_VERSION from the Go module registry"
    staging=$(sed -n 's|^[[:space:]]*\(k8s\.io/[A-Za-z0-9._-]*\) => \./staging/src/.*$|\1|p' "$gomod")
    [[ -n "$staging" ]] || die "no staging replacements found in $gomod"
    {
        echo "// written by scripts/install-peers.sh: builds kubelet $KUBERNETES_VERSION; not part of the project"
        echo "module cni-tests.invalid/kubelet-build"
        echo
        sed -n 's/^go \(.*\)$/go \1/p' "$gomod" | head -1
        echo
        echo "require $KUBERNETES_MODULE $KUBERNETES_VERSION"
        echo
        echo "replace ("
        for m in $staging; do echo "	$m => $m $KUBERNETES_STAGING_VERSION"; done
        echo ")"
    } >"$src/go.mod"
    ld="-X k8s.io/component-base/version.gitVersion=$KUBERNETES_VERSION"
    ld="$ld -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(cut -d. -f2 <<<"$KUBERNETES_VERSION")"
    ld="$ld -X k8s.io/component-base/version.gitTreeState=clean"
    GOFLAGS_EXTRA="-buildvcs=false -mod=mod" run_go "$src" "go build $KUBERNETES_MODULE/cmd/kubelet@$KUBERNETES_VERSION" \
        env CGO_ENABLED=0 go build -trimpath -ldflags "$ld" -o "$tmp/kubelet" "$KUBERNETES_MODULE/cmd/kubelet"
    finish_group kubelet "$tmp"
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

# Fast path, without the lock: a group is moved into place whole, stamp included, so a current
# group seen here is complete (a test asking for a built group never waits for another's build).
all_current=1
for g in "${groups[@]}"; do is_current "$g" || all_current=0; done
((all_current)) && exit 0

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
    containerd) build_containerd ;;
    cri-tools) build_cri_tools ;;
    kubelet) build_kubelet ;;
    esac
done
