"""The names of the trainer's environment variables (GPUKIT_*), spelled here and nowhere else.

The controller sets them for each attempt and the trainer reads them; the typed record of the set is
glue.train.run.launch.TrainerEnv (`to_env()` / `from_env()`). `make test` fails on one of these names
written anywhere else in glue/ (tests/unit/test_launch_records.py). A leaf module: every layer of
glue.train and the controller import it.
"""

RUN = "GPUKIT_RUN"
ATTEMPT = "GPUKIT_ATTEMPT"
RESUME = "GPUKIT_RESUME"
CONFIG = "GPUKIT_CONFIG"  # run.yaml's `config:` as JSON
CHECKPOINT = "GPUKIT_CHECKPOINT"
CHECKPOINT_INTERVAL = "GPUKIT_CHECKPOINT_INTERVAL"
KEEP_LAST = "GPUKIT_KEEP_LAST"
OUTPUTS = "GPUKIT_OUTPUTS"
HEARTBEAT_SECONDS = "GPUKIT_HEARTBEAT_SECONDS"
SCRATCH = "GPUKIT_SCRATCH"
BUCKET_NAME = "GPUKIT_BUCKET_NAME"
BUCKET_ENDPOINT = "GPUKIT_BUCKET_ENDPOINT"
BUCKET_REGION = "GPUKIT_BUCKET_REGION"
CREDENTIALS_FILE = "GPUKIT_CREDENTIALS_FILE"  # the bucket keys, a 0600 JSON file on the VM's tmpfs
BUCKET_VIA = "GPUKIT_BUCKET_VIA"  # "mount": the bucket only through the platform's mount (no S3 API)
BUCKET_MOUNT = "GPUKIT_BUCKET_MOUNT"
VM = "GPUKIT_VM"
NODE = "GPUKIT_NODE"
STOP_AT = "GPUKIT_STOP_AT"  # epoch seconds to save and stop by (a serverless execution's cap)
NOTICE_FILE = "GPUKIT_NOTICE_FILE"  # where the backend writes a termination notice on the VM
EVAL_URI = "GPUKIT_EVAL_URI"
EVAL_SHA256 = "GPUKIT_EVAL_SHA256"
HOLD_AT = "GPUKIT_HOLD_AT"  # `glue drill`: "<attempt>:<step>", the step the attempt holds after
WORKDIR = "GPUKIT_WORKDIR"  # the run's unpacked code package on this node
CODE_SHA256 = "GPUKIT_CODE_SHA256"
# `glue memprobe` trials of the user's own command (glue.train.run.probe): records go to this folder on the VM,
# never to the bucket, and the trainer stops itself after PROBE_STEPS whole steps.
PROBE_DIR = "GPUKIT_PROBE_DIR"
PROBE_STEPS = "GPUKIT_PROBE_STEPS"
PROBE_MODE = "GPUKIT_PROBE_MODE"  # "trial" (default) or "breakdown" (on CUDA: a memory snapshot of the last step)
# A Slurm batch job's start (glue.train.run.slurm_job): its JSON, in the job's environment as sbatch keeps it
SLURM_SPEC = "GPUKIT_SLURM_SPEC"
# A multi-node job's rendezvous port, picked on node 0 by the batch script (glue.train.run.slurm_group)
SLURM_RDZV_PORT = "GPUKIT_SLURM_RDZV_PORT"

ALL = (RUN, ATTEMPT, RESUME, CONFIG, CHECKPOINT, CHECKPOINT_INTERVAL, KEEP_LAST, OUTPUTS, HEARTBEAT_SECONDS, SCRATCH,
       BUCKET_NAME, BUCKET_ENDPOINT, BUCKET_REGION, CREDENTIALS_FILE, BUCKET_VIA, BUCKET_MOUNT, VM, NODE, STOP_AT,
       NOTICE_FILE, EVAL_URI, EVAL_SHA256, HOLD_AT, WORKDIR, CODE_SHA256, SLURM_SPEC,
       SLURM_RDZV_PORT, PROBE_DIR, PROBE_STEPS, PROBE_MODE)
