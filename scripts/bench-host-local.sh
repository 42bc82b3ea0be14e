#!/usr/bin/env bash
# host-local ADD and DEL with 0, 1 000, 10 000 and 30 000 existing reservations, ours vs
# upstream (/usr/lib/cni/host-local), in one interleaved run. Needs root (a netns for CNI_NETNS)
# and python3 (the timing loop: one fork+exec per call, the same overhead for both binaries).
#
#   scripts/bench-host-local.sh                 # default sizes and iterations
#   SIZES="0 1000" ITERATIONS=50 scripts/bench-host-local.sh
#
# Each binary gets its own copy of the same pre-filled store (upstream format, written directly),
# so neither sees the other's changes; one ADD+DEL warm-up per binary and size is not timed (ours
# builds its index from the IP files then, as it would once after a switch from upstream).
# Iterations alternate the binaries (ours first on even iterations, upstream first on odd), so
# drift on the machine hits both alike. The extra column "ours after foreign change" times our
# DEL right after upstream ADDed into ours' store: the index is stale and rebuilt from the files.
set -euo pipefail
cd "$(dirname "$0")/.."

UPSTREAM=${UPSTREAM:-/usr/lib/cni/host-local}
SIZES=${SIZES:-"0 1000 10000 30000"}
ITERATIONS=${ITERATIONS:-30}
[ -x "$UPSTREAM" ] || { echo "missing $UPSTREAM (apt-get install containernetworking-plugins)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "python3 is needed for the timing loop" >&2; exit 1; }

cargo build --release -q -p host-local
OURS=$PWD/target/release/host-local

NS=hl-bench-$$
WORK=$(mktemp -d /var/tmp/hl-bench.XXXXXX)
cleanup() { ip netns del "$NS" 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
ip netns add "$NS"

OURS="$OURS" UPSTREAM="$UPSTREAM" SIZES="$SIZES" ITERATIONS="$ITERATIONS" NS="$NS" WORK="$WORK" \
python3 - <<'EOF'
import json, os, statistics, subprocess, time, platform

ours, up = os.environ["OURS"], os.environ["UPSTREAM"]
sizes = [int(s) for s in os.environ["SIZES"].split()]
iters = int(os.environ["ITERATIONS"])
netns = "/run/netns/" + os.environ["NS"]
work = os.environ["WORK"]

def conf(data_dir):
    # 1.0.0: the newest version upstream 1.1.1 speaks. A /16: room for 30 000 + the runs.
    return json.dumps({"cniVersion": "1.0.0", "name": "bench", "type": "bridge",
                       "ipam": {"type": "host-local", "dataDir": data_dir,
                                "ranges": [[{"subnet": "10.200.0.0/16"}]]}}).encode()

def call(binary, cmd, cid, stdin):
    env = {"CNI_COMMAND": cmd, "CNI_CONTAINERID": cid, "CNI_IFNAME": "eth0",
           "CNI_NETNS": netns, "CNI_PATH": "/usr/lib/cni"}
    t = time.perf_counter_ns()
    p = subprocess.run([binary], input=stdin, env=env, capture_output=True)
    dt = (time.perf_counter_ns() - t) / 1e6
    if p.returncode != 0:
        raise SystemExit(f"{binary} {cmd} {cid} failed: {p.stdout.decode()} {p.stderr.decode()}")
    return dt

def fill(data_dir, n):
    d = os.path.join(data_dir, "bench")
    os.makedirs(d)
    last = None
    for i in range(n):
        a = 2 + i  # 10.200.0.2 upwards, skipping nothing (gateway is .0.1)
        ip = f"10.200.{a >> 8}.{a & 255}"
        with open(os.path.join(d, ip), "w") as f:
            f.write(f"fill-{i}\r\neth0")
        last = ip
    if last:
        with open(os.path.join(d, "last_reserved_ip.0"), "w") as f:
            f.write(last)

def med(xs):
    return statistics.median(xs)

# process start-up floor: what a do-nothing exec costs through the same loop
floor = []
for _ in range(50):
    t = time.perf_counter_ns(); subprocess.run(["/bin/true"]); floor.append((time.perf_counter_ns() - t) / 1e6)

rows = []
for n in sizes:
    stores = {}
    for name in ("ours", "upstream"):
        dd = os.path.join(work, f"{name}-{n}")
        fill(dd, n)
        stores[name] = (dd, conf(dd))
    bins = {"ours": ours, "upstream": up}
    for name in ("ours", "upstream"):  # untimed warm-up
        call(bins[name], "ADD", "warm", stores[name][1]); call(bins[name], "DEL", "warm", stores[name][1])
    t = {(b, v): [] for b in bins for v in ("ADD", "DEL")}
    for i in range(iters):
        order = ("ours", "upstream") if i % 2 == 0 else ("upstream", "ours")
        for name in order:
            cid = f"bench-{i}"
            t[(name, "ADD")].append(call(bins[name], "ADD", cid, stores[name][1]))
            t[(name, "DEL")].append(call(bins[name], "DEL", cid, stores[name][1]))
    # ours after a foreign change: upstream ADDs into ours' store, ours DELs it (rebuild)
    foreign = []
    for i in range(max(3, iters // 10)):
        call(up, "ADD", f"foreign-{i}", stores["ours"][1])
        foreign.append(call(ours, "DEL", f"foreign-{i}", stores["ours"][1]))
    rows.append((n, {k: med(v) for k, v in t.items()}, med(foreign)))
    print(f"# {n}: done", flush=True)

base_add, base_del = rows[0][1][("ours", "ADD")], rows[0][1][("ours", "DEL")]
print()
print(f"machine: {platform.node()} {os.cpu_count()} CPUs, kernel {platform.release()}; "
      f"store on {subprocess.run(['df', '--output=fstype', work], capture_output=True, text=True).stdout.split()[-1]}; "
      f"{iters} iterations per cell; exec floor (/bin/true) {med(floor):.2f} ms")
print()
print("| reservations | ours ADD | upstream ADD | upstream/ours | ours DEL | upstream DEL | upstream/ours | ours ADD vs empty | ours DEL vs empty | ours DEL after foreign change |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for n, m, f in rows:
    oa, ua, od, ud = m[("ours", "ADD")], m[("upstream", "ADD")], m[("ours", "DEL")], m[("upstream", "DEL")]
    print(f"| {n:,} | {oa:.2f} ms | {ua:.2f} ms | {ua/oa:.1f}x | {od:.2f} ms | {ud:.2f} ms | {ud/od:.1f}x "
          f"| {oa/base_add:.2f}x | {od/base_del:.2f}x | {f:.1f} ms |")
EOF
