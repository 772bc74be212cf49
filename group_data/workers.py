"""GPU hosts: drivers, container runtime, weights and one systemd unit per engine rank."""

m3_nvidia_driver_branch = "580"  # NVIDIA driver branch pinned from the vendor's apt repository
m3_rocm_version = "7.2"  # minimum ROCm on AMD hosts
m3_allow_reboot = False  # reboot a host when a driver change needs it (else stop and name the hosts)
