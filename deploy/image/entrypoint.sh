#!/bin/sh
# The image's entrypoint. bcc compiles the BPF C at start-up against kernel headers: the host's
# when the DaemonSet's optional /lib/modules and /usr/src mounts bring them, else the generic
# Debian headers the image carries (tracepoint programs read only their `args`, never kernel
# struct layouts, so headers of another kernel version compile them correctly).
release=$(uname -r)
if [ -z "${BCC_KERNEL_SOURCE:-}" ] \
   && [ ! -e "/lib/modules/$release/build/include/linux/kconfig.h" ] \
   && [ ! -e "/lib/modules/$release/source/include/linux/kconfig.h" ]; then
  export BCC_KERNEL_SOURCE=/usr/lib/node-resize-exporter/linux-headers
fi
exec /usr/local/bin/node-resize-exporter "$@"
