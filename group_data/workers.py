"""GPU hosts: drivers, container runtime, weights and one systemd unit per engine rank.

The NVIDIA driver branch and the minimum ROCm are the catalog's (m3deploy/core/data/catalog.yaml `vendors:`);
pin another here with m3_nvidia_driver_branch / m3_rocm_version (every key: m3deploy/core/settings.py)."""

m3_allow_reboot = False  # reboot a host when a driver change needs it (else stop and name the hosts)
