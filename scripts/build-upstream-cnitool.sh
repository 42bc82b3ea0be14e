#!/usr/bin/env bash
# Build upstream cnitool (containernetworking/cni, Debian's 1.1.2) into target/upstream/cnitool
# for the interoperability tests of tools/cnitool. Also makes sure Debian's upstream plugins
# (containernetworking-plugins, in /usr/lib/cni) are installed: the tests run them.
#
# Everything comes from Debian's archive through apt:
#   - golang-go and golang-github-appc-cni-dev (libcni's sources in /usr/share/gocode);
#   - the cnitool main package, which the -dev package leaves out, from the source package
#     golang-github-appc-cni (apt-get source, with a private deb-src list derived from the
#     machine's own apt sources; the machine's apt configuration is not changed).
# The build is offline, in GOPATH mode (GO111MODULE=off). Nothing upstream is committed:
# all of it lives under target/upstream/.
#
# Idempotent: does nothing when target/upstream/cnitool exists and the packages are there.
# Safe to run concurrently (the test harness runs one process per test, and each test that
# needs upstream cnitool calls this): one run at a time holds target/upstream.lock, the others
# wait for it and then find the binary built. Without the lock a second run's `rm -rf` of the
# work directories pulled them from under the first one's apt-get and go build.
# Usage: scripts/build-upstream-cnitool.sh [--force]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="$ROOT/target/upstream"
OUT="$WORK/cnitool"
PACKAGES=(golang-go golang-github-appc-cni-dev containernetworking-plugins xz-utils)

log() { printf 'build-upstream-cnitool: %s\n' "$*" >&2; }

mkdir -p "$ROOT/target"
exec 9>"$ROOT/target/upstream.lock"
if ! flock -n 9; then
    log "another run is building; waiting for it"
    flock 9
fi

missing=()
for p in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$p")
    fi
done
if ((${#missing[@]})); then
    if [[ $(id -u) -ne 0 ]]; then
        log "missing packages ${missing[*]} and not root: install them first"
        exit 1
    fi
    log "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [[ -x "$OUT" && "${1:-}" != "--force" ]]; then
    log "$OUT is already built"
    exit 0
fi

mkdir -p "$WORK"
SRC="$WORK/src"
rm -rf "$SRC"
mkdir -p "$SRC/sources.list.d" "$SRC/lists/partial" "$SRC/cache/archives/partial" "$SRC/download"

# deb-src entries for the suites the machine already uses: the same entries with the type
# switched. Works for deb822 .sources files and one-line .list files.
shopt -s nullglob
n=0
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list; do
    [[ -f "$f" ]] || continue
    base="$(basename "$f")"
    case "$f" in
    *.sources)
        sed -E 's/^Types:.*$/Types: deb-src/' "$f" >"$SRC/sources.list.d/$base"
        ;;
    *)
        sed -nE 's/^deb[[:space:]]+/deb-src /p' "$f" >"$SRC/sources.list.d/${base%.list}.list"
        ;;
    esac
    n=$((n + 1))
done
if ((n == 0)); then
    log "no apt sources found to derive deb-src entries from"
    exit 1
fi

APT=(apt-get -q
    -o "Dir::Etc::SourceList=/dev/null"
    -o "Dir::Etc::SourceParts=$SRC/sources.list.d"
    -o "Dir::State::Lists=$SRC/lists"
    -o "Dir::Cache=$SRC/cache"
    -o "APT::Sandbox::User=root")
log "fetching the source package index"
# A third-party source without deb-src entries makes update complain; apt-get source below
# fails clearly if Debian's own index is missing too.
"${APT[@]}" update >/dev/null 2>"$SRC/update.log" || log "apt-get update reported errors (see $SRC/update.log)"

version="$(dpkg-query -W -f='${Version}' golang-github-appc-cni-dev)"
log "fetching source package golang-github-appc-cni $version"
(
    cd "$SRC/download"
    "${APT[@]}" source --download-only "golang-github-appc-cni=$version" >/dev/null 2>&1 ||
        "${APT[@]}" source --download-only golang-github-appc-cni >/dev/null
)
orig=("$SRC"/download/golang-github-appc-cni_*.orig.tar.*)
if ((${#orig[@]} != 1)); then
    log "expected one orig tarball, found: ${orig[*]:-none}"
    exit 1
fi

GOPATH_DIR="$WORK/gopath"
rm -rf "$GOPATH_DIR"
mkdir -p "$GOPATH_DIR/src/cnitool"
tar -xf "${orig[0]}" -C "$SRC" --wildcards '*/cnitool/*.go'
main=("$SRC"/*/cnitool/cnitool.go)
if [[ ! -f "${main[0]}" ]]; then
    log "cnitool/cnitool.go not found in ${orig[0]}"
    exit 1
fi
cp "$(dirname "${main[0]}")"/*.go "$GOPATH_DIR/src/cnitool/"
rm -f "$GOPATH_DIR"/src/cnitool/*_test.go

log "building $OUT (GOPATH mode, offline)"
(
    cd "$GOPATH_DIR/src/cnitool"
    env GOPATH="$GOPATH_DIR:/usr/share/gocode" GO111MODULE=off GOPROXY=off GOFLAGS= \
        GOCACHE="$WORK/gocache" CGO_ENABLED=0 \
        go build -o "$OUT.tmp" .
)
mv "$OUT.tmp" "$OUT"
log "built $OUT"
