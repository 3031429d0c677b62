#!/usr/bin/env bash
# Builds the container's root filesystem without a container engine:
# Debian 12 (minbase) by debootstrap with packages.txt, plus the duet binary;
# then runs `duet --help` inside it (chroot), which fails if a library is
# missing. Needs root and Debian's archive; not run in CI (it downloads
# about 100 MB).
#
#   sudo bash deploy/container/build_rootfs.sh [ROOTFS_DIR] [DUET_BINARY]
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=${1:-/tmp/duet-rootfs}
bin=${2:-bazel-bin/tools/duet}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
[ -x "$bin" ] || { echo "build_rootfs: no duet binary at $bin (bazel build -c opt //tools:duet)" >&2; exit 1; }
if ! command -v debootstrap >/dev/null; then
  echo "build_rootfs: installing debootstrap" >&2
  apt-get install -y debootstrap >/dev/null
fi
pkgs=$(grep -v '^#' "$here/packages.txt" | paste -sd, -)
echo "build_rootfs: debootstrap bookworm into $out with $pkgs" >&2
debootstrap --variant=minbase --include="$pkgs" bookworm "$out" "$mirror"
install -m 0755 "$bin" "$out/usr/local/bin/duet"
echo "build_rootfs: duet --help inside $out" >&2
chroot "$out" /usr/local/bin/duet --help
echo "build_rootfs: ok: $out holds a root filesystem that runs duet" >&2
