"""The oldest Python a VM's trainer runs on is said once in pyproject.toml (requires-python) and once in the
trainer role (trainer_min_python, which refuses an older VM in one line): the two agree."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_the_trainer_role_and_requires_python_agree() -> None:
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    defaults = yaml.safe_load((ROOT / "ansible" / "roles" / "trainer" / "defaults" / "main.yml").read_text())
    assert requires == f">={defaults['trainer_min_python']}", (requires, defaults["trainer_min_python"])


def test_the_vm_side_check_starts_at_that_python() -> None:
    from tests import lint_vm_python

    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    low = lint_vm_python.VM_PYTHONS[0]
    assert requires == f">={low[0]}.{low[1]}"


def _check_python(tmp_path: Path, floor: str) -> subprocess.CompletedProcess[str]:
    """The trainer role's Python check (tasks/python.yml) as the role runs it, on this machine."""
    play = [{"hosts": "localhost", "connection": "local", "gather_facts": False,
             "vars": {"trainer_image_venv": "", "trainer_min_python": floor},
             "tasks": [{"ansible.builtin.import_tasks": str(ROOT / "ansible/roles/trainer/tasks/python.yml")}]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    (tmp_path / "ansible.cfg").write_text("[defaults]\n")
    env = {**os.environ, "ANSIBLE_CONFIG": str(tmp_path / "ansible.cfg"), "ANSIBLE_LOCALHOST_WARNING": "false",
           "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false", "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"), "ANSIBLE_PYTHON_INTERPRETER": sys.executable}
    return subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,",
                           str(tmp_path / "play.yml")], env=env, capture_output=True, text=True, timeout=120)


def test_the_trainer_role_refuses_an_older_python_in_one_line(tmp_path: Path) -> None:
    here = subprocess.run(["python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True,
                          text=True, check=True).stdout.strip()  # the python3 the task runs
    ok = _check_python(tmp_path, "3.10")
    assert ok.returncode == 0, ok.stdout
    refused = _check_python(tmp_path, "3.99")
    assert refused.returncode != 0
    assert f"localhost has Python {here} and gpukit's trainer needs >= 3.99: use an image with a newer python3" \
        in refused.stdout, refused.stdout


def test_the_ssh_hosts_check_takes_that_python_and_refuses_an_older_one() -> None:
    from glue.cloud.ssh import probe
    from glue.cloud.ssh.hosts import HostEntry

    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == ">=" + ".".join(map(str, probe.MIN_PYTHON))
    host = HostEntry(address="10.0.0.5", identity_file="~/.ssh/id_ed25519")
    facts = {"sudo": "yes", "os": "ubuntu 22.04", "disk_kb": str(50 * 1024 ** 2)}
    assert probe._problems(host, {**facts, "python": "3.10"}) == []  # Ubuntu 22.04's own python3
    [old] = probe._problems(host, {**facts, "python": "3.9"})
    assert old.startswith("Python 3.9 found, gpukit's VM side needs python3 >= 3.10"), old
