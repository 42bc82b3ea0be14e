#!/usr/bin/env bash
# Check the release artifacts scripts/release.sh wrote (it runs this at the end), for amd64 and
# arm64, touching nothing outside scratch directories:
#   * the .sha256/.sha512 files verify with `sha256sum -c`/`sha512sum -c` and are upstream's format;
#   * each tarball holds exactly the plugins, the tools, LICENSE and README.md (naming the
#     commit) at the top level, root-owned, binaries 0755, fixed mtimes, and extracts into an
#     empty /opt/cni/bin-like directory as upstream's guides do it (tar -C DIR -xzf);
#   * every binary is a static ELF of its architecture (no program interpreter); the amd64 ones
#     print their about banner with version and commit (the arm64 ones: scripts/test-arm64.sh);
#   * each .deb: its control fields and file list, lintian without errors or warnings (tags
#     that do not apply are overridden with the reason in packaging/deb/lintian-overrides), and
#     installed into a scratch root (dpkg --root) beside Debian's containernetworking-plugins:
#     ours in /usr/lib/cni, Debian's seven diverted to <name>.distrib and its other plugins
#     untouched, Debian's package installed after ours landing in the diversions, and removing
#     ours putting Debian's back and leaving nothing of ours.
# Needs root (dpkg --root). Installs lintian (scripts/install-deps.sh --only).
#   scripts/check-release.sh [DIST] [VERSION]
set -euo pipefail
cd "$(dirname "$0")/.."
dist=$(cd "${1:-dist}" && pwd)
version=${2:-$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"$/\1/p' Cargo.toml)}
# The banner's version word: upstream's release ours matches, ours as build metadata
# (cni-common skel::BANNER_VERSION, which Nomad's fingerprint compares as upstream's).
upstream=$(sed -n 's/^pub const UPSTREAM_RELEASE: &str = "\(.*\)";$/\1/p' cni-common/src/skel.rs)
[ -n "$upstream" ] || { echo "$0: no UPSTREAM_RELEASE in cni-common/src/skel.rs" >&2; exit 1; }
plugins=(bandwidth bridge firewall host-local loopback portmap ptp tuning)
tools=(cnitool cni-migrate)
scratch=$(mktemp -d /tmp/cni-rs-check.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
fail() {
    echo "check-release: $*" >&2
    exit 1
}
scripts/install-deps.sh --only lintian

# "<machine> <interpreter>" of an ELF file: e_machine (62 x86_64, 183 aarch64) and whether a
# PT_INTERP program header exists ("dynamic") or not ("static"). Little-endian 64-bit only.
elf() {
    local f=$1 magic phoff phentsize phnum i type interp=static
    magic=$(od -An -tx1 -N4 "$f" | tr -d ' \n')
    [ "$magic" = 7f454c46 ] || {
        echo "not-elf"
        return
    }
    phoff=$(od -An -tu8 -j32 -N8 "$f" | tr -d ' ')
    phentsize=$(od -An -tu2 -j54 -N2 "$f" | tr -d ' ')
    phnum=$(od -An -tu2 -j56 -N2 "$f" | tr -d ' ')
    for ((i = 0; i < phnum; i++)); do
        type=$(od -An -tu4 -j$((phoff + i * phentsize)) -N4 "$f" | tr -d ' ')
        [ "$type" = 3 ] && interp=dynamic
    done
    echo "$(od -An -tu2 -j18 -N2 "$f" | tr -d ' ') $interp"
}

upstream_deb=
for arch in amd64 arm64; do
    case $arch in
    amd64) machine=62 ;;
    arm64) machine=183 ;;
    esac
    tgz=cni-rs-linux-$arch-v$version.tgz
    deb=cni-rs_${version}_$arch.deb
    for f in "$tgz" "$tgz.sha256" "$tgz.sha512" "$deb"; do
        [ -f "$dist/$f" ] || fail "$f missing in $dist"
    done

    # Checksums, in upstream's format: "<hex>  <file name>".
    (cd "$dist" && sha256sum --quiet --strict -c "$tgz.sha256" && sha512sum --quiet --strict -c "$tgz.sha512") ||
        fail "$tgz: checksum mismatch"
    grep -qxE "[0-9a-f]{64}  $tgz" "$dist/$tgz.sha256" || fail "$tgz.sha256 is not '<sha256>  $tgz'"
    grep -qxE "[0-9a-f]{128}  $tgz" "$dist/$tgz.sha512" || fail "$tgz.sha512 is not '<sha512>  $tgz'"

    # Tarball layout: "./name" entries, sorted, root-owned, commit's mtime.
    want=$(printf '%s\n' ./ ./LICENSE ./README.md "${plugins[@]/#/./}" "${tools[@]/#/./}" | LC_ALL=C sort)
    got=$(tar -tzf "$dist/$tgz")
    [ "$got" = "$want" ] || fail "$tgz holds:"$'\n'"$got"$'\n'"want:"$'\n'"$want"
    while read -r mode owner _ _ _ name; do
        case $name in
        ./) want_mode=drwxr-xr-x ;;
        ./LICENSE | ./README.md) want_mode=-rw-r--r-- ;;
        *) want_mode=-rwxr-xr-x ;;
        esac
        [ "$mode" = "$want_mode" ] || fail "$tgz: $name has mode $mode, want $want_mode"
        [ "$owner" = 0/0 ] || fail "$tgz: $name is owned by $owner, want 0/0"
    done < <(tar --numeric-owner -tvzf "$dist/$tgz")
    dest=$scratch/opt-cni-bin-$arch
    mkdir -p "$dest"
    tar -C "$dest" -xzf "$dist/$tgz" # what kubeadm's and containerd's guides run
    for b in "${plugins[@]}" "${tools[@]}"; do
        [ "$(elf "$dest/$b")" = "$machine static" ] || fail "$tgz: $b is $(elf "$dest/$b"), want '$machine static'"
    done
    commit=$(sed -n 's/^Built from commit \([0-9a-f]\{40\}\).*/\1/p' "$dest/README.md")
    [ -n "$commit" ] || fail "$tgz: README.md does not name the commit"
    if [ "$arch" = amd64 ] && [ "$(uname -m)" = x86_64 ]; then
        for b in "${plugins[@]}"; do
            banner=$("$dest/$b" 2>&1 </dev/null | head -1)
            [[ "$banner" == "CNI $b plugin v$upstream+cni-rs.$version (${commit:0:12}"* ]] ||
                fail "$tgz: $b's about banner is '$banner'"
        done
    fi

    # The .deb: control fields and files.
    field() { dpkg-deb -f "$dist/$deb" "$1"; }
    [ "$(field Package)" = cni-rs ] && [ "$(field Version)" = "$version" ] && [ "$(field Architecture)" = "$arch" ] ||
        fail "$deb: control says $(field Package) $(field Version) $(field Architecture)"
    dpkg-deb --ctrl-tarfile "$dist/$deb" | tar -t | grep -qx './preinst' || fail "$deb: no preinst"
    files=$(dpkg-deb -c "$dist/$deb" | awk '$1 !~ /^d/ { print $1, $2, $6 }')
    want_files=$(
        for b in "${plugins[@]}" cni-migrate; do echo "-rwxr-xr-x root/root ./usr/lib/cni/$b"; done
        echo "-rwxr-xr-x root/root ./usr/bin/cnitool"
        for f in changelog.gz copyright; do echo "-rw-r--r-- root/root ./usr/share/doc/cni-rs/$f"; done
        echo "-rw-r--r-- root/root ./usr/share/lintian/overrides/cni-rs"
        echo "-rw-r--r-- root/root ./usr/share/man/man1/cnitool.1.gz"
        echo "-rw-r--r-- root/root ./lib/systemd/system/cni-resync.service"
        echo "lrwxrwxrwx root/root ./lib/systemd/system/nftables.service.wants/cni-resync.service"
    )
    [ "$(sort <<<"$files")" = "$(sort <<<"$want_files")" ] || fail "$deb holds:"$'\n'"$files"
    # enabled as shipped: the link is the one `systemctl enable` would make
    [ "$(dpkg-deb -c "$dist/$deb" | awk '$6 == "./lib/systemd/system/nftables.service.wants/cni-resync.service" { print $8 }')" = ../cni-resync.service ] ||
        fail "$deb: the resync unit is not wanted by nftables.service"
    lintian --fail-on error,warning --display-info --allow-root "$dist/$deb" || fail "$deb: lintian"

    # Installed into a scratch root, beside Debian's containernetworking-plugins (any
    # architecture: the maintainer scripts are shell, run on this machine with DPKG_ROOT).
    if [ -z "$upstream_deb" ]; then
        download() { (cd "$scratch" && apt-get download -q -o APT::Sandbox::User=root containernetworking-plugins >/dev/null); }
        download || { apt-get update -qq && download; } ||
            fail "cannot download Debian's containernetworking-plugins (apt-get download)"
        upstream_deb=$(ls "$scratch"/containernetworking-plugins_*.deb)
    fi
    root=$scratch/root-$arch
    mkdir -p "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates" "$root/var/log"
    touch "$root/var/lib/dpkg/status" "$root/var/lib/dpkg/available"
    rdpkg() {
        dpkg --root="$root" --force-script-chrootless --force-depends --force-architecture "$@" \
            >"$scratch/dpkg.log" 2>&1 || fail "dpkg $*: $(cat "$scratch/dpkg.log")"
    }
    diverted() { dpkg-divert --root="$root" --list | LC_ALL=C sort; }
    want_div=$(for p in "${plugins[@]}"; do
        echo "diversion of /usr/lib/cni/$p to /usr/lib/cni/$p.distrib by cni-rs"
    done | LC_ALL=C sort)
    unpacked=$scratch/deb-$arch
    dpkg-deb -x "$dist/$deb" "$unpacked"
    upstream_files=$scratch/upstream-files
    rm -rf "$upstream_files"
    dpkg-deb -x "$upstream_deb" "$upstream_files"
    rdpkg -i "$upstream_deb"
    rdpkg -i "$dist/$deb"
    [ "$(diverted)" = "$want_div" ] || fail "$deb: diversions after install:"$'\n'"$(diverted)"
    for p in "${plugins[@]}"; do
        cmp -s "$root/usr/lib/cni/$p" "$unpacked/usr/lib/cni/$p" || fail "$deb: /usr/lib/cni/$p is not ours"
        cmp -s "$root/usr/lib/cni/$p.distrib" "$upstream_files/usr/lib/cni/$p" ||
            fail "$deb: Debian's $p is not at /usr/lib/cni/$p.distrib"
    done
    cmp -s "$root/usr/lib/cni/macvlan" "$upstream_files/usr/lib/cni/macvlan" || fail "$deb: Debian's macvlan was touched"
    # Debian's package installed again after ours: its copies land in the diversions.
    rdpkg -i "$upstream_deb"
    for p in "${plugins[@]}"; do
        cmp -s "$root/usr/lib/cni/$p" "$unpacked/usr/lib/cni/$p" || fail "$deb: reinstalling Debian's replaced our $p"
    done
    rdpkg -r cni-rs
    [ -z "$(diverted)" ] || fail "$deb: diversions left after remove:"$'\n'"$(diverted)"
    for p in "${plugins[@]}"; do
        cmp -s "$root/usr/lib/cni/$p" "$upstream_files/usr/lib/cni/$p" || fail "$deb: Debian's $p not back after remove"
        [ ! -e "$root/usr/lib/cni/$p.distrib" ] || fail "$deb: $p.distrib left after remove"
    done
    [ ! -e "$root/usr/lib/cni/cni-migrate" ] && [ ! -e "$root/usr/bin/cnitool" ] || fail "$deb: our tools left after remove"
    # Alone (no Debian package): install, then purge leaves no file.
    rdpkg -P containernetworking-plugins
    rdpkg -i "$dist/$deb"
    cmp -s "$root/usr/lib/cni/bridge" "$unpacked/usr/lib/cni/bridge" || fail "$deb: alone, bridge is not ours"
    rdpkg -P cni-rs
    left=$(find "$root" -path "$root/var" -prune -o -type f -print)
    [ -z "$left" ] || fail "$deb: files left after purge: $left"
    [ -z "$(diverted)" ] || fail "$deb: diversions left after purge"
    echo "check-release: $tgz (+ .sha256, .sha512) and $deb are good" >&2
done
