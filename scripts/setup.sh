#!/usr/bin/env bash
# Installs what node-resize-exporter needs on a Debian 12 machine, as root. Idempotent: a second
# run checks and says nothing. Usage: scripts/setup.sh run|test|bench|lab
#   run   bcc (python3-bpfcc), kernel headers for bcc, tracefs, the venv with the project
#   test  run + pytest deps; Debian's prometheus/promtool (also what bench/fleet.py runs),
#         alertmanager and node_exporter (the peer bench/ measures against); the QEMU lab's
#         packages and guest kernel (unpacked in a cache, not installed); cpio (the lab's
#         initramfs check), perf (bench/profile.py), gcc (gcc-12 here: bench/listeners.py
#         builds its C listener), python3-fusepy (the slow-disk journal test), curl (the
#         runbook commands' test), wrk (the token flood test); the
#         image tools (mmdebstrap, umoci, skopeo, runc; qemu-user-static, binfmt-support and
#         arch-test for arm64), victoria-metrics (bench/fleet_vm.py) (bench: same). tests/e2e/test_setup.py
#         checks that every program the tests, lab and benchmarks run is installed here.
#   lab   run + the QEMU lab;  image  run + the image tools (`make image`)
set -euo pipefail
mode=${1:-run}
here=$(cd "$(dirname "$0")/.." && pwd)
venv=$here/.venv
say() { echo "setup: $*" >&2; }

need_root() {
  if [ "$(id -u)" != 0 ]; then
    say "must run as root to install Debian packages and mount tracefs (try: sudo make $mode)"; exit 1
  fi
}

apt_install() {  # apt_install pkg... : installs only the packages not yet installed
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  need_root
  say "installing Debian packages: ${missing[*]}"
  if [ -z "$(find /var/lib/apt/lists -name '*Packages*' -newer /etc/apt/sources.list 2>/dev/null | head -1)" ] \
     || ! apt-get install -y -qq --no-install-recommends --dry-run "${missing[@]}" >/dev/null 2>&1; then
    apt-get update -qq
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/tmp/node-resize-exporter-apt.log 2>&1 \
    || { cat /tmp/node-resize-exporter-apt.log >&2; exit 1; }
}

kernel_headers() {
  # bcc compiles C at load time and wants /lib/modules/$(uname -r)/build. Kernels without their
  # own headers (custom builds, no CONFIG_IKHEADERS) work with Debian's: tracepoint programs only
  # read `args`, never kernel struct layouts, so the version does not matter.
  local kdir=/lib/modules/$(uname -r)
  [ -e "$kdir/build/Makefile" ] && return 0
  [ -e /sys/kernel/kheaders.tar.xz ] && return 0
  apt_install linux-headers-amd64
  local hdr common
  hdr=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -1)
  common=$(ls -d /usr/src/linux-headers-*-common 2>/dev/null | sort -V | tail -1)
  [ -n "$hdr" ] || { say "no /usr/src/linux-headers-*-amd64 after installing linux-headers-amd64"; exit 1; }
  need_root
  mkdir -p "$kdir"
  ln -sfn "$hdr" "$kdir/build"
  [ -n "$common" ] && ln -sfn "$common" "$kdir/source"
  say "linked $kdir/build -> $hdr (bcc needs kernel headers; this kernel ships none)"
}

tracefs() {
  [ -e /sys/kernel/tracing/events ] && return 0
  need_root
  mount -t tracefs nodev /sys/kernel/tracing && say "mounted tracefs on /sys/kernel/tracing"
}

venv() {
  local extras=$1 stamp=$venv/.installed-$1
  if [ ! -x "$venv/bin/python" ]; then
    # /usr/bin/python3 is the interpreter Debian's bcc is built for; system site packages let
    # the venv import it (bcc is not on PyPI).
    /usr/bin/python3 -m venv --system-site-packages "$venv"
  fi
  if [ ! -f "$stamp" ] || [ "$here/pyproject.toml" -nt "$stamp" ]; then
    say "installing the project into $venv ($extras)"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -e "$here[$extras]" \
      >/tmp/node-resize-exporter-pip.log 2>&1 || { cat /tmp/node-resize-exporter-pip.log >&2; exit 1; }
    touch "$stamp"
  fi
}

lab_kernel() {
  # The QEMU lab's guest kernel with its modules and headers, unpacked into a cache the lab owns
  # (lab/initramfs.py KERNEL_CACHE), never installed: installing linux-image-amd64 would change
  # this host's boot kernel.
  local cache=/var/cache/node-resize-exporter/lab-kernel image release root tmp
  image=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-/ {print $2; exit}')
  if [ -z "$image" ]; then need_root; apt-get update -qq
    image=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-/ {print $2; exit}'); fi
  release=${image#linux-image-}; release=${release%-unsigned}
  root=$cache/$release
  [ -e "$root/.complete" ] && return 0
  need_root
  say "unpacking the lab's guest kernel $release into $root (not installed)"
  tmp=$(mktemp -d); rm -rf "$root"; mkdir -p "$root"
  (cd "$tmp" && apt-get download -qq -o APT::Sandbox::User=root "$image" \
     "linux-headers-$release" "linux-headers-${release%-amd64}-common" >/dev/null)
  for deb in "$tmp"/*.deb; do dpkg-deb -x "$deb" "$root"; done
  rm -rf "$tmp"
  depmod -b "$root" "$release"  # the package's postinst would have; modules.dep for the initramfs
  ln -sfn "$root/usr/src/linux-headers-$release" "$root/lib/modules/$release/build"
  ln -sfn "$root/usr/src/linux-headers-${release%-amd64}-common" "$root/lib/modules/$release/source"
  touch "$root/.complete"
}

image_tools() {
  # `make image` and its test: mmdebstrap, umoci, skopeo build the OCI archive; runc runs it
  # (crun 1.8 refuses hosts with hybrid cgroups, as these CI machines have).
  apt_install mmdebstrap umoci skopeo runc openssl
  # deploy/image/build.sh configures the image's packages with the host's tools, among them
  # update-ca-certificates (on the image's certificates, in a private mount namespace).
  apt_install ca-certificates
  # The arm64 image: built (mmdebstrap --arch, which wants arch-test) and run under
  # qemu-user-static through binfmt_misc (its qemu-aarch64 entry has the F flag: the
  # interpreter is opened once, so it works inside containers and chroots too).
  apt_install qemu-user-static binfmt-support arch-test
  binfmt_arm64
}

binfmt_arm64() {
  [ "$(head -1 /proc/sys/fs/binfmt_misc/qemu-aarch64 2>/dev/null)" = enabled ] && return 0
  need_root
  [ -e /proc/sys/fs/binfmt_misc/register ] \
    || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
  update-binfmts --enable qemu-aarch64
  say "enabled qemu-aarch64 in binfmt_misc (arm64 binaries run under emulation)"
}

base() {
  # libbpf1: the running agent reads the ring buffer through it (sources/kernel/bpf/libbpf.py)
  apt_install python3-bpfcc libbpf1 python3-venv python3-pip
  kernel_headers
  tracefs
}

case "$mode" in
  run)  base; venv run ;;
  # The benchmarks' smoke test runs in the suite, so test installs node_exporter (their peer) too.
  # python3-fusepy: the slow-disk journal test's FUSE file system (testkit/slowfs.py).
  test|bench) base
        # curl: tests/e2e/test_runbook_commands.py runs the runbooks' scrape command as written.
        # wrk: the token flood at thousands of requests a second (tests/e2e/test_web_token_flood.py).
        apt_install prometheus prometheus-alertmanager prometheus-node-exporter \
          qemu-system-x86 busybox-static kmod cpio linux-perf python3-fusepy curl gcc wrk
        # victoria-metrics: the store, vmagent shards and vmalert of bench/fleet_vm.py.
        apt_install victoria-metrics
        lab_kernel; image_tools
        venv "test,report" ;;
  lab)  base; apt_install qemu-system-x86 busybox-static kmod cpio; lab_kernel; venv "test" ;;
  image) base; image_tools; venv "test" ;;
  *) say "unknown mode '$mode' (use run, test, bench, lab or image)"; exit 2 ;;
esac
