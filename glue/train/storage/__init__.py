"""Where checkpoints and run records are stored: a folder, an S3 prefix, or the bucket under /mnt/s3.

Every target offers the same five operations (`target.Storage`); `target.open_target` picks one.
The S3 path keeps its client, its error parsing and its retries here. Light: no torch.
"""
