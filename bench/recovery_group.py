"""A 2-VM torchrun group (gloo, 1 process per VM) loses a VM: time from the loss to the group
training again, by phase, against a baseline measured in the same run: the cold start of the same
2-node group (trainer start -> first step) on configured VMs.

Flow: up (2 VMs) -> deploy tiny_gpt --nodes 2 -> destroy node 1's VM at step 50 -> glue recover
(replace it, re-form the group, verify every rank) -> phases from the recovery record -> down. The new VM
configures itself at first boot from the configuration seed that up took; the bench stops when it did not
(bench/path_check.py).
"""

from __future__ import annotations

from recovery import cold_start, lose_last_vm_and_recover, remove_everything, temp_home  # bench/recovery.py
from rich.console import Console

from glue.cluster import current
from glue.operations import lifecycle
from glue.paths import PROJECT_ROOT
from glue.runs import deploy as deploy_mod
from glue.runs.vm_group import GroupSpec

PHASES = ("detect", "validate", "provision", "configure", "verify", "restore", "replay")


def main() -> None:
    home = temp_home("gpukit-bench-grp-")
    console = Console(stderr=True, quiet=True)
    cfg_path = PROJECT_ROOT / "examples" / "tiny_gpt.yaml"
    group = GroupSpec(nodes=2)
    try:
        lifecycle.up(home, current.ClusterConfig(vms=2), console)
        cold, deploy_total = cold_start(home, console, "bench-grp-cold", None, group)
        deploy_mod.deploy(home, "bench-grp", cfg_path, None, False, console,
                          config_overrides={"steps": 400, "step_sleep": 0.05}, group=group)
        result, _floor = lose_last_vm_and_recover(home, console, "bench-grp", "seed")
    finally:
        remove_everything(home)
    s = result["seconds"]
    again = sum(s[p] or 0.0 for p in PHASES[:-1])
    print(f"{'phase (2-node group, node 1 VM lost)':44} {'seconds':>8}")
    for phase in PHASES:
        print(f"{phase:44} {s[phase] if s[phase] is not None else float('nan'):8.2f}")
    print(f"{'VM loss -> group training again':44} {again:8.2f}")
    print(f"{'baseline: cold group start (start -> step 1)':44} {cold:8.2f}   (deploy total {deploy_total:.1f}s)")
    print(f"{'restore vs cold group start (ratio)':44} {s['restore'] / cold:8.2f}x")
    print(f"work lost: {result['work_lost']['steps']} steps; every rank verified: {result['verified']}")


if __name__ == "__main__":
    main()
