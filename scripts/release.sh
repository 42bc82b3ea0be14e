#!/usr/bin/env bash
# Release artifacts as operators install CNI plugins, in dist/:
#   cni-rs-linux-<arch>-v<version>.tgz   the plugins, cnitool, cni-migrate, LICENSE and a short
#                                        README naming the commit, at the top level: upstream's
#                                        tarball shape (tar -C /opt/cni/bin -xzf ...)
#   ….tgz.sha256, ….tgz.sha512           `sha256sum -c` / `sha512sum -c` files, as upstream's
#   cni-rs_<version>_<arch>.deb          the plugins in /usr/lib/cni (docs/packaging.md)
# for <arch> amd64 and arm64 (Go's and Debian's names, as upstream's file names use): static
# musl binaries, x86_64 built natively and aarch64 cross-built, both linked by rust-lld with the
# same size-tuned profile (scripts/build-release.sh). Then scripts/check-release.sh checks what
# was written (layout, checksums, architectures, the .deb with lintian and installed into a
# scratch root). Needs root for that check (dpkg --root).
#   scripts/release.sh [--verify] [VERSION]
# VERSION defaults to the workspace version (Cargo.toml) and must equal it: the binaries'
# about banner prints that one. Built from HEAD; a checkout with uncommitted changes is built
# too, named <commit>-dirty, with a warning: only a commit's build is reproducible.
# Reproducible: the same commit and toolchain give the same bytes (no build paths in the
# binaries, fixed mtimes from the commit's date, sorted tar entries, root owner, gzip -n).
# --verify proves it: the commit is exported into a scratch directory and built again there
# from scratch (its own target directory), and every file of dist/ must be identical.
set -euo pipefail
cd "$(dirname "$0")/.."

verify=0
version=
for a in "$@"; do
    case "$a" in
    --verify) verify=1 ;;
    -h | --help)
        sed -n '2,/^set -/p' "$0" | grep '^#'
        exit 0
        ;;
    -*)
        echo "release: unknown option $a" >&2
        exit 2
        ;;
    *) version=${a#v} ;;
    esac
done
crate_version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"$/\1/p' Cargo.toml)
version=${version:-$crate_version}
if [ "$version" != "$crate_version" ]; then
    echo "release: VERSION $version is not the workspace version $crate_version (Cargo.toml," >&2
    echo "[workspace.package]), which every binary's about banner prints: bump it there first" >&2
    exit 2
fi

# The commit and its date. An export of a commit (--verify's second build) has no .git: the
# first build passes both in.
if [ -n "${CNI_RELEASE_COMMIT:-}" ]; then
    commit=$CNI_RELEASE_COMMIT
    : "${SOURCE_DATE_EPOCH:?CNI_RELEASE_COMMIT needs SOURCE_DATE_EPOCH}"
    label=${commit:0:12}
else
    commit=$(git rev-parse HEAD)
    SOURCE_DATE_EPOCH=$(git log -1 --format=%ct HEAD)
    label=${commit:0:12}
    if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
        label="$label-dirty"
        echo "release: uncommitted changes: building $label, which no other build reproduces" >&2
        if ((verify)); then
            echo "release: --verify needs a clean checkout (it rebuilds the commit)" >&2
            exit 2
        fi
    fi
fi
export SOURCE_DATE_EPOCH
dist=$PWD/dist
stage=${CARGO_TARGET_DIR:-$PWD/target}/release-stage
rm -rf "$dist" "$stage"
mkdir -p "$dist" "$stage"
rustc_version=$(rustc -V)

plugins=(bandwidth bridge firewall host-local loopback portmap ptp tuning)
tools=(cnitool cni-migrate)

# Every file and directory below $1: mode 0755 (directories, binaries, maintainer scripts) or
# 0644, mtime of the commit.
normalize() {
    find "$1" -type d -exec chmod 0755 {} +
    find "$1" -type f -exec chmod go-w,a+r {} +
    find "$1" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
}

for arch in amd64 arm64; do
    case $arch in
    amd64) triple=x86_64-unknown-linux-musl ;;
    arm64) triple=aarch64-unknown-linux-musl ;;
    esac
    bin=$(CNI_RELEASE_TARGET=$triple CNI_BUILD_COMMIT=$label scripts/build-release.sh)

    # The tarball: everything at the top level, entries "./name" like upstream's.
    t=$stage/tgz-$arch
    mkdir -p "$t"
    for b in "${plugins[@]}" "${tools[@]}"; do
        install -m 0755 "$bin/$b" "$t/$b"
    done
    install -m 0644 LICENSE "$t/LICENSE"
    built="commit $commit"
    [ "${label%-dirty}" = "$label" ] || built="$built with uncommitted changes"
    cat >"$t/README.md" <<README
# cni-rs v$version, linux/$arch

Built from $built, for $triple with $rustc_version:
static, size-tuned.

* Plugins, drop-in replacements for containernetworking/plugins: ${plugins[*]}
* cnitool: a runner with upstream cnitool's command line and libcni's cache format
* cni-migrate: moves running pods' host ports and masquerading between our nftables form and
  upstream's iptables form (switching a node back and forth)

Install: \`tar -C /opt/cni/bin -xzf cni-rs-linux-$arch-v$version.tgz\`. Every plugin prints its
version and commit when run without CNI_COMMAND. License: Apache-2.0 (LICENSE).
README
    normalize "$t"
    tgz=cni-rs-linux-$arch-v$version.tgz
    tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner --format=gnu \
        -C "$t" -cf - . | gzip -n -9 >"$dist/$tgz"
    (cd "$dist" && sha256sum "$tgz" >"$tgz.sha256" && sha512sum "$tgz" >"$tgz.sha512")

    # The Debian package (docs/packaging.md).
    d=$stage/deb-$arch
    mkdir -p "$d/DEBIAN" "$d/usr/lib/cni" "$d/usr/bin" "$d/usr/share/doc/cni-rs" "$d/usr/share/lintian/overrides"
    for b in "${plugins[@]}" cni-migrate; do
        install -m 0755 "$bin/$b" "$d/usr/lib/cni/$b"
    done
    install -m 0755 "$bin/cnitool" "$d/usr/bin/cnitool"
    # the resync unit (docs/node-operations.md), shipped enabled: wanted by nftables.service
    # through a link of the package (as `systemctl enable` would make it), so every start or
    # reload of the firewall rebuilds the pods' state and the localhost guard without a manual
    # step; `systemctl mask cni-resync.service` turns it off
    mkdir -p "$d/lib/systemd/system/nftables.service.wants"
    sed 's|@BIN_DIR@|/usr/lib/cni|g' scripts/systemd/cni-resync.service >"$d/lib/systemd/system/cni-resync.service"
    chmod 0644 "$d/lib/systemd/system/cni-resync.service"
    ln -s ../cni-resync.service "$d/lib/systemd/system/nftables.service.wants/cni-resync.service"
    mkdir -p "$d/usr/share/man/man1"
    gzip -n -9 <packaging/deb/cnitool.1 >"$d/usr/share/man/man1/cnitool.1.gz"
    install -m 0644 packaging/deb/copyright "$d/usr/share/doc/cni-rs/copyright"
    install -m 0644 packaging/deb/lintian-overrides "$d/usr/share/lintian/overrides/cni-rs"
    date=$(date -u -R -d "@$SOURCE_DATE_EPOCH")
    printf 'cni-rs (%s) unstable; urgency=medium\n\n  * Release %s, commit %s.\n\n -- %s  %s\n' \
        "$version" "$version" "$label" "cni-rs developers <cni-rs@example.invalid>" "$date" |
        gzip -n -9 >"$d/usr/share/doc/cni-rs/changelog.gz"
    install -m 0755 packaging/deb/preinst packaging/deb/postrm "$d/DEBIAN/"
    # dpkg-gencontrol's rule: 1 KiB per directory, each file rounded up to whole KiB
    size=$(find "$d/usr" "$d/lib" \( -type d -printf '1024\n' \) -o -printf '%s\n' |
        awk '{ s += int(($1 + 1023) / 1024) } END { print s }')
    sed "s/@VERSION@/$version/; s/@ARCH@/$arch/; s/@INSTALLED_SIZE@/$size/" packaging/deb/control.in >"$d/DEBIAN/control"
    (cd "$d" && find usr lib -type f | LC_ALL=C sort | xargs md5sum >DEBIAN/md5sums)
    chmod 0644 "$d/DEBIAN/control" "$d/DEBIAN/md5sums"
    normalize "$d"
    dpkg-deb --root-owner-group -Zxz --threads-max=1 --build "$d" "$dist/cni-rs_${version}_$arch.deb" >/dev/null
done

scripts/check-release.sh "$dist" "$version"

if ((verify)); then
    tmp=$(mktemp -d /tmp/cni-rs-verify.XXXXXX)
    trap 'rm -rf "$tmp"' EXIT
    mkdir "$tmp/src"
    git archive "$commit" | tar -x -C "$tmp/src"
    echo "release: building $commit again in $tmp/src (target $tmp/target)" >&2
    (cd "$tmp/src" && CNI_RELEASE_COMMIT=$commit CARGO_TARGET_DIR=$tmp/target scripts/release.sh "$version")
    differ=0
    for f in "$dist"/*; do
        if cmp -s "$f" "$tmp/src/dist/${f##*/}"; then
            echo "reproduced: ${f##*/}"
        else
            echo "DIFFERS: ${f##*/}" >&2
            differ=1
        fi
    done
    [ "$(ls "$dist")" = "$(ls "$tmp/src/dist")" ] || {
        echo "the two builds wrote different file sets" >&2
        differ=1
    }
    ((!differ)) || exit 1
    echo "release: the second build, in another directory, gave the same bytes" >&2
fi
ls -l "$dist" >&2
