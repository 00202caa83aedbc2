"""The QEMU hotplug lab: real DIMM and vCPU hot-add/remove in a guest, scraped end to end."""
