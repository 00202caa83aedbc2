#!/usr/bin/env bash
# `make image`: dist/node-resize-exporter-<version>.oci.tar, an OCI image archive built without
# a container engine, from Debian packages (mmdebstrap) and the project's wheel (umoci, skopeo).
# deploy/Dockerfile is the same recipe for people with Docker.
#
#   layer 1  Debian 12 (essential + python3, python3-bpfcc, libbpf1, ca-certificates) and the
#            generic kernel headers (extracted from Debian's linux-headers-amd64, not installed)
#            at /usr/lib/node-resize-exporter/linux-headers. Cached in $NRE_IMAGE_CACHE under a
#            key of the package list and the versions apt would install: rebuilt only when they
#            change (a Debian point release), as a tarball mmdebstrap writes.
#   layer 2  the wheel and its dependencies (pip from the wheelhouse, --no-index), the entrypoint
#            (deploy/image/entrypoint.sh) and the seccomp profile (deploy/seccomp/).
#
# Needs root (mmdebstrap creates device nodes and chroots), apt's lists for bookworm and the
# Python package index pip is configured with (for the dependency wheels).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
out=${NRE_IMAGE_OUT:-$here/dist}
cache=${NRE_IMAGE_CACHE:-/var/cache/node-resize-exporter/image}
python=${PYTHON:-$here/.venv/bin/python}
say() { echo "image: $*" >&2; }

packages=(python3 python3-bpfcc libbpf1 ca-certificates)
version=$(/usr/bin/python3 -c 'import tomllib,sys; print(tomllib.load(open(sys.argv[1],"rb"))["project"]["version"])' "$here/pyproject.toml")
name=node-resize-exporter
archive=$out/$name-$version.oci.tar
work=$(mktemp -d /var/tmp/nre-image.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out" "$cache"

# --- layer 1: Debian, cached ------------------------------------------------------------------
headers_pkg=$(apt-cache depends linux-headers-amd64 | awk '/Depends: linux-headers-/ {print $2; exit}')
[ -n "$headers_pkg" ] || { say "apt knows no linux-headers-amd64 (apt-get update?)"; exit 1; }
common_pkg=${headers_pkg%-amd64}-common
versions=$(apt-cache policy "${packages[@]}" "$headers_pkg" "$common_pkg" | awk '/^[^ ]/ {p=$1} /Candidate:/ {print p, $2}')
key=$( { printf '%s\n' "${packages[@]}"; echo "$versions"; sed -n '/^# --- layer 1/,/^# --- layer 2/p' "$0"; } | sha256sum | cut -c1-16)
base=$cache/base-$key.oci  # an OCI layout holding the compressed layer, so it is gzipped once
if [ ! -s "$base/index.json" ]; then
  say "building the Debian layer (${packages[*]}, $headers_pkg); cached as $base"
  debs=$work/debs; mkdir -p "$debs"
  (cd "$debs" && apt-get download -q -o APT::Sandbox::User=root "$headers_pkg" "$common_pkg" >/dev/null)
  hdr=$work/headers; mkdir -p "$hdr"
  for deb in "$debs"/*.deb; do dpkg-deb -x "$deb" "$hdr"; done
  # One tree (bcc's BCC_KERNEL_SOURCE takes one directory): -common's sources, -amd64's
  # generated headers and config over them; only x86 and no build scripts.
  merged=$work/linux-headers; mkdir -p "$merged/arch"
  cp -a "$hdr/usr/src/$common_pkg/include" "$hdr/usr/src/$common_pkg/Makefile" "$merged/"
  cp -a "$hdr/usr/src/$common_pkg/arch/x86" "$merged/arch/"
  cp -a "$hdr/usr/src/$headers_pkg/include/." "$merged/include/"
  cp -a "$hdr/usr/src/$headers_pkg/arch/x86/." "$merged/arch/x86/"
  cp -a "$hdr/usr/src/$headers_pkg/.config" "$merged/"
  mmdebstrap --quiet --variant=essential --include="$(IFS=,; echo "${packages[*]}")" \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --customize-hook="mkdir -p \"\$1/usr/lib/node-resize-exporter\" && cp -a '$merged' \"\$1/usr/lib/node-resize-exporter/linux-headers\"" \
    --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/* "$1"/var/log/*' \
    bookworm "$work/base.tar" /etc/apt/sources.list.d/debian.sources
  umoci init --layout "$work/base.oci"
  umoci new --image "$work/base.oci:base"
  umoci raw add-layer --image "$work/base.oci:base" "$work/base.tar"
  rm -f "$work/base.tar"
  rm -rf "$base"  # an incomplete one (no index.json)
  # Another build may have finished the same layer meanwhile: theirs is as good as ours.
  mv -T "$work/base.oci" "$base" 2>/dev/null || [ -s "$base/index.json" ]
fi

# --- layer 2: the wheel and its dependencies ----------------------------------------------------
wheels=$work/wheels; mkdir -p "$wheels"
say "building the wheel and collecting its dependencies"
src=$work/src; mkdir -p "$src"
# Build from a copy: an in-tree build leaves build/ and *.egg-info behind.
tar -C "$here" --exclude=./.venv --exclude=./.git --exclude=./dist --exclude=./build \
  --exclude='*.egg-info' --exclude=__pycache__ -cf - . | tar -C "$src" -xf -
"$python" -m pip wheel -q --disable-pip-version-check -w "$wheels" "$src" pip >"$work/pip.log" 2>&1 \
  || { grep -v "^WARNING: Location" "$work/pip.log" >&2; exit 1; }

layout=$work/oci
cp -a "$base" "$layout"
umoci tag --image "$layout:base" "$version"
bundle=$work/bundle
umoci unpack --image "$layout:$version" "$bundle" >/dev/null
root=$bundle/rootfs
mkdir -p "$root/tmp/wheels"
cp "$wheels"/*.whl "$root/tmp/wheels/"
pipwhl=$(cd "$root/tmp/wheels" && ls pip-*.whl | head -1)
# The image's own python3 installs it (the host's may be another version); pip runs from its wheel,
# so the image carries no pip.
chroot "$root" /usr/bin/python3 "/tmp/wheels/$pipwhl/pip" install -q --no-index \
  --disable-pip-version-check --no-cache-dir --break-system-packages --no-warn-script-location \
  --root-user-action=ignore \
  --find-links /tmp/wheels "$name==$version"
rm -rf "$root/tmp/wheels" "$root/root/.cache"
install -m 0755 "$here/deploy/image/entrypoint.sh" "$root/usr/local/bin/node-resize-exporter-entrypoint"
# The DaemonSet's init container copies it to the kubelet's seccomp directory.
install -D -m 0644 "$here/deploy/seccomp/node-resize-exporter.json" \
  "$root/usr/lib/node-resize-exporter/seccomp/node-resize-exporter.json"
chroot "$root" /usr/local/bin/node-resize-exporter --version >/dev/null
umoci repack --image "$layout:$version" "$bundle"
umoci config --image "$layout:$version" --author "node-resize-exporter" \
  --config.user 0:0 --config.workingdir / \
  --config.entrypoint /usr/local/bin/node-resize-exporter-entrypoint --config.cmd run \
  --config.exposedports 9862/tcp \
  --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --config.env PYTHONDONTWRITEBYTECODE=1 --config.env PYTHONUNBUFFERED=1 --config.env HOME=/tmp \
  --config.label "org.opencontainers.image.title=$name" \
  --config.label "org.opencontainers.image.version=$version"
umoci rm --image "$layout:base"
umoci gc --layout "$layout"
rm -f "$archive"
# The reference is the tag alone (the OCI convention): `ctr images import --base-name` prefixes it.
skopeo copy --quiet "oci:$layout:$version" "oci-archive:$archive:$version"
say "wrote $archive ($(du -m "$archive" | cut -f1) MiB)"
