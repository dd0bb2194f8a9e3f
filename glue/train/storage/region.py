"""The region S3 requests are signed for when the bucket names none: rclone's and MinIO's S3 servers accept any
SigV4 region, and a bucket on AWS records its own (BucketInfo.region). One spelling for the trainer and the
controller alike."""

DEFAULT_REGION = "us-east-1"
