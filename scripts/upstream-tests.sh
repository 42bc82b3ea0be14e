#!/usr/bin/env bash
# Upstream's own tests against our binaries: the parts of containernetworking/plugins v1.10.0's
# test suites that exec plugin binaries (through libcni, cnitool or exec; not those that call
# Go functions in-process) run against our plugins and against v1.10.0's own, and the outcomes
# are compared case by case.
#
#   scripts/upstream-tests.sh            both implementations, then the comparison
#
# The suites (package: what of it runs):
#   portmap      plugins/meta/portmap: "portmap integration tests" (ptp + host-local + portmap
#                through libcni, TCP and UDP through the host port, four spec versions)
#   firewall     plugins/meta/firewall: "firewall integration tests" (bridge + host-local +
#                firewall through libcni, ingressPolicy same-bridge and isolated)
#   portmap-traffic  the same with its two reads of iptables' CNI-DN-<hash> chain taken out (a
#                copy of the package): everything else of those cases, the traffic above all,
#                is then judged for ours too (ours write nftables: scripts/upstream-tests.known)
#   loopback     plugins/main/loopback: the whole suite (it execs the plugin; here the binary
#                found on PATH instead of one it builds from its own sources)
#   integration  integration/: cnitool with ptp, bridge, bandwidth, host-local (../bin)
#   ptp-ipam     plugins/main/ptp: the whole suite. It never execs a ptp binary: every case
#                calls v1.10's ptp Go functions in-process (testutils.CmdAddWithArgs,
#                CmdCheckWithArgs, CmdDelWithArgs and CmdStatus each set CNI_* and call the
#                cmdAdd/cmdCheck/cmdDel/cmdStatus passed to them, with CNI_PATH = PATH). Those
#                functions exec the IPAM plugin, host-local, from that path (ipam.ExecAdd,
#                ExecCheck, ExecDel, ExecStatus), so what this suite judges of ours is
#                host-local behind v1.10's ptp (result, DNS, CHECK, DEL, STATUS), not our ptp.
# Not run: plugins/meta/tuning's suite execs nothing. Every case calls v1.10's tuning cmdAdd,
# cmdCheck and cmdDel in-process through testutils.CmdAddWithArgs, CmdCheckWithArgs and
# testutils.CmdDel (the prevResult is in the configuration it builds; tuning delegates to no
# IPAM), so both columns would be v1.10's own code. Our ptp and tuning binaries are judged by
# the suites above that exec them through libcni (ptp: portmap, portmap-traffic, integration;
# tuning: none of v1.10's suites chain it) and by tests/e2e/ptp.rs and tuning.rs.
# "ours" is our eight plugins (bridge, host-local, loopback, ptp, portmap, bandwidth, firewall,
# tuning from CNI_TEST_BIN_DIR, default target/debug: `cargo build --workspace --bins` first),
# nothing of v1.10 on the path; "v1.10" is v1.10.0's plugins only (scripts/install-peers.sh
# builds them).
#
# The test sources are copied from Go's module cache into target/upstream-tests/ (never
# committed) and compiled there with `go test -c`; their Go dependencies come from the Go module
# registry. Each test binary runs in a network and mount namespace of its own (a scratch "host":
# the tests make veths, iptables rules and /run/netns and /tmp entries, none of which reaches
# the machine). Needs root.
#
# Exit status: 1 when a case passes for v1.10 and fails for ours unless scripts/upstream-tests.known
# lists it (with the reason; docs/switching.md explains each), or when a listed case passes for
# ours now (the list must shrink with the fix). Cases v1.10 itself fails here are reported, not
# judged. The table of every case is target/upstream-tests/report.txt.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="$ROOT/target/upstream-tests"
KNOWN="$ROOT/scripts/upstream-tests.known"
VERSION=v1.10.0
MODULE=github.com/containernetworking/plugins

log() { printf 'upstream-tests: %s\n' "$*" >&2; }
die() {
    log "$*"
    exit 2
}

[ "$(id -u)" = 0 ] || die "needs root (network namespaces, iptables)"
command -v go >/dev/null 2>&1 || die "no Go toolchain on PATH (go 1.26 expected in /usr/local/go/bin)"
command -v python3 >/dev/null 2>&1 || die "python3 is needed to read ginkgo's JSON reports"

"$ROOT/scripts/install-peers.sh" plugins
PEER=$("$ROOT/scripts/install-peers.sh" --print-dir plugins)
OURS="${CNI_TEST_BIN_DIR:-$ROOT/target/debug}"
PLUGINS="bridge host-local loopback ptp portmap bandwidth firewall tuning"
for p in $PLUGINS; do
    [ -x "$OURS/$p" ] || die "our $p is not built in $OURS (cargo build --workspace --bins)"
done

SRC="$(go env GOMODCACHE)/$MODULE@$VERSION"
[ -d "$SRC" ] || die "$SRC missing: scripts/install-peers.sh should have fetched the module"

mkdir -p "$WORK"
exec 9>"$WORK.lock"
flock -w 1800 9 || die "target/upstream-tests.lock still held after 30 minutes"

# ---- sources and binaries ----
rm -rf "$WORK/src" "$WORK/reports"
mkdir -p "$WORK/reports" "$WORK/tests" "$WORK/tools"
cp -r "$SRC" "$WORK/src"
chmod -R u+w "$WORK/src"
# loopback's suite builds the plugin from its own sources; run the one on PATH instead
suite="$WORK/src/plugins/main/loopback/loopback_suite_test.go"
grep -q 'gexec.Build("github.com/containernetworking/plugins/plugins/main/loopback")' "$suite" ||
    die "loopback's suite no longer builds the plugin as expected: update this script"
sed -i -e 's|gexec.Build("github.com/containernetworking/plugins/plugins/main/loopback")|exec.LookPath("loopback")|' \
    -e 's|"github.com/onsi/gomega/gexec"|"github.com/onsi/gomega/gexec"\n\t"os/exec"|' "$suite"

# portmap-traffic: the integration test without its reads of the iptables chain
pt="$WORK/src/plugins/meta/portmap-traffic"
cp -r "$WORK/src/plugins/meta/portmap" "$pt"
[ "$(grep -c 'ipt.List("nat", dnatChainName)' "$pt/portmap_integ_test.go")" = 2 ] ||
    die "portmap's integration test no longer reads the CNI-DN chain twice: update this script"
awk '/_, err = ipt.List\("nat", dnatChainName\)/ {
        n++
        sub(/_, err = ipt.List\("nat", dnatChainName\)/,
            n == 1 ? "_, _ = ipt, dnatChainName; err = nil // the iptables chain: not read" : "err = fmt.Errorf(\"the iptables chain: not read\")")
    }
    { print }' "$pt/portmap_integ_test.go" >"$pt/integ.tmp"
mv "$pt/integ.tmp" "$pt/portmap_integ_test.go"

SUITES=(
    "portmap:plugins/meta/portmap:portmap integration tests"
    "portmap-traffic:plugins/meta/portmap-traffic:portmap integration tests"
    "firewall:plugins/meta/firewall:firewall integration tests"
    "loopback:plugins/main/loopback:"
    "integration:integration:"
    "ptp-ipam:plugins/main/ptp:"
)
export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0
for s in "${SUITES[@]}"; do
    IFS=: read -r name pkg _ <<<"$s"
    log "go test -c ./$pkg"
    (cd "$WORK/src" && go test -c -o "$WORK/tests/$name.test" "./$pkg") ||
        die "cannot build the $name suite (a Go dependency missing and the registry unreachable?)"
done
cni_version=$(cd "$WORK/src" && go list -m -f '{{.Version}}' github.com/containernetworking/cni)
log "go install github.com/containernetworking/cni/cnitool@$cni_version"
(cd "$WORK/src" && GOBIN="$WORK/tools" go install "github.com/containernetworking/cni/cnitool@$cni_version") ||
    die "cannot build libcni's cnitool $cni_version"

# ---- runs ----
# bin dir of an implementation: integration/ finds its plugins in ../bin, the others on PATH.
# Each side is one implementation whole: every suite chains several plugins (portmap's runs
# ptp, firewall's bridge), and a v1.10 companion on the ours side would judge v1.10's code.
populate() {
    local impl=$1 bin="$WORK/src/bin" dir=$PEER p banner
    [ "$impl" = ours ] && dir=$OURS
    rm -rf "$bin"
    mkdir -p "$bin"
    for p in $PLUGINS; do
        ln -s "$dir/$p" "$bin/$p"
        # which build answers under that name: ours say "+cni-rs." in the banner a run
        # without CNI_COMMAND prints, v1.10's do not (a wrong CNI_TEST_BIN_DIR or peer dir
        # would otherwise make both columns one implementation's, silently)
        banner=$(env -u CNI_COMMAND "$bin/$p" </dev/null 2>&1 | head -n 1) || true
        case "$impl:$banner" in
        "ours:CNI $p plugin "*+cni-rs.* | "v1.10:CNI $p plugin $VERSION") ;;
        *) die "$impl: $bin/$p is not the expected build (its banner: \"$banner\")" ;;
        esac
    done
}

run_suite() {
    local impl=$1 name=$2 pkg=$3 focus=$4 report="$WORK/reports/$impl-$name.json"
    local args=(-ginkgo.v -ginkgo.no-color "-ginkgo.json-report=$report" -ginkgo.timeout=20m)
    [ -n "$focus" ] && args+=("-ginkgo.focus=$focus")
    log "$impl: $name"
    # A scratch host: own network namespace; private /run/netns and /tmp. The tmpfs over /tmp
    # would hide a checkout that lives there (a clone under /tmp: the suite could not even cd
    # into its own target/), so every directory the run needs is bound back at its own path
    # from the /tmp the tmpfs covers (held open on fd 3: a mount hides a path, not a
    # directory already open; mount must not canonicalize that source, which would turn it
    # into the path /tmp, the new tmpfs). Those are the checkout, our binaries and the peers'
    # (symbolic links resolved: target/peers may point elsewhere).
    unshare --net --mount --propagation private -- sh -c '
        set -e
        mkdir -p /run/netns
        mount -t tmpfs cni-upstream-tests /run/netns
        exec 3</tmp
        mount -t tmpfs cni-upstream-tests /tmp
        for d in $2; do
            case $d in
            /tmp/*) mkdir -p "$d"; mount --no-canonicalize --rbind "/proc/self/fd/3/${d#/tmp/}" "$d" ;;
            esac
        done
        exec 3<&-
        ip link set lo up
        cd "$1"; shift 2
        exec "$@"' sh "$WORK/src/$pkg" "$KEEP" \
        env PATH="$WORK/src/bin:$WORK/tools:/usr/local/go/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
        "$WORK/tests/$name.test" "${args[@]}" >"$WORK/reports/$impl-$name.log" 2>&1 || true
    [ -s "$report" ] || die "$impl: the $name suite wrote no report (see $WORK/reports/$impl-$name.log)"
}

# what the scratch hosts bind back over their tmpfs /tmp (run_suite): real paths, no spaces
KEEP=
for d in "$ROOT" "$OURS" "$PEER"; do
    d=$(realpath -e "$d")
    case $d in *[[:space:]]*) die "$d: a path with white space is not supported" ;; esac
    KEEP="$KEEP $d"
done

for impl in v1.10 ours; do
    populate "$impl"
    for s in "${SUITES[@]}"; do
        IFS=: read -r name pkg focus <<<"$s"
        run_suite "$impl" "$name" "$pkg" "$focus"
    done
done
rm -rf "$WORK/src/bin"

# ---- comparison ----
python3 - "$WORK/reports" "$KNOWN" "$WORK/report.txt" <<'EOF'
import json, os, sys
reports, known_file, out = sys.argv[1:4]
def cases(impl):
    res = {}
    for f in sorted(os.listdir(reports)):
        if not (f.startswith(impl + "-") and f.endswith(".json")):
            continue
        suite = f[len(impl) + 1:-5]
        for r in json.load(open(os.path.join(reports, f))):
            for s in r.get("SpecReports") or []:
                if s.get("LeafNodeType") != "It":
                    continue
                name = suite + ": " + " ".join((s.get("ContainerHierarchyTexts") or []) + [s.get("LeafNodeText", "")])
                res[name] = s.get("State")
    return res
up, ours = cases("v1.10"), cases("ours")
known = {}
for line in open(known_file):
    line = line.rstrip("\n")
    if line and not line.startswith("#"):
        case, _, why = line.partition("\t")
        known[case] = why
lines, new, fixed, theirs = [], [], [], []
for name in sorted(set(up) | set(ours)):
    a, b = up.get(name, "absent"), ours.get(name, "absent")
    if a == "skipped" and b == "skipped":
        continue
    lines.append(f"{a:>8} {b:>8}  {name}")
    if a == "passed" and b != "passed" and name not in known:
        new.append(name)
    if name in known and b == "passed":
        fixed.append(name)
    if a not in ("passed", "skipped"):
        theirs.append(name)
ran = [n for n in up if up[n] != "skipped"]
with open(out, "w") as f:
    f.write("   v1.10     ours  case\n" + "\n".join(lines) + "\n")
print("   v1.10     ours  case")
print("\n".join(lines))
agree = sum(1 for n in ran if up[n] == ours.get(n))
print(f"== {len(ran)} cases; {sum(1 for n in ran if up[n] == 'passed')} pass for v1.10, "
      f"{sum(1 for n in ran if ours.get(n) == 'passed')} for ours; {agree} with the same outcome")
for n in theirs:
    print(f"== v1.10 itself does not pass here: {n}")
for n in sorted(known):
    if up.get(n) == "passed" and ours.get(n) != "passed":
        print(f"== known difference: {n}: {known[n]}")
bad = False
for n in new:
    print(f"FAIL: passes for v1.10, fails for ours, not in scripts/upstream-tests.known: {n}")
    bad = True
for n in fixed:
    print(f"FAIL: listed in scripts/upstream-tests.known but passes for ours now: {n}")
    bad = True
if not ran:
    print("FAIL: no case ran")
    bad = True
sys.exit(1 if bad else 0)
EOF
