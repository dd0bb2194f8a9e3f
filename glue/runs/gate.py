"""The scale gate: a group of N > 1 VMs only after a smaller run of the same code met its acceptance
criteria and a drill of the same code passed (issue 17: scale only once the small run and its recovery
are both proven). Same code = the same workdir package (`workdir.sha256`) for a run that ships one, else the same gpukit
git commit recorded in the manifests (`code.git_sha`)."""

from __future__ import annotations

from dataclasses import dataclass

from glue.bucket_access import BucketCredentials, BucketInfo
from glue.runs.acceptance import run_acceptance, thresholds_of
from glue.runs.records import Manifest
from glue.runs.store import RunStore, run_ids


@dataclass
class Validation:
    accepted_run: str | None
    passed_drill: str | None

    @property
    def ok(self) -> bool:
        return self.accepted_run is not None and self.passed_drill is not None

    def missing(self) -> str:
        gaps = []
        if self.accepted_run is None:
            gaps.append("no smaller run of this code met its acceptance criteria (run.yaml evaluation.metrics)")
        if self.passed_drill is None:
            gaps.append("no drill of this code passed (`glue drill --run X`)")
        return " and ".join(gaps)


def _same_code(manifest: Manifest, git_sha: str | None, workdir_sha256: str | None) -> bool:
    if workdir_sha256:
        return bool((manifest.workdir or {}).get("sha256") == workdir_sha256)
    return bool(not manifest.workdir and (manifest.code or {}).get("git_sha") == git_sha)


def nodes_of_manifest(manifest: Manifest) -> int:
    dist = manifest.distributed
    return int(dist.get("nodes", 1)) if isinstance(dist, dict) else 1


def validation(info: BucketInfo, creds: BucketCredentials, git_sha: str | None, nodes: int,
               workdir_sha256: str | None = None) -> Validation:
    """The first accepted smaller run and passed drill of the same code in the bucket: the same workdir
    package (`workdir_sha256`: the user's own code) when the run ships one, else gpukit's commit `git_sha`."""
    found = Validation(None, None)
    if not git_sha and not workdir_sha256:
        return found
    for rid in run_ids(info, creds):
        store = RunStore(info, creds, rid)
        manifest = store.read_manifest_if_any()
        if not manifest or not _same_code(manifest, git_sha, workdir_sha256) or nodes_of_manifest(manifest) >= nodes:
            continue
        if found.passed_drill is None and (store.drill() or {}).get("passed"):
            found.passed_drill = rid
        # Only a run with acceptance criteria can be accepted: skip the others' records.
        if found.accepted_run is None and thresholds_of(manifest) and run_acceptance(store).accepted:
            found.accepted_run = rid
        if found.ok:
            break
    return found
