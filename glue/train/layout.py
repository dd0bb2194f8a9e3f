"""Every key glue writes or reads in the bucket, spelled here and nowhere else (submitit's JobPaths is the model).

Shared by the VM (glue.train: trainer, supervisor, checkpointer, workspace) and the controller
(glue.runs.store.RunStore, through which everything above it reads and writes a run's records), so both
sides build the same names. Light on purpose (no torch, no other glue module): the controller imports it
on every command. `make lint` (tests/lint_bucket_keys.py) fails on a bucket key spelled anywhere else in
glue/; the record fields are in docs/design.md, section 4 "Bucket layout", which this table mirrors.

At the bucket's root (code/, wheels/ and envs/ content-addressed: written once, never changed, never deleted):

    code/<sha256>.tar                          code_key              a run's workdir, a deterministic tar
    code/<sha256>.json                         code_index_key        its file list (path, size), written first
    wheels/<set>/<file>.whl                    wheel_key             one wheel of a resolved requirements set
    wheels/<set>/index.json                    wheelhouse_index_key  the set (pins, sha256s); written last
    envs/<set>/<sha256>.tar                    env_pack_key          the set's virtualenv, packed once on a VM
    envs/<set>/index.json                      env_pack_index_key    that pack (sha256, size, path); written last
    runs/<run>/                                run_prefix, run_uri   everything about one run, below
    gpukit-doctor/<host>-<hex>                 doctor_probe_key      glue doctor's probe, deleted again at once

Under runs/<run>/ (the keys below are relative to it, as RunStore and the trainer's store take them):

    manifest.json                              MANIFEST              glue deploy, once per run
    attempts/<n>.json                          attempt_key           glue deploy / recovery; the monitor classifies
    attempts/<n>.exit.json                     exit_key              supervisor exit record, node 0
    attempts/<n>.launch.json                   launch_key            a serverless attempt's launch spec (no secrets)
    attempts/<n>.exit.node<k>.json             exit_key              … node k of a multi-VM run
    attempts/<n>.error.rank<r>[.x<gg>].json    error_key             trainer error file (errors_prefix)
    attempts/<n>.notice.rank<r>.json           notice_key            a termination notice acted on (notices_prefix)
    heartbeat.json, heartbeat.rank<r>.json     heartbeat_key         a rank's last heartbeat (HEARTBEATS_PREFIX)
    warm-imports.json                          WARM_IMPORTS          the library modules rank 0 loaded (warm spares)
    metrics/<aaa>-r<r>[-x<gg>]-<ppppp>.jsonl   metrics_key           per-step records (METRICS_PREFIX)
    metrics/<aaa>-r<r>[-x<gg>]-99999-heartbeat.jsonl  carried_metrics_key  steps only a heartbeat carried
    logs/<aaa>-[n<k>-]<ppppp>.log              log_key, log_prefix   the supervisor's log parts (LOGS_PREFIX)
    incidents/<ts>-<class>.json                incident_key          failures: monitor, watcher, checkpointer
    recoveries/<k>.json                        recovery_key          one per glue recover (RECOVERIES_PREFIX)
    watch/state.json                           WATCH_STATE           glue watch: budgets, retries, last action
    evaluation/<aaa>-<step>.json               evaluation_key        record_evaluation (EVALUATIONS_PREFIX)
    report.html                                REPORT                glue report's latest page
    drill.json                                 DRILL                 a drill run's verdict
    memprobe/<ts>.json, <ts>.snapshot.pickle   memprobe_key, memprobe_snapshot_key   glue memprobe --run
    lease/<gen>/claim-<token>.json             lease_claim_key       a controller's claim (lease_gen_prefix)
    lease/<gen>/released.json                  lease_released_key    the winner of <gen> is done
    outputs/…                                  OUTPUTS               the conventional output destination

Relative to a run's checkpoint target (conventionally runs/<run>, so beside the records above):

    ckpt/step-<N>/<component>[.rank<r>].pt     step_prefix + checkpoint_object_key
    ckpt/step-<N>/rank<r>.json                 step_prefix + rank_part_key   rank r's part of a save
    ckpt/step-<N>/COMMIT.json                  commit_key (COMMIT)   written last: from then on the step counts
    ckpt/step-<N>/REJECTED.json                REJECTED              glue rejected the committed step
    ckpt-invalid/<ts>/step-<N>/…               invalid_step_prefix   a skipped step's objects, moved aside
    incidents/<ts>-ckpt_<kind>.json            incident_key          the checkpointer's incidents

<ts> in a key is the compact UTC form `20250102T030405.123456Z` (key_stamp); records inside carry ISO-8601.
"""

from __future__ import annotations

import re

# -- bucket root ----------------------------------------------------------------------------------------
CODE_PREFIX = "code/"
WHEELS_PREFIX = "wheels/"
ENVS_PREFIX = "envs/"
RUNS_PREFIX = "runs/"
DOCTOR_PREFIX = "gpukit-doctor/"  # the only keys glue doctor writes (and deletes again)


def code_key(sha256: str) -> str:
    """The packed workdir (an uncompressed, deterministic tar) whose sha256 is `sha256`."""
    return f"{CODE_PREFIX}{sha256}.tar"


def code_index_key(sha256: str) -> str:
    """The package's file list (path, size), for `glue deploy --dry-run` and the command check."""
    return f"{CODE_PREFIX}{sha256}.json"


def wheelhouse_prefix(set_sha256: str) -> str:
    """Every wheel of one resolved dependency set, and its index.json (written last: the set is complete)."""
    return f"{WHEELS_PREFIX}{set_sha256}/"


def wheel_key(set_sha256: str, wheel: str) -> str:
    """One wheel file (its own name, `<dist>-<version>-….whl`) of a dependency set."""
    return wheelhouse_prefix(set_sha256) + wheel


def wheelhouse_index_key(set_sha256: str) -> str:
    return f"{wheelhouse_prefix(set_sha256)}index.json"


def env_pack_key(set_sha256: str, pack_sha256: str) -> str:
    """A dependency set's virtualenv as one tar (named by its own sha256: two VMs packing at once never
    overwrite each other's), unpacked at the same path on every VM (glue.train.workspace.environment)."""
    return f"{ENVS_PREFIX}{set_sha256}/{pack_sha256}.tar"


def env_pack_index_key(set_sha256: str) -> str:
    """Which pack of the set to use, with its sha256 (written after the pack: the pack is complete)."""
    return f"{ENVS_PREFIX}{set_sha256}/index.json"


def run_prefix(run: str) -> str:
    """`runs/<run>/`: the bucket key every record of the run starts with."""
    return f"{RUNS_PREFIX}{run}/"


def run_uri(bucket: str, run: str) -> str:
    """`s3://<bucket>/runs/<run>`: the run's records as a storage target (the trainer's, the supervisor's)."""
    return f"s3://{bucket}/{run_prefix(run).rstrip('/')}"


def run_of_prefix(prefix: str) -> str | None:
    """<run> for a listed `runs/<run>/` prefix; None for anything else."""
    if not prefix.startswith(RUNS_PREFIX) or not prefix.endswith("/"):
        return None
    run = prefix[len(RUNS_PREFIX):-1]
    return run if run and "/" not in run else None


def doctor_probe_key(host: str, token: str) -> str:
    """glue doctor's bucket probe: written, read back and deleted."""
    return f"{DOCTOR_PREFIX}{host}-{token}"


def key_stamp(iso_utc: str) -> str:
    """The compact form of an ISO-8601 UTC time (`2025-01-02T03:04:05.123456Z`) that key names carry."""
    return iso_utc.replace(":", "").replace("-", "")


# -- a run's records (relative to runs/<run>/) --------------------------------------------------------
MANIFEST = "manifest.json"
ATTEMPTS_PREFIX = "attempts/"
HEARTBEATS_PREFIX = "heartbeat"  # heartbeat.json and heartbeat.rank<r>.json
METRICS_PREFIX = "metrics/"
LOGS_PREFIX = "logs/"
INCIDENTS_PREFIX = "incidents/"
RECOVERIES_PREFIX = "recoveries/"
EVALUATIONS_PREFIX = "evaluation/"
MEMPROBE_PREFIX = "memprobe/"
LEASE_PREFIX = "lease/"
WATCH_STATE = "watch/state.json"
REPORT = "report.html"
DRILL = "drill.json"
WARM_IMPORTS = "warm-imports.json"  # glue.train.run.warm_imports: a spare's warm process preloads them
OUTPUTS = "outputs"  # the conventional output destination, s3://<bucket>/runs/<run>/outputs


def attempt_key(attempt: int) -> str:
    """The attempt record `glue deploy` / recovery write for attempt n (before its trainer starts)."""
    return f"{ATTEMPTS_PREFIX}{attempt}.json"


def attempt_of(key: str) -> int | None:
    """n for `attempts/<n>.json` (an attempt record); None for any other key (error, exit records)."""
    name = key.rsplit("/", 1)[-1]
    stem = name[: -len(".json")] if name.endswith(".json") else ""
    return int(stem) if stem.isdigit() else None


def launch_key(attempt: int) -> str:
    """A serverless attempt's launch spec (command, environment without secrets), read by the execution."""
    return f"{ATTEMPTS_PREFIX}{attempt}.launch.json"


def exit_key(attempt: int, node: int) -> str:
    """The supervisor's exit record; node 0 (and a single-node run) keeps the plain name."""
    return f"{ATTEMPTS_PREFIX}{attempt}.exit.json" if node == 0 else f"{ATTEMPTS_PREFIX}{attempt}.exit.node{node}.json"


def errors_prefix(attempt: int) -> str:
    """Every rank's and restart round's error file of an attempt (error_key) starts so."""
    return f"{ATTEMPTS_PREFIX}{attempt}.error"


def error_key(attempt: int, rank: int, restart: int) -> str:
    """One error file per rank and torchrun restart (a restart must not overwrite the first error)."""
    return f"{errors_prefix(attempt)}.rank{rank}" + (f".x{restart:02d}" if restart else "") + ".json"


def notices_prefix(attempt: int) -> str:
    """Every rank's termination-notice record of an attempt (notice_key) starts so."""
    return f"{ATTEMPTS_PREFIX}{attempt}.notice."


def notice_key(attempt: int, rank: int) -> str:
    """What rank `rank` did on a termination notice: checkpointed at a step, exited PREEMPTED_EXIT."""
    return f"{notices_prefix(attempt)}rank{rank}.json"


def heartbeat_key(rank: int) -> str:
    return f"{HEARTBEATS_PREFIX}.json" if rank == 0 else f"{HEARTBEATS_PREFIX}.rank{rank}.json"


def metrics_key(attempt: int, rank: int, restart: int, part: int, suffix: str = "") -> str:
    """Sorted by name = written in order: attempt, then torchrun restart, then part."""
    again = f"x{restart:02d}-" if restart else ""
    return f"{METRICS_PREFIX}{attempt:03d}-r{rank}-{again}{part:05d}{suffix}.jsonl"


def carried_metrics_key(attempt: int, rank: int, restart: int) -> str:
    """The steps only a rank's last heartbeat carried, saved as the final part of that attempt and round
    (sorted after every part it wrote) before a new attempt's first heartbeat replaces it."""
    return metrics_key(attempt, rank, restart, 99999, "-heartbeat")


def metrics_of_rank(key: str, rank: int) -> bool:
    """Whether a metrics part (metrics_key) is rank `rank`'s."""
    return key.startswith(METRICS_PREFIX) and f"-r{rank}-" in key


def log_prefix(attempt: int | None = None, node: int = 0) -> str:
    """Every log part of an attempt on a node (every attempt's: attempt None) starts so."""
    if attempt is None:
        return LOGS_PREFIX
    return f"{LOGS_PREFIX}{attempt:03d}-" + (f"n{node}-" if node else "")


def log_key(attempt: int, node: int, part: int) -> str:
    """Part `part` (from 1) of the supervisor's log on a node; sorted by name = written in order."""
    return f"{log_prefix(attempt, node)}{part:05d}.log"


def log_node(key: str, attempt: int) -> int | None:
    """The node a log part of `attempt` (log_key) came from; None for a key that is not one."""
    head = log_prefix(attempt)
    if not key.startswith(head):
        return None
    rest = key[len(head):]  # node 0 keeps the single-node names: <attempt>-<part>.log
    if rest[:1].isdigit():
        return 0
    node = re.match(r"n(\d+)-", rest)
    return int(node.group(1)) if node else None


def incident_key(stamp: str, kind: str) -> str:
    """One incident; `stamp` is key_stamp of its time, `kind` its class (vm_lost, ckpt_corrupt, …)."""
    return f"{INCIDENTS_PREFIX}{stamp}-{kind}.json"


def recovery_key(k: int) -> str:
    """The k-th recovery record of the run (from 1)."""
    return f"{RECOVERIES_PREFIX}{k}.json"


def recovery_number(key: str) -> int:
    """k of `recoveries/<k>.json` (0 for a key of another shape: sorted first)."""
    stem = key.rsplit("/", 1)[-1].split(".")[0]
    return int(stem) if stem.isdigit() else 0


def evaluation_key(attempt: int, step: int) -> str:
    """Sorted by name = by attempt, then step."""
    return f"{EVALUATIONS_PREFIX}{attempt:03d}-{step:09d}.json"


def memprobe_key(stamp: str) -> str:
    """A `glue memprobe --run` report."""
    return f"{MEMPROBE_PREFIX}{stamp}.json"


def memprobe_snapshot_key(stamp: str) -> str:
    """The CUDA memory snapshot beside a memprobe report."""
    return f"{MEMPROBE_PREFIX}{stamp}.snapshot.pickle"


_CLAIM, _RELEASED = "claim-", "released.json"


def lease_gen_prefix(gen: int | None = None) -> str:
    """Every entry of one lease generation (of every generation: gen None) starts so."""
    return LEASE_PREFIX if gen is None else f"{LEASE_PREFIX}{gen:06d}/"


def lease_claim_name(token: str) -> str:
    """A claim's name within its generation (as lease_entry gives it)."""
    return f"{_CLAIM}{token}.json"


def lease_claim_key(gen: int, token: str) -> str:
    return lease_gen_prefix(gen) + lease_claim_name(token)


def lease_released_key(gen: int) -> str:
    return f"{lease_gen_prefix(gen)}{_RELEASED}"


def lease_entry(key: str) -> tuple[int, str] | None:
    """(gen, entry name) for a key under lease/; None for anything else."""
    if not key.startswith(LEASE_PREFIX):
        return None
    gen, _, name = key[len(LEASE_PREFIX):].partition("/")
    return (int(gen), name) if gen.isdigit() else None


def is_lease_claim(name: str) -> bool:
    """Whether a lease entry's name (lease_entry) is a claim."""
    return name.startswith(_CLAIM)


def is_lease_release(name: str) -> bool:
    return name == _RELEASED


# -- relative to a checkpoint target ------------------------------------------------------------------
CKPT_PREFIX = "ckpt/"
INVALID_PREFIX = "ckpt-invalid/"
COMMIT = "COMMIT.json"
REJECTED = "REJECTED.json"
_STEP_RE = re.compile(r"^step-(\d+)$")


def step_prefix(step: int) -> str:
    """`ckpt/step-<N>/`: every object of the step's checkpoint."""
    return f"{CKPT_PREFIX}step-{step}/"


def step_of_dir(name: str) -> int | None:
    """N for a listed step directory's name `step-<N>`; None for anything else."""
    m = _STEP_RE.match(name)
    return int(m.group(1)) if m else None


def commit_key(step: int) -> str:
    """The step's COMMIT.json (relative to the target), written last."""
    return step_prefix(step) + COMMIT


def commit_step(key: str) -> int | None:
    """N for `ckpt/step-<N>/COMMIT.json`; None for any other key."""
    if not key.startswith(CKPT_PREFIX):
        return None
    step_dir, _, name = key[len(CKPT_PREFIX):].partition("/")
    return step_of_dir(step_dir) if name == COMMIT else None


def checkpoint_object_key(component: str, rank: int | None) -> str:
    """A component's object within the step directory: shared state, or one rank's."""
    return f"{component}.pt" if rank is None else f"{component}.rank{rank}.pt"


def rank_part_key(rank: int) -> str:
    """Rank r's part of a save (r >= 1): the objects it wrote, for rank 0 to list in COMMIT.json."""
    return f"rank{rank}.json"


def invalid_step_prefix(stamp: str, step: int) -> str:
    """Where a skipped step's objects are kept (one folder per restore, `stamp` its key_stamp)."""
    return f"{INVALID_PREFIX}{stamp}/step-{step}/"


# The names above, for tests/lint_bucket_keys.py (`make lint`): a string literal in glue/ that spells one
# of these as a key (a segment at a path boundary, a file name as the whole string or after "/") must be
# built here instead. Key segments are "<name>/"; file names are whole names.
KEY_SEGMENTS = tuple(p.rstrip("/") for p in (
    CODE_PREFIX, WHEELS_PREFIX, ENVS_PREFIX, RUNS_PREFIX, DOCTOR_PREFIX, ATTEMPTS_PREFIX, METRICS_PREFIX, LOGS_PREFIX,
    INCIDENTS_PREFIX, RECOVERIES_PREFIX, EVALUATIONS_PREFIX, MEMPROBE_PREFIX, LEASE_PREFIX, CKPT_PREFIX, INVALID_PREFIX,
    WATCH_STATE.split("/")[0] + "/", OUTPUTS + "/"))
KEY_FILES = (MANIFEST, COMMIT, REJECTED, REPORT, DRILL, heartbeat_key(0), _RELEASED)
