"""Machines the user already has (`glue up --backend ssh --hosts FILE`): three machines started outside gpukit,
as a third party would (the local backend's nspawn machinery under a home of their own, with their owner's
SSH key, not the kit's), in a hosts file. `glue up --vms 2 --spares 1` configures all three, the third as a
warm spare; a run's host stops answering; its watcher (`glue watch`) moves the run onto the spare, verified,
with no terraform and no playbook; the lost host, back, is released of gpukit's leftovers by the next `glue up` and
becomes the new spare; `glue down` leaves all three machines running with gpukit's units and files gone."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest
import yaml

from glue.cloud.base import VMRecord, VMSpec
from glue.cloud.local.backend import LocalBackend
from glue.cloud.ssh.claim import KEY_MARK
from glue.operations import spares
from glue.storage import bucket as bucket_store
from glue.train import layout
from glue.train.run.start import WARM_DIR
from glue.train.workspace import pins
from tests.e2e.test_own_job import INSTALLED, project
from tests.e2e.test_slurm_runs import wait
from tests.e2e.test_watch import Watchers
from tests.integration.test_runs import here, s3, wait_for
from tests.kit import Kit, explain, remove_kit_home_machines

pytestmark = pytest.mark.e2e

LEFT = ("/etc/gpukit", "/usr/local/sbin/gpukit-mount", "/etc/systemd/system/gpukit-mount.service",
        "/var/cache/gpukit-rclone")


class Owner:
    """The machines' owner: their own home for the machines, their own SSH key."""

    def __init__(self, root: Path) -> None:
        self.home = root / "owner"
        self.home.mkdir()
        self.key = root / "owner_id"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key)], check=True)
        self.backend = LocalBackend(self.home)
        self.boxes: list[VMRecord] = []

    def start(self, n: int) -> None:
        pub = (self.key.with_suffix(".pub")).read_text().strip()
        self.boxes = [self.backend.create_vm(VMSpec(f"box-{i}", "none", 0, 10, pub)) for i in range(1, n + 1)]

    def ssh(self, box: VMRecord, command: str, user: str = "root") -> tuple[int, str]:
        client = paramiko.SSHClient()
        client.set_missing_host_key_policy(paramiko.AutoAddPolicy())  # the owner's own machine, just booted
        client.connect(box.ssh_host, port=box.ssh_port, username=user, key_filename=str(self.key),
                       look_for_keys=False, allow_agent=False, timeout=10)
        try:
            _, out, err = client.exec_command(command, timeout=60)
            return out.channel.recv_exit_status(), out.read().decode() + err.read().decode()
        finally:
            client.close()

    def processes(self, box: VMRecord) -> list[int]:
        """Every process of the machine (nspawn and all below it), as this host sees them."""
        state = json.loads((self.backend.vms_dir / box.id / "state.json").read_text())
        todo, seen = [int(state["unshare_pid"])], []
        while todo:
            pid = todo.pop()
            seen.append(pid)
            for task in Path(f"/proc/{pid}/task").glob("*"):
                try:
                    todo += [int(c) for c in (task / "children").read_text().split()]
                except OSError:
                    continue
        return seen

    def hosts_file(self, path: Path, user: str = "root", extra: dict[str, str] | None = None) -> Path:
        """The first three machines (the fourth is the bastion); `extra`: more lines of a machine's entry."""
        path.write_text("hosts:\n" + "".join(
            f"  - name: {b.name}\n    address: {b.ssh_host}\n    port: {b.ssh_port}\n    user: {user}\n"
            f"    identity_file: {self.key}\n" + (extra or {}).get(b.name, "") for b in self.boxes[:3]))
        return path

    def stopped(self, box: VMRecord) -> contextlib.AbstractContextManager[list[int]]:
        return _stopped(self.processes(box))


@contextlib.contextmanager
def _stopped(pids: list[int]) -> Iterator[list[int]]:
    """The machine's processes stopped (SIGSTOP): it hangs, as one that drops off the network; back after."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # one that ended since it was listed needs no stop
            os.kill(pid, signal.SIGSTOP)
    try:
        yield pids
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


@pytest.fixture(scope="module")
def owner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Owner]:
    who = Owner(tmp_path_factory.mktemp("ssh-hosts"))
    try:
        who.start(4)  # box-4: the owner's bastion, not in the hosts file
        yield who
    finally:
        for box in who.boxes:
            for pid in who.processes(box):  # a test that failed while a machine was stopped
                try:
                    os.kill(pid, signal.SIGCONT)
                except OSError:
                    pass
        remove_kit_home_machines(who.home)


def _kit(root: Path) -> Kit:
    home = root / "kit"
    home.mkdir()
    # These machines share this host's network (as the local backend's do): no group firewall rules here.
    (home / "ansible" / "group_vars").mkdir(parents=True)
    (home / "ansible" / "group_vars" / "all.yml").write_text("group_firewall_enabled: false\n")
    return Kit(home=home, env={**os.environ, "GPUKIT_HOME": str(home)})


def test_a_host_without_passwordless_sudo_is_one_line(owner: Owner, tmp_path: Path) -> None:
    box = owner.boxes[0]
    rc, out = owner.ssh(box, "id alice >/dev/null 2>&1 || useradd -m -s /bin/sh alice; "
                             "install -d -o alice -m 700 ~alice/.ssh; "
                             "install -o alice -m 600 /root/.ssh/authorized_keys ~alice/.ssh/authorized_keys")
    assert rc == 0, out
    kit = _kit(tmp_path)
    hosts = owner.hosts_file(tmp_path / "hosts.yaml", user="alice")
    res = kit.glue("up", "--backend", "ssh", "--hosts", str(hosts), "--vms", "1", "--accept-new-host-keys",
                   check=False)
    assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr
    assert f"FAIL box-1 (alice@127.0.0.1:{box.ssh_port}): alice cannot sudo without a password" in res.stderr
    assert "NOPASSWD" in res.stderr and "nothing was configured" in res.stderr
    assert not (kit.home / "terraform").exists()  # terraform never ran
    remove_kit_home_machines(kit.home)


@pytest.mark.timeout(900)
def test_runs_recover_onto_a_warm_spare_host_of_the_file(owner: Owner, tmp_path: Path) -> None:
    kit, fast = _kit(tmp_path), None
    watchers = Watchers(kit, tmp_path, ["mine"])
    # box-3 (the warm spare the run moves to) is behind the owner's bastion, box-4, and its owner names its GPU
    # model (the count is found: none on these machines)
    bastion = owner.boxes[3]
    hosts = owner.hosts_file(tmp_path / "hosts.yaml", extra={
        "box-3": f"    proxy_jump: root@{bastion.ssh_host}:{bastion.ssh_port}\n    labels: {{gpu_type: a10}}\n"})
    try:
        res = kit.glue("up", "--backend", "ssh", "--hosts", str(hosts), "--vms", "2", "--spares", "2",
                       "--accept-new-host-keys", check=False, timeout=300)
        assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr
        assert f"--vms 2 --spares 2: only 3 host(s) of {hosts} pass the checks" in " ".join(res.stderr.split())
        assert not (kit.home / "terraform" / "ssh" / "terraform.tfstate").exists()  # nothing taken

        t0 = time.monotonic()
        res = kit.glue("up", "--backend", "ssh", "--hosts", str(hosts), "--vms", "2", "--spares", "1",
                       "--accept-new-host-keys", timeout=600)
        print(f"glue up of 2 ssh hosts and a warm spare: {time.monotonic() - t0:.1f} s")
        assert [ln.split()[1] for ln in res.stderr.splitlines() if ln.startswith("ok ")] == ["box-1", "box-2",
                                                                                               "box-3"], res.stderr
        fast = here(kit)
        vms = {v["name"]: v["id"] for v in json.loads(fast.glue("status", "--json").stdout)["vms"]}
        assert vms == {"gpukit-1": "box-1", "gpukit-2": "box-2", "gpukit-spare-1": "box-3"}  # the file's order
        assert owner.ssh(owner.boxes[2], "ls /etc/gpukit")[0] == 0  # the spare is configured (through the jump)

        # the user's own project with its requirements: once deployed, the warm spare holds the set's packed
        # environment and a warm trainer process in it, which loads what the run recorded it imported
        proj, _ = project(tmp_path)
        spec = yaml.safe_load((proj / "run.yaml").read_text())
        spec["config"].update(steps=300, step_sleep=0.1)  # long enough to be lost after the spare loaded its imports
        spec["recovery"] = {"backoff_seconds": 1, "backoff_max_seconds": 2}
        (proj / "run.yaml").write_text(yaml.safe_dump(spec))
        res = kit.glue("deploy", "--run", "mine", "--config", str(proj / "run.yaml"), "--vm", "gpukit-2")
        assert "warm trainer process and 1 run environment(s) ready on gpukit-spare-1" in res.stderr, res.stderr
        watchers.start()  # `glue watch --run mine`: the recovery below is unattended
        warm_log = f"{WARM_DIR}/warm.log"
        wait("the spare's warm process loading the run's imports", lambda: "run mine: loaded" in owner.ssh(
            owner.boxes[2], f"cat {warm_log}")[1], 120)
        client, prefix = s3(fast), layout.run_prefix("mine")
        recorded = bucket_store.read_json(client, "gpukit", prefix + layout.WARM_IMPORTS)["modules"]
        assert {"einops", "torch", "numpy"} <= set(recorded) and "mylib.model" not in recorded  # not the run's code
        st = wait_for(fast, "mine", lambda s: (s["step"] or 0) >= 25, timeout=240)
        assert st["state"] == "running" and st["step"] < 250, st  # lost mid-run, below
        lost = owner.processes(owner.boxes[1])
        for pid in lost:  # box-2 stops answering (as a machine that hangs or drops off the network)
            with contextlib.suppress(ProcessLookupError):  # one that ended since it was listed needs no stop
                os.kill(pid, signal.SIGSTOP)
        t1 = time.monotonic()
        recovered = prefix + layout.recovery_key(1)
        rec = wait("the recovery", lambda: bucket_store.read_json(client, "gpukit", recovered), 300)
        print(f"the watcher's recovery onto the warm spare host: {time.monotonic() - t1:.1f} s after the host hung")
        said = " ".join(watchers.logs().split())
        assert "provision: warm spare gpukit-spare-1 takes the place of gpukit-2" in said, said
        # the spare held the environment the first deploy packed (exactly the manifest's pins), and its warm
        # process for that environment took the attempt
        assert "gpukit-2: environment:" not in said, said  # reused: nothing unpacked during the recovery
        assert "start: the trainer on gpukit-2 started warm" in said, said
        req = bucket_store.read_json(client, "gpukit", prefix + layout.MANIFEST)["requirements"]
        pack = bucket_store.read_json(client, "gpukit", layout.env_pack_index_key(req["set_sha256"]))
        assert req["pack_sha256"] == pack["sha256"]  # the deploy pinned the pack the spare was checked against
        python = f"/var/lib/gpukit/work/mine/venv-{req['set_sha256'][:16]}/bin/python"
        got = json.loads(kit.glue("ssh", "gpukit-2", "--", python, "-c", INSTALLED).stdout.strip().splitlines()[-1])
        assert pins.as_dict(got) == pins.as_dict(req["pins"])  # no more, no less
        assert rec["verified"] and rec["failure_class"] == "vm_lost", rec
        assert rec["old_vm"]["id"] == "box-2", rec
        assert rec["new_vm"] == {"name": "gpukit-2", "id": "box-3", "spare": "gpukit-spare-1"}, rec
        assert rec["seconds"]["configure"] < 1.0 and rec["first_resumed_step"] == rec["checkpoint_step"] + 1
        print("recovery phases (s):", rec["seconds"])
        # The refill finds no free host (box-2 is lost, never dropped): it says so; the cluster serves on.
        log = spares.log_path(kit.home)
        said = wait("the refill's end", lambda: log.exists() and "spare refill failed" in log.read_text() and
                    log.read_text(), 240)
        assert "no free host in the hosts file for gpukit-spare-1" in said, said
        # each VM carries its own host's GPUs (as the checks found them, or its labels said) into the
        # inventory the driver and Slurm's GRES read: box-3 now serves as gpukit-2
        inventory = yaml.safe_load((kit.home / "ansible" / "inventory.yml").read_text())["all"]["hosts"]
        assert {n: (h["gpukit_gpu_type"], h["gpukit_gpu_count"]) for n, h in inventory.items()} == {
            "gpukit-1": ("none", 0), "gpukit-2": ("a10", 0)}, inventory
        # gpukit-2 is reached through the bastion, by glue (here) as by Ansible (its ProxyCommand configured it)
        assert "ProxyCommand=" in inventory["gpukit-2"]["ansible_ssh_common_args"]
        assert kit.glue("ssh", "gpukit-2", "--", "hostname").stdout.split() == ["box-3"]
        st = wait_for(fast, "mine", lambda s: s["state"] != "running", timeout=300)
        assert st["state"] == "completed", f"{explain(fast, 'mine', st)}\nwatcher: {watchers.logs()[-3000:]}"
        watchers.stop_all()
        # Only now, with the run done and its watcher gone (a host behind a hung jump is unreachable: lost):
        with owner.stopped(bastion):  # the bastion hangs: gpukit-2 cannot be reached, and the line says why
            res = kit.glue("ssh", "gpukit-2", "--", "true", check=False, timeout=120)
        assert res.returncode != 0 and f"jump host root@{bastion.ssh_host}:{bastion.ssh_port}" in res.stderr, \
            res.stderr

        for pid in lost:  # box-2 is back; the next `glue up` releases what gpukit left on it, and it is the spare
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        res = kit.glue("up", timeout=600)
        assert "box-2: answers again; released what gpukit left on it" in res.stderr, res.stderr
        vms = {v["name"]: v["id"] for v in json.loads(fast.glue("status", "--json").stdout)["vms"]}
        assert vms == {"gpukit-1": "box-1", "gpukit-2": "box-3", "gpukit-spare-1": "box-2"}, vms
        assert owner.ssh(owner.boxes[1], "pgrep -f 'glue[.]examples[.]tiny_gpt'")[0] != 0  # the lost trainer

        kit.glue("down", timeout=600)
        for box in owner.boxes:
            assert owner.backend.read_vm(box.id) is not None, f"{box.name} must keep running"
            # no gpukit unit running, failed or installed (a removed unit systemd has not forgotten yet may
            # still be listed "not-found inactive" for a moment: no file, no process, nothing left)
            _, out = owner.ssh(box, "systemctl list-units --plain --no-legend --state=active,activating,failed "
                                    "'gpukit-mount*' 'gpukit-group*'; systemctl list-unit-files --no-legend "
                                    "'gpukit-m*'; mountpoint -q /mnt/s3 && echo MOUNTED; "
                                    f"ls -d {' '.join(LEFT)} 2>/dev/null; pgrep -f 'glue[.]train[.]run[.]warm'; "
                                    f"grep -c {KEY_MARK} ~/.ssh/authorized_keys")
            assert out.split() == ["0"], f"{box.name} still has gpukit's: {out}"
    finally:
        watchers.stop_all()
        if fast is not None:
            kit.glue("down", "--force", check=False)
        remove_kit_home_machines(kit.home)  # here: the bucket server and the short dirs

