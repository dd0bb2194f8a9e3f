"""The Lyceum backend: VMs through Lyceum's REST API, the bucket its S3 storage."""
