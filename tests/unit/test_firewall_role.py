"""The group_firewall role, run by the real ansible-playbook against a two-VM inventory on this host
(connection local): the rules it renders admit exactly the group's addresses to the kernel's
ephemeral port range (and the half below it, where the stores' ports are picked) and drop new
connections from anyone else, and on the local backend it does nothing at all (local VMs share the
controller's network)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "ansible" / "roles" / "group_firewall"
BIN = Path(sys.executable).parent

PLAY = """
- name: Render the group's firewall rules
  hosts: all
  gather_facts: false
  tasks:
    - name: Work out the addresses
      ansible.builtin.include_role:
        name: group_firewall
        tasks_from: addresses.yml
        public: true
    - name: Render the rules
      ansible.builtin.template:
        src: {template}
        dest: "{out}/{{{{ inventory_hostname }}}}.nft"
        mode: "0644"
- name: Run the whole role on the local backend
  hosts: all
  gather_facts: false
  vars:
    gpukit_backend: local
  roles:
    - group_firewall
"""


def _run(tmp_path: Path, hosts: dict[str, dict[str, object]]) -> subprocess.CompletedProcess[str]:
    common = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inv = {"all": {"hosts": {name: {**common, **v} for name, v in hosts.items()}}}
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inv))
    play = PLAY.format(template=ROLE / "templates" / "group-firewall.nft.j2", out=tmp_path)
    (tmp_path / "play.yml").write_text(play)
    env = {**os.environ, "ANSIBLE_ROLES_PATH": str(ROLE.parent), "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"),
           "ANSIBLE_NOCOLOR": "1", "ANSIBLE_STDOUT_CALLBACK": "default"}
    return subprocess.run([str(BIN / "ansible-playbook"), "-i", str(tmp_path / "inventory.yml"),
                           str(tmp_path / "play.yml")], env=env, capture_output=True, text=True, timeout=180)


def test_rules_admit_exactly_the_group_to_the_ephemeral_ports(tmp_path: Path) -> None:
    proc = _run(tmp_path, {
        "vm-a": {"ansible_host": "203.0.113.7", "ansible_all_ipv4_addresses": ["10.0.0.5", "127.0.0.1"]},
        "vm-b": {"ansible_host": "vm-b.example", "ansible_all_ipv4_addresses": ["10.0.0.6", "172.17.0.1"]},
    })  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    low = str(int(low) // 2)  # the stores' ports, picked below the ephemeral range, are guarded too
    for vm in ("vm-a", "vm-b"):  # every VM holds the same, whole group
        rules = (tmp_path / f"{vm}.nft").read_text()
        assert "elements = { 10.0.0.5, 10.0.0.6, 172.17.0.1, 203.0.113.7 }" in rules, rules
        lines = [line.strip() for line in rules.splitlines()]
        accept = f"tcp dport {low}-{high} ip saddr @peers accept"
        drop = f"tcp dport {low}-{high} ct state new drop"
        assert accept in lines and drop in lines, rules
        # loopback and replies pass before the drop; the table is replaced whole on each load
        assert lines.index('iifname "lo" accept') < lines.index(drop)
        assert lines.index("ct state established,related accept") < lines.index(drop)
        assert lines.index("delete table inet gpukit_group") < lines.index("table inet gpukit_group {")
    # the local backend's play ran the role and skipped it: no nft on this host, and nothing failed
    assert "Open the rendezvous ports to the group's VMs only" in proc.stdout
    assert "failed=0" in proc.stdout and "Install nftables" not in proc.stdout
