"""The local backend: VMs on this machine, the bucket an rclone S3 server on loopback."""
