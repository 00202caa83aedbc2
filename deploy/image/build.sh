#!/usr/bin/env bash
# `make image`: dist/node-resize-exporter-<version>.oci.tar, an OCI image archive built without
# a container engine, from Debian packages (mmdebstrap) and the project's wheel (umoci), for
# amd64 and arm64 (NRE_IMAGE_ARCHES, default both). The archive is one OCI layout holding an
# image index (a manifest list) tagged <version> with both platforms, and each platform's
# manifest tagged <version>-<arch>; `skopeo copy --all` pushes the index (README). deploy/Dockerfile
# is the same recipe for people with Docker (buildx --platform linux/amd64,linux/arm64).
#
# A foreign architecture runs under qemu-user-static through binfmt_misc (scripts/setup.sh image),
# as little as possible: mmdebstrap's --arch only downloads and unpacks the packages, the host's
# tools configure them (`build.sh configure`), and the image's own ldconfig, python3 (installing
# the wheels) and `--version` are all that run under it.
#
#   layer 1  Debian 12 (essential + python3, python3-bpfcc, libbpf1, ca-certificates) and the
#            generic kernel headers (extracted from Debian's linux-headers-<arch>, not installed)
#            at /usr/lib/node-resize-exporter/linux-headers. Cached in $NRE_IMAGE_CACHE per
#            architecture under a key of the architecture, the package list and the versions apt
#            would install (the host's candidates: Debian builds every architecture of a stable
#            release from the same source versions): rebuilt only when they change (a Debian
#            point release, or this script's layer-1 hooks). About 2-4 min either architecture.
#   layer 2  the wheel and its dependencies for that platform (pip download of manylinux wheels
#            for cp311 on the architecture, installed with --no-index by the image's python3),
#            the entrypoint (deploy/image/entrypoint.sh) and the seccomp profile (deploy/seccomp/).
#
# Needs root (mmdebstrap creates device nodes and chroots), apt's lists for bookworm, the
# Python package index pip is configured with (for the dependency wheels) and, for arm64,
# binfmt_misc with qemu-aarch64 enabled.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
out=${NRE_IMAGE_OUT:-$here/dist}
cache=${NRE_IMAGE_CACHE:-/var/cache/node-resize-exporter/image}
python=${PYTHON:-$here/.venv/bin/python}
say() { echo "image: $*" >&2; }
arches=(${NRE_IMAGE_ARCHES:-amd64 arm64})

# --- layer 1's hooks (from here to layer 2's header: layer 1's cache key) ------------------------
# mmdebstrap's extract hook (build.sh headers CHROOT ARCH PKG COMMON_PKG WORK): the generic
# kernel headers of ARCH, downloaded with the chroot's apt (its lists are ARCH's) and merged
# into one tree in the image. bcc's BCC_KERNEL_SOURCE takes one directory: -common's sources,
# the arch package's generated headers and config over them; one architecture, no build scripts.
if [ "${1:-}" = headers ]; then
  root=$2 arch=$3 headers_pkg=$4 common_pkg=$5 work=$6
  case $arch in amd64) karch=x86 ;; arm64) karch=arm64 ;; *) say "no kernel arch for $arch"; exit 1 ;; esac
  debs=$work/debs-$arch hdr=$work/headers-$arch merged=$work/linux-headers-$arch
  mkdir -p "$debs" "$hdr" "$merged/arch"
  (cd "$debs" && APT_CONFIG=$MMDEBSTRAP_APT_CONFIG apt-get download -q \
     -o APT::Sandbox::User=root "$headers_pkg" "$common_pkg" >/dev/null)
  for deb in "$debs"/*.deb; do dpkg-deb -x "$deb" "$hdr"; done
  cp -a "$hdr/usr/src/$common_pkg/include" "$hdr/usr/src/$common_pkg/Makefile" "$merged/"
  cp -a "$hdr/usr/src/$common_pkg/arch/$karch" "$merged/arch/"
  cp -a "$hdr/usr/src/$headers_pkg/include/." "$merged/include/"
  cp -a "$hdr/usr/src/$headers_pkg/arch/$karch/." "$merged/arch/$karch/"
  cp -a "$hdr/usr/src/$headers_pkg/.config" "$merged/"
  mkdir -p "$root/usr/lib/node-resize-exporter"
  cp -a "$merged" "$root/usr/lib/node-resize-exporter/linux-headers"
  exit 0
fi

# mmdebstrap's extract hook (build.sh configure ROOT ARCH): what dpkg and the packages'
# maintainer scripts would do, done by the host's tools on the extracted packages, so that no
# package's script runs under emulation for a foreign ARCH (dpkg and the scripts under qemu-user
# took 51 min for arm64). Only ldconfig runs in the image (one process).
# tests/kernel/test_image.py reads what is made here with the host's dpkg, in both images.
if [ "${1:-}" = merged-usr ]; then  # mmdebstrap's setup hook: /bin, /sbin, /lib in /usr, as Debian 12
  root=$2 arch=$3 dirs="bin sbin lib"
  [ "$arch" = amd64 ] && dirs="$dirs lib32 lib64 libx32"  # as mmdebstrap's merged-usr hook
  for d in $dirs; do ln -s "usr/$d" "$root/$d"; mkdir -p "$root/usr/$d"; done
  exit 0
fi
if [ "${1:-}" = configure ]; then
  root=$2 arch=$3
  ctl=$(mktemp -d /var/tmp/nre-image-ctl.XXXXXX)
  trap 'rm -rf "$ctl"' EXIT
  info=$root/var/lib/dpkg/info
  mkdir -p "$info" "$root/var/lib/dpkg/alternatives" "$root/var/lib/dpkg/updates"
  : > "$root/var/lib/dpkg/status"
  for deb in "$root"/var/cache/apt/archives/*.deb; do
    c=$ctl/$(basename "$deb" .deb); mkdir -p "$c"
    dpkg-deb -e "$deb" "$c"
    pkg=$(dpkg-deb -f "$deb" Package); ma=$(dpkg-deb -f "$deb" Multi-Arch)
    name=$pkg; [ "$ma" = same ] && name=$pkg:$arch
    # dpkg's database: the package installed, its files, checksums and conffiles.
    { awk '/^Package:/ {print; print "Status: install ok installed"; next} {print}' "$c/control"
      if [ -s "$c/conffiles" ]; then
        echo "Conffiles:"
        while read -r f; do
          [ -f "$root$f" ] && echo " $f $(md5sum < "$root$f" | cut -d' ' -f1)"
        done < "$c/conffiles"
      fi
      echo; } >> "$root/var/lib/dpkg/status"
    # What the path-excludes above left out is not the package's on this system (as dpkg does).
    dpkg-deb --fsys-tarfile "$deb" | tar -t | sed -e 's|^\./|/|; s|/$||; s|^$|/.|' -e '1s|^/$|/.|' \
      | while IFS= read -r f; do if [ -e "$root$f" ] || [ -L "$root$f" ]; then echo "$f"; fi; done \
      > "$info/$name.list"
    if [ -f "$c/md5sums" ]; then
      while read -r sum f; do if [ -e "$root/$f" ]; then echo "$sum  $f"; fi; done < "$c/md5sums" \
        > "$info/$name.md5sums"
    fi
    for f in preinst postinst prerm postrm config templates triggers shlibs symbols conffiles; do
      [ -f "$c/$f" ] && cp -p "$c/$f" "$info/$name.$f"
    done
    # The alternatives each postinst registers, with the host's update-alternatives.
    if [ -f "$c/postinst" ]; then
      sed -e ':a' -e '/\\$/N; s/\\\n[[:space:]]*/ /; ta' "$c/postinst" \
        | sed -n 's/^[[:space:]]*update-alternatives --install //p' | sed 's/[[:space:]]*|| true[[:space:]]*$//' \
        | while read -r line; do
          case $line in *'$'*|*'`'*) echo "image: $pkg's alternative is computed ($line): configure it here" >&2; exit 1 ;; esac
          # shellcheck disable=SC2086  # the postinst's literal words: link name path priority ...
          set -- $line
          # A path the image lacks (a man page excluded above) is one the postinst skips too.
          [ -e "$root$3" ] || continue
          # shellcheck disable=SC2086
          update-alternatives --quiet --root "$root" --install $line
        done
    fi
  done
  # base-passwd's postinst on a new system: the accounts from its masters.
  for f in passwd group; do [ -e "$root/etc/$f" ] || cp -p "$root/usr/share/base-passwd/$f.master" "$root/etc/$f"; done
  # base-files' postinst is written for this (every path under DPKG_ROOT): run on the host.
  DPKG_ROOT=$root sh "$ctl"/base-files_*/postinst configure ""
  # The configuration files other postinsts put in place on a new system: libc-bin's
  # nsswitch.conf, readline-common's inputrc, debianutils' shells (with bash's and dash's),
  # libpam-modules' environment and opasswd, login's subuid and subgid, python3's
  # debian_config and python3.11's local site directory. (Not done: pam-auth-update's
  # /etc/pam.d/common-*, debconf's database, init and timer links: nothing in a container
  # that runs the exporter reads them.)
  cp -p "$root/usr/share/libc-bin/nsswitch.conf" "$root/etc/nsswitch.conf"
  cp -p "$root/usr/share/readline/inputrc" "$root/etc/inputrc"
  cp -p "$root/usr/share/debianutils/shells" "$root/etc/shells"
  update-shells --root "$root"
  touch "$root/etc/environment" "$root/etc/subuid" "$root/etc/subgid"
  install -m 0600 /dev/null "$root/etc/security/opasswd"
  mkdir -p "$root/etc/python3" "$root/usr/local/lib/python3.11/dist-packages"
  printf '[DEFAULT]\n# how to byte-compile (comma separated: standard, optimize)\nbyte-compile = standard\n' \
    > "$root/etc/python3/debian_config"
  # dpkg's own files of an installed system.
  echo 1 > "$info/format"; : > "$root/var/lib/dpkg/diversions"
  # ca-certificates' postinst: every certificate trusted (its default), then the host's
  # update-ca-certificates (the same script) with the image's directories in their places.
  mkdir -p "$root/usr/local/share/ca-certificates" "$root/etc/ca-certificates/update.d"
  (cd "$root/usr/share/ca-certificates" && find . -name '*.crt' | sed 's|^\./||' | LC_ALL=C sort) > "$root/etc/ca-certificates.conf"
  unshare --mount sh -ec '
    for d in /etc/ssl/certs /usr/share/ca-certificates /usr/local/share/ca-certificates \
             /etc/ca-certificates/update.d /etc/ca-certificates.conf; do
      mount --bind "$1$d" "$d"
    done
    update-ca-certificates >/dev/null' sh "$root"
  # The byte-code dpkg's python triggers compile: the host's python3 (the same CPython 3.11; a
  # .pyc depends on the version, not the CPU) with the image's paths written into it.
  [ "$(chroot "$root" /usr/bin/python3 -c 'import sys; print(sys.version_info[:2])')" = \
    "$(/usr/bin/python3 -c 'import sys; print(sys.version_info[:2])')" ] \
    || { echo "image: the host's python3 is not the image's version" >&2; exit 1; }
  /usr/bin/python3 -m compileall -q -j 0 -s "$root" -p / "$root/usr/lib/python3.11" \
    "$root/usr/lib/python3/dist-packages" "$root/usr/share/python3" >/dev/null || true
  # libc-bin's trigger: the loader's cache, by the image's own ldconfig.
  chroot "$root" /sbin/ldconfig
  exit 0
fi

packages=(python3 python3-bpfcc libbpf1 ca-certificates)
version=$(/usr/bin/python3 -c 'import tomllib,sys; print(tomllib.load(open(sys.argv[1],"rb"))["project"]["version"])' "$here/pyproject.toml")
name=node-resize-exporter
archive=$out/$name-$version.oci.tar
work=$(mktemp -d /var/tmp/nre-image.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out" "$cache"
host_arch=$(dpkg --print-architecture)
for arch in "${arches[@]}"; do
  case $arch in
    amd64) ;;
    arm64) [ "$(cat /proc/sys/fs/binfmt_misc/qemu-aarch64 2>/dev/null | head -1)" = enabled ] \
             || { say "arm64 needs qemu-aarch64 in binfmt_misc: run scripts/setup.sh image"; exit 1; } ;;
    *) say "unknown architecture '$arch' (NRE_IMAGE_ARCHES: amd64 and/or arm64)"; exit 2 ;;
  esac
done

# --- layer 1: Debian, cached per architecture ----------------------------------------------------
# The headers' ABI name (linux-headers-6.1.0-N-) is the same on every architecture.
amd64_headers=$(apt-cache depends linux-headers-amd64 | awk '/Depends: linux-headers-/ {print $2; exit}')
[ -n "$amd64_headers" ] || { say "apt knows no linux-headers-amd64 (apt-get update?)"; exit 1; }
common_pkg=${amd64_headers%-amd64}-common
base_layer() {  # base_layer ARCH: base= the cached OCI layout of ARCH's Debian layer, built if missing
  local arch=$1 headers_pkg=${amd64_headers%-amd64}-$1 versions key
  versions=$(apt-cache policy "${packages[@]}" "$amd64_headers" "$common_pkg" | awk '/^[^ ]/ {p=$1} /Candidate:/ {print p, $2}')
  key=$( { echo "$arch"; printf '%s\n' "${packages[@]}"; echo "$versions"; sed -n '/^# --- layer 1/,/^# --- layer 2/p' "$0"; } | sha256sum | cut -c1-16)
  base=$cache/base-$arch-$key.oci  # an OCI layout holding the compressed layer: gzipped once
  if [ ! -s "$base/index.json" ]; then
    say "building the $arch Debian layer (${packages[*]}, $headers_pkg); cached as $base"
    # --variant=extract: the packages (the essential set and ours) are unpacked by the host and
    # configured by `build.sh configure`, so no maintainer script runs under emulation.
    mmdebstrap --quiet --arch="$arch" --variant=extract --include='?essential' \
      --include="$(IFS=,; echo "${packages[*]}")" \
      --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
      --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
      --setup-hook="'$here/deploy/image/build.sh' merged-usr \"\$1\" $arch" \
      --extract-hook="'$here/deploy/image/build.sh' configure \"\$1\" $arch" \
      --extract-hook="'$here/deploy/image/build.sh' headers \"\$1\" $arch $headers_pkg $common_pkg '$work'" \
      --extract-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/* "$1"/var/log/*' \
      bookworm "$work/base-$arch.tar" /etc/apt/sources.list.d/debian.sources >&2
    umoci init --layout "$work/base-$arch.oci"
    umoci new --image "$work/base-$arch.oci:base"
    umoci raw add-layer --image "$work/base-$arch.oci:base" "$work/base-$arch.tar"
    rm -f "$work/base-$arch.tar"
    rm -rf "$base"  # an incomplete one (no index.json)
    # Another build may have finished the same layer meanwhile: theirs is as good as ours.
    mv -T "$work/base-$arch.oci" "$base" 2>/dev/null || [ -s "$base/index.json" ]
  fi
}

# --- layer 2: the wheel and its dependencies ----------------------------------------------------
say "building the wheel"
src=$work/src; mkdir -p "$src"
# Build from a copy: an in-tree build leaves build/ and *.egg-info behind.
tar -C "$here" --exclude=./.venv --exclude=./.git --exclude=./dist --exclude=./build \
  --exclude='*.egg-info' --exclude=__pycache__ -cf - . | tar -C "$src" -xf -
"$python" -m pip wheel -q --disable-pip-version-check --no-deps -w "$work/own" "$src" >"$work/pip.log" 2>&1 \
  || { grep -v "^WARNING: Location" "$work/pip.log" >&2; exit 1; }
own=$(ls "$work"/own/*.whl)

image_for() {  # image_for ARCH: an OCI layout at $work/oci-ARCH, tagged $version
  local arch=$1 march base layout bundle root pipwhl platforms=()
  case $arch in amd64) march=x86_64 ;; arm64) march=aarch64 ;; esac
  base_layer "$arch"
  # The wheels the image's python3 (Debian 12: CPython 3.11, glibc 2.36) installs, for its CPU.
  for tag in manylinux_2_36 manylinux_2_34 manylinux_2_28 manylinux_2_17 manylinux2014; do
    platforms+=(--platform "${tag}_$march")
  done
  say "collecting the $arch wheels"
  "$python" -m pip download -q --disable-pip-version-check -d "$work/wheels-$arch" \
    --only-binary=:all: "${platforms[@]}" --python-version 3.11 --implementation cp \
    "$own" pip >"$work/pip.log" 2>&1 || { grep -v "^WARNING: Location" "$work/pip.log" >&2; exit 1; }
  layout=$work/oci-$arch
  cp -a "$base" "$layout"
  umoci tag --image "$layout:base" "$version"
  bundle=$work/bundle-$arch
  umoci unpack --image "$layout:$version" "$bundle" >/dev/null
  root=$bundle/rootfs
  mkdir -p "$root/tmp/wheels"
  cp "$work/wheels-$arch"/*.whl "$root/tmp/wheels/"
  pipwhl=$(cd "$root/tmp/wheels" && ls pip-*.whl | head -1)
  # The image's own python3 installs it (under emulation for arm64); pip runs from its wheel,
  # so the image carries no pip. Under emulation the byte-compilation (thousands of modules)
  # would take minutes: the host's python3 does it instead, the same CPython 3.11 (a .pyc
  # depends on the version, not the CPU), with the image's paths written into it.
  local compile=()
  [ "$arch" = "$host_arch" ] || compile=(--no-compile)
  chroot "$root" /usr/bin/python3 "/tmp/wheels/$pipwhl/pip" install -q --no-index \
    --disable-pip-version-check --no-cache-dir --break-system-packages --no-warn-script-location \
    --root-user-action=ignore "${compile[@]}" \
    --find-links /tmp/wheels "$name==$version"
  rm -rf "$root/tmp/wheels" "$root/root/.cache"
  if [ ${#compile[@]} -gt 0 ]; then
    [ "$(chroot "$root" /usr/bin/python3 -c 'import sys; print(sys.version_info[:2])')" = \
      "$(/usr/bin/python3 -c 'import sys; print(sys.version_info[:2])')" ] \
      || { say "the host's python3 is not the image's version: cannot byte-compile for $arch"; exit 1; }
    # pip's --break-system-packages installs under /usr/local/lib (Debian's dist-packages)
    /usr/bin/python3 -m compileall -q -j 0 -s "$root" -p / "$root/usr/local/lib" >/dev/null
  fi
  install -m 0755 "$here/deploy/image/entrypoint.sh" "$root/usr/local/bin/node-resize-exporter-entrypoint"
  # The DaemonSet's init container copies it to the kubelet's seccomp directory.
  install -D -m 0644 "$here/deploy/seccomp/node-resize-exporter.json" \
    "$root/usr/lib/node-resize-exporter/seccomp/node-resize-exporter.json"
  chroot "$root" /usr/local/bin/node-resize-exporter --version >/dev/null
  umoci repack --image "$layout:$version" "$bundle"
  rm -rf "$bundle"
  umoci config --image "$layout:$version" --author "node-resize-exporter" \
    --os linux --architecture "$arch" \
    --config.user 0:0 --config.workingdir / \
    --config.entrypoint /usr/local/bin/node-resize-exporter-entrypoint --config.cmd run \
    --config.exposedports 9862/tcp \
    --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --config.env PYTHONDONTWRITEBYTECODE=1 --config.env PYTHONUNBUFFERED=1 --config.env HOME=/tmp \
    --config.label "org.opencontainers.image.title=$name" \
    --config.label "org.opencontainers.image.version=$version"
  umoci rm --image "$layout:base"
  umoci gc --layout "$layout"
}

for arch in "${arches[@]}"; do image_for "$arch"; done

# --- the archive: one layout, the image index and each platform's manifest -----------------------
final=$work/final
/usr/bin/python3 - "$final" "$version" "${arches[@]/#/$work/oci-}" <<'PY'
import hashlib, json, shutil, sys
from pathlib import Path
final, version, layouts = Path(sys.argv[1]), sys.argv[2], [Path(p) for p in sys.argv[3:]]
blobs = final / "blobs" / "sha256"
blobs.mkdir(parents=True)
refs, platforms = [], []
for layout in layouts:
    for blob in (layout / "blobs" / "sha256").iterdir():
        if not (blobs / blob.name).exists():
            shutil.copyfile(blob, blobs / blob.name)
    (desc,) = [d for d in json.loads((layout / "index.json").read_text())["manifests"]
               if d["annotations"]["org.opencontainers.image.ref.name"] == version]
    manifest = json.loads((layout / "blobs" / "sha256" / desc["digest"][7:]).read_bytes())
    config = json.loads((layout / "blobs" / "sha256" / manifest["config"]["digest"][7:]).read_bytes())
    platform = {"architecture": config["architecture"], "os": config["os"]}
    bare = {k: desc[k] for k in ("mediaType", "digest", "size")}
    platforms.append({**bare, "platform": platform})
    refs.append({**bare, "annotations": {
        "org.opencontainers.image.ref.name": f"{version}-{platform['architecture']}"}})
index = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                    "manifests": platforms}, separators=(",", ":")).encode()
digest = hashlib.sha256(index).hexdigest()
(blobs / digest).write_bytes(index)
top = {"mediaType": "application/vnd.oci.image.index.v1+json", "digest": f"sha256:{digest}",
       "size": len(index), "annotations": {"org.opencontainers.image.ref.name": version}}
(final / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [top, *refs]}))
(final / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
PY
rm -f "$archive"
# The references are tags alone (the OCI convention): `ctr images import --base-name` prefixes them.
tar -C "$final" -cf "$archive.tmp" oci-layout index.json blobs
mv "$archive.tmp" "$archive"
say "wrote $archive (${arches[*]}; $(du -m "$archive" | cut -f1) MiB)"
