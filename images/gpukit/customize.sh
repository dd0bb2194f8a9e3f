#!/bin/sh
# Runs inside the baked root filesystem (chroot), after the packages and files/ are in place.
set -eu
# Host keys are made per VM at first boot (gpukit-firstboot), never baked.
rm -f /etc/ssh/ssh_host_*
systemctl enable gpukit-firstboot.service
# Docker starts only where container_runtime enables it.
systemctl disable docker.service docker.socket containerd.service
# Slurm and munge start only where the slurm role enables them (`glue up --scheduler slurm`). The munge
# key is the cluster's, made once on the controller: a key made here would be every VM's, everywhere.
systemctl disable slurmctld.service slurmd.service munge.service
rm -f /etc/munge/munge.key
# Periodic jobs a short-lived VM does not need (and that cost seconds at boot under emulation): no
# apt archive is reachable from a VM without network, ext4 scrubbing of an ephemeral disk.
systemctl mask e2scrub_reap.service e2scrub_all.timer apt-daily.timer apt-daily-upgrade.timer \
  dpkg-db-backup.timer man-db.timer fstrim.timer
# A machine id per VM: systemd makes one on first boot when this file is empty.
: > /etc/machine-id
rm -f /var/lib/dbus/machine-id
# /mnt/s3 is left to bucket_mount, which makes it immutable while nothing is mounted there.
mkdir -p /var/lib/gpukit
apt-get clean
rm -rf /var/lib/apt/lists/*
# Empty package lists must not look fresh to Ansible's apt cache_valid_time (it reads this folder's
# mtime): the first apt task on a VM with network updates them instead of finding no package.
touch -d @0 /var/lib/apt/lists
