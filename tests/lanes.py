"""`make test`'s lanes: which pytest-xdist worker runs which test file (`-n 5 --lanes`, tests/conftest.py).

Most of the suite's time is waiting on VMs and trainers; on 2 cores its CPU is the limit. Each lane is one
worker running its files in order. Only the serial lane runs at normal priority: it holds the timing-sensitive
tests (stall detection, the 2-node group, the watcher's budgets), which must not be starved. Every other lane's
worker is reniced, and so is everything it starts (glue, terraform, the VMs, their trainers), so it takes only
the CPU the serial lane leaves:
- side: the unit tests (first: they run while the image is baked, which every VM test waits for), the
  checkpoint library and the framework integrations (CPU-bound, no VM), the qemu boot;
- cluster: tests on a session cluster of their own that wait on runs, not on step timing (drills, memprobe,
  own jobs, placement, packed environments, Lyceum's serverless runs);
- slurm: the Slurm clusters and their runs (Slurm's states under deadlines of minutes); `make demo` and memprobe's
  trial-process units (placed by TESTS below);
- own-vms: tests with VMs or clusters of their own (Ansible, the cluster's lifecycle, Lyceum's emulator, the ssh
  hosts, a user's Terraform module).
The serial lane is every test not named here, in order.
"""

from __future__ import annotations

SIDE = frozenset({
    "tests/integration/test_qemu.py",
    "tests/integration/test_qemu_seed.py",  # `stress`: only in `make test-all`
    "tests/integration/test_qemu_slurm.py",  # `stress`: only in `make test-all`
    "tests/integration/test_ckpt_kill.py",
    "tests/integration/test_ckpt_workers.py",
    "tests/integration/test_ckpt_s3.py",
    "tests/integration/test_ckpt_resume.py",
    "tests/integration/test_ckpt_transfer.py",
    "tests/integration/test_ckpt_ddp.py",
    "tests/integration/test_ckpt_mount.py",
    "tests/integration/test_restore_pipeline.py",
    "tests/integration/test_bucket_reads.py",
    "tests/integration/test_own_bucket.py",  # your own bucket against loopback S3 servers: no VMs
    "tests/integration/test_controller_install.py",  # a wheel into a fresh venv, offline: no VMs
    "tests/integration/test_ckpt_sharded.py",
    "tests/integration/test_ckpt_sharded_kill.py",
    "tests/integration/test_hf_trainer.py",
    "tests/integration/test_lightning_trainer.py",
    "tests/integration/test_memprobe_run.py",  # trial processes on this machine, no VM
})
SIDE_DIRS = ("tests/unit/",)
CLUSTER = frozenset({
    "tests/e2e/test_drill_frameworks.py",
    "tests/e2e/test_frameworks.py",  # `stress`
    "tests/e2e/test_memprobe_own_job.py",
    "tests/e2e/test_own_job.py",
    "tests/e2e/test_report_drill.py",
    "tests/integration/test_placement.py",
    "tests/integration/test_workspace_pack_vms.py",
    "tests/integration/test_lyceum_serverless.py",
    "tests/integration/test_lyceum_executions.py",
})
SLURM = frozenset({
    "tests/integration/test_slurm_cluster.py",
    "tests/e2e/test_slurm_runs.py",
    "tests/e2e/test_slurm_head.py",
})
OWN_VMS = frozenset({
    "tests/integration/test_ansible.py",
    "tests/integration/test_cluster.py",
    "tests/integration/test_doctor.py",
    "tests/integration/test_image_build.py",
    "tests/integration/test_lyceum_e2e.py",
    "tests/integration/test_lyceum_users.py",
    "tests/integration/test_lyceum_spot.py",
    "tests/integration/test_lyceum_refresh.py",  # expiry made by the emulator, not waited for on the clock
    "tests/integration/test_keep_group.py",
    "tests/integration/test_machines.py",
    "tests/integration/test_provider.py",
    "tests/integration/test_up_converge.py",
    "tests/integration/test_config_seed.py",
    "tests/integration/test_own_bucket_vms.py",  # `stress`: only in `make test-all`
    "tests/e2e/test_ssh_hosts.py",  # machines of their own, started outside gpukit
    "tests/e2e/test_user_module.py",
})
# Tests (or files) placed apart from their file's (folder's) lane, to even the lanes: the demo on a cluster of its
# own, the memprobe trials (processes here, no VM), and the run tests of the session's cluster whose outcome no
# timing decides (a refusal, a class recorded at the trainer's exit) on the cluster lane's session cluster.
TESTS = {
    "tests/e2e/test_recovery.py::test_make_demo_passes_and_records_the_recovery": "slurm",
    "tests/unit/test_memprobe_frameworks.py": "slurm",
    "tests/unit/test_memprobe_trials.py": "slurm",
    "tests/unit/test_memprobe_probe.py": "slurm",
    **{f"tests/integration/test_runs.py::{name}": "cluster" for name in (
        "test_outputs_on_vm_disk_refused_before_start",
        "test_mount_path_accepted_when_live_refused_when_unmounted",
        "test_finished_without_required_outputs_is_export_missing",
        "test_a_bad_trainer_config_is_one_line_in_the_log_and_a_user_error",
        "test_bad_run_config_is_one_line_and_writes_nothing",
        "test_bad_memory_limit_is_one_line_and_writes_nothing",
        "test_a_live_run_blocks_resume_and_an_up_that_would_remove_its_vm",
    )},
}
LANES = ("serial", "side", "cluster", "slurm", "own-vms")
NICE = 10  # every lane but the serial one


def lane_of(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    for placed in (nodeid.split("[", 1)[0], path):
        if placed in TESTS:
            return TESTS[placed]
    if path in SIDE or path.startswith(SIDE_DIRS):
        return "side"
    for name, files in (("cluster", CLUSTER), ("slurm", SLURM), ("own-vms", OWN_VMS)):
        if path in files:
            return name
    return "serial"
