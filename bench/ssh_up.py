"""`glue up --backend ssh` of 3 hosts against the same playbook run by hand on 3 others (issue 49: goal <= 1.1x).

    .venv/bin/python bench/ssh_up.py [--rounds 2] [--hosts 3]

Each round starts 2 x N fresh machines outside gpukit (the local backend's nspawn machinery under an owner's
home, with the owner's key, as tests/e2e/test_ssh_hosts.py does) and measures, in alternating order (the
first run of a round pays the colder caches):
- glue: `glue up --backend ssh --hosts A.yaml --vms N --accept-new-host-keys`, everything included (the host
  checks, key pinning, terraform taking the hosts, the playbook with verify, the inventory);
- by hand: on the other N hosts, taken by `glue up ... --no-configure` (not timed: it writes the inventory and
  known_hosts the playbook needs), then `ansible-playbook -i <inventory> ansible/up.yml` in a process of its own,
  with the environment glue gives Ansible (the same Mitogen strategy, ansible.cfg, fact cache) and extra
  variables (the trainer wheel).
Each glue up must have configured all N hosts (its stderr names them), else the bench exits 1.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from glue.cloud.base import VMSpec
from glue.cloud.local.backend import LocalBackend
from glue.infra.ansible_run import ANSIBLE_DIR, converge_vars, runner_env
from glue.infra.inventory import inventory_path
from glue.paths import venv_bin
from tests.kit import remove_kit_home_machines

GLUE = [sys.executable, "-m", "glue.cli"]
GOAL = 1.1


def _owner_key(root: Path) -> Path:
    key = root / "owner_id"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key


def _hosts_file(path: Path, boxes: list[tuple[str, str, int]], key: Path) -> Path:
    path.write_text("hosts:\n" + "".join(f"  - name: {n}\n    address: {a}\n    port: {p}\n    user: root\n"
                                         f"    identity_file: {key}\n" for n, a, p in boxes))
    return path


def _kit(root: Path, name: str) -> tuple[Path, dict[str, str]]:
    home = root / name
    (home / "ansible" / "group_vars").mkdir(parents=True)
    # the machines share this host's network: no group firewall (as in the e2e test)
    (home / "ansible" / "group_vars" / "all.yml").write_text("group_firewall_enabled: false\n")
    return home, {**os.environ, "GPUKIT_HOME": str(home)}


def _glue(env: dict[str, str], *args: str) -> tuple[float, str]:
    t = time.perf_counter()
    done = subprocess.run([*GLUE, *args], env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          check=False)
    if done.returncode != 0:
        raise SystemExit(f"glue {' '.join(args)} failed: {done.stderr[-2000:]}")
    return time.perf_counter() - t, done.stderr


def by_glue(root: Path, hosts: Path, n: int) -> float:
    _, env = _kit(root, "glue-home")
    seconds, said = _glue(env, "up", "--backend", "ssh", "--hosts", str(hosts), "--vms", str(n),
                          "--accept-new-host-keys")
    configured = [f"gpukit-{i}" for i in range(1, n + 1)]
    if not all(vm in said for vm in configured) or "configur" not in said:
        raise SystemExit(f"glue up did not say it configured {configured}:\n{said[-2000:]}")
    _glue(env, "down")
    return seconds


def by_hand(root: Path, hosts: Path, n: int) -> float:
    home, env = _kit(root, "hand-home")
    _glue(env, "up", "--backend", "ssh", "--hosts", str(hosts), "--vms", str(n), "--accept-new-host-keys",
          "--no-configure")
    ansible_env = {**env, **runner_env(home)}
    t = time.perf_counter()
    extra = [a for k, v in converge_vars().items() for a in ("-e", f"{k}={v}")]  # the wheel glue's runs install
    subprocess.run([str(venv_bin() / "ansible-playbook"), "-i", str(inventory_path(home)), *extra,
                    str(ANSIBLE_DIR / "up.yml")], env=ansible_env, check=True, stdin=subprocess.DEVNULL,
                   stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - t
    _glue(env, "down")
    return seconds


def one_round(k: int, n: int) -> tuple[float, float]:
    root = Path(tempfile.mkdtemp(prefix=f"bench-ssh-up-{k}-"))
    owner = LocalBackend(root / "owner")
    key = _owner_key(root)
    pub = key.with_suffix(".pub").read_text().strip()
    try:
        made = [owner.create_vm(VMSpec(f"box-{i}", "none", 0, 10, pub)) for i in range(1, 2 * n + 1)]
        boxes = [(b.name, b.ssh_host, b.ssh_port) for b in made]
        first = _hosts_file(root / "first.yaml", boxes[:n], key)
        second = _hosts_file(root / "second.yaml", boxes[n:], key)
        if k % 2 == 0:
            glue_s, hand_s = by_glue(root, first, n), by_hand(root, second, n)
        else:
            hand_s, glue_s = by_hand(root, first, n), by_glue(root, second, n)
        return glue_s, hand_s
    finally:
        for home in ("glue-home", "hand-home", "owner"):
            if (root / home).exists():
                remove_kit_home_machines(root / home)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--hosts", type=int, default=3)
    args = ap.parse_args()
    ratios = []
    for k in range(args.rounds):
        glue_s, hand_s = one_round(k, args.hosts)
        ratios.append(glue_s / hand_s)
        order = "glue first" if k % 2 == 0 else "playbook first"
        print(f"round {k + 1} ({order}): glue up {glue_s:.1f} s, ansible-playbook up.yml by hand {hand_s:.1f} s, "
              f"{ratios[-1]:.2f}x")
    mean = statistics.mean(ratios)
    print(f"glue up of {args.hosts} ssh hosts / the playbook by hand: {mean:.2f}x over {args.rounds} round(s) "
          f"(goal <= {GOAL}x: {'met' if mean <= GOAL else 'not met'})")


if __name__ == "__main__":
    main()
