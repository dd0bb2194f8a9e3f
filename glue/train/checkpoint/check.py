"""Run on a VM: prove the newest valid checkpoint of a target reads back from THIS machine (deep: every
object's size and sha256; older checkpoints are not read once a valid one is found).

    python -m glue.train.checkpoint.check <target>      -> JSON {"latest_valid": N|null, "checked": [...]}

Credentials: GPUKIT_CREDENTIALS_FILE (0600 JSON), endpoint GPUKIT_BUCKET_ENDPOINT.
"""

from __future__ import annotations

import json
import os
import sys

from glue.train import trainer_vars
from glue.train.checkpoint.format import list_steps, validate_step
from glue.train.storage.credentials import credentials_from_file
from glue.train.storage.region import DEFAULT_REGION
from glue.train.storage.target import open_target


def main(target: str) -> int:
    kw: dict[str, object] = {}
    if target.startswith("s3://"):
        cred_file = os.environ.get(trainer_vars.CREDENTIALS_FILE)
        kw = {"endpoint_url": os.environ.get(trainer_vars.BUCKET_ENDPOINT), "region": DEFAULT_REGION}
        if cred_file:
            kw["credentials"] = lambda: credentials_from_file(cred_file)
    storage = open_target(target, **kw)  # type: ignore[arg-type]
    steps = list_steps(storage)
    statuses = []
    for step in sorted(steps, reverse=True):  # newest first, up to the first valid: the one a resume takes
        statuses.append(validate_step(storage, step, steps[step], deep=True))
        if statuses[-1].valid:
            break
    valid = [s.step for s in statuses if s.valid]
    print(json.dumps({
        "latest_valid": max(valid) if valid else None,
        "checked": [{"step": s.step, "valid": s.valid} for s in statuses],
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
