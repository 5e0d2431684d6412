#!/bin/bash
# Builds the Debian package from this tree with Debian's own tools
# (debhelper with meson, dpkg-buildpackage -us -uc -b) in a scratch copy of
# the tracked files, puts mpnfs_*.deb in OUTDIR, and runs lintian on it
# (tags found are printed; an error-level tag fails).
#
#   contrib/package.sh OUTDIR
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: contrib/package.sh OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d /tmp/mpnfs-package.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir "$work/mpnfs"
# The source files as they are in the work tree (uncommitted edits and new
# files included; what .gitignore names left out).
git ls-files -z --cached --others --exclude-standard |
  while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
  xargs -0 cp --parents -t "$work/mpnfs"
(cd "$work/mpnfs" && DEB_BUILD_OPTIONS="nocheck parallel=$(nproc)" dpkg-buildpackage -us -uc -b >"$work/build.log" 2>&1) || {
  tail -40 "$work/build.log"
  echo "package: dpkg-buildpackage failed" >&2
  exit 1
}
cp "$work"/mpnfs_*.deb "$out/"
deb=$(ls "$out"/mpnfs_*.deb | tail -1)
echo "package: $deb"
lintian --fail-on error --display-info "$deb" "$work"/mpnfs_*.changes || {
  echo "package: lintian found errors" >&2
  exit 1
}
