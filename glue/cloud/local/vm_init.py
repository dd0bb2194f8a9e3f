"""PID 1 of a local VM. Runs inside fresh mount/UTS/PID namespaces (started by `unshare`).

Builds the VM's root (an overlay of the host root whose upper layer is the VM's own disk
directory), chroots into it, starts sshd on loopback and reaps orphans until killed. Everything
the VM writes lands in its disk directory, so deleting that directory is terminating the VM.

Nothing of the controller's secrets reaches the VM: PID 1 re-executes itself with an allow-listed
environment (the controller's, with a user's API keys, is what it was started with, and
/proc/1/environ would show it to every process on the VM), and the kit home (the SSH key that is
root on every VM, bucket credentials, the bucket's files) is covered by an empty read-only tmpfs.

Usage: python -m glue.cloud.local.vm_init <vm_dir>   (vm_dir holds config.json written by local.py)
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from glue.paths import minimal_env


def sh(*args: str) -> None:
    subprocess.run(args, check=True)


def build_root(vm_dir: Path, cfg: dict[str, object]) -> Path:
    disk = vm_dir / "disk"
    upper, work, root, home = disk / "upper", disk / "work", disk / "root", disk / "home"
    for d in (upper, work, root, home):
        d.mkdir(parents=True, exist_ok=True)
    home.chmod(0o700)
    # Nothing we mount may leak back into the host's namespace.
    sh("mount", "--make-rprivate", "/")
    sh("mount", "-t", "overlay", "overlay", "-o", f"lowerdir=/,upperdir={upper},workdir={work}", str(root))
    sh("mount", "-t", "proc", "proc", str(root / "proc"))
    for src in ("/dev", "/sys"):
        sh("mount", "--rbind", src, str(root / src.lstrip("/")))
    sh("mount", "-t", "tmpfs", "-o", "mode=1777", "tmpfs", str(root / "dev/shm"))
    sh("mount", "-t", "tmpfs", "-o", "mode=755", "tmpfs", str(root / "run"))
    sh("mount", "-t", "tmpfs", "-o", "mode=1777", "tmpfs", str(root / "tmp"))
    # A private /root on the VM's disk. The interpreter the venv links to may live under the host's
    # /root (pyenv); bind that one tree back in read-only so the project venv still runs on the VM.
    sh("mount", "--bind", str(home), str(root / "root"))
    binds = cfg.get("readonly_binds", [])
    for keep in binds if isinstance(binds, list) else []:
        target = root / str(keep).lstrip("/")
        target.mkdir(parents=True, exist_ok=True)
        sh("mount", "--bind", str(keep), str(target))
        sh("mount", "-o", "remount,bind,ro", str(target))
    # Last, so it also covers a kit home inside a tree bound above (the default: <project>/.gpukit).
    # The overlay and /root were mounted from it already and keep working.
    hide = root / str(kit_home(vm_dir)).lstrip("/")
    if hide.is_dir():
        sh("mount", "-t", "tmpfs", "-o", "ro,mode=0700,size=4k", "tmpfs", str(hide))
    return root


def kit_home(vm_dir: Path) -> Path:
    """The kit home holding this VM (the local backend keeps VMs in <home>/vms/<id>)."""
    return vm_dir.parent.parent


def clean_env() -> dict[str, str]:
    """PID 1's environment: the allow-list, and where the kit's code is (not a secret)."""
    return minimal_env(**{k: os.environ[k] for k in ("PYTHONPATH",) if k in os.environ})


def prepare_sshd(vm_dir: Path, cfg: dict[str, object]) -> list[str]:
    """Host key, authorized key and sshd config on the VM's tmpfs /run (we are chrooted now)."""
    run = Path("/run/gpukit")
    run.mkdir(parents=True, exist_ok=True)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    key = run / "ssh_host_ed25519_key"
    key.write_bytes(bytes.fromhex(str(cfg["host_key_private_hex"])))
    key.chmod(0o600)
    ssh_dir = Path("/root/.ssh")
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    auth = ssh_dir / "authorized_keys"
    auth.write_text(str(cfg["authorized_key"]).strip() + "\n")
    auth.chmod(0o600)
    conf = run / "sshd_config"
    conf.write_text(
        "\n".join(
            [
                f"Port {cfg['port']}",
                "ListenAddress 127.0.0.1",
                f"HostKey {key}",
                "PermitRootLogin prohibit-password",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "AuthorizedKeysFile /root/.ssh/authorized_keys",
                "UsePAM no",
                "PrintMotd no",
                "PidFile /run/sshd.pid",
                "MaxSessions 64",
                "MaxStartups 64:30:128",
                "Subsystem sftp internal-sftp",
                "",
            ]
        )
    )
    return ["/usr/sbin/sshd", "-D", "-e", "-f", str(conf)]


def main() -> None:
    vm_dir = Path(sys.argv[1]).resolve()
    env = clean_env()
    if dict(os.environ) != env:
        # exec, not just os.environ: /proc/1/environ shows the block PID 1 was exec'd with.
        os.execve(sys.executable, [sys.executable, "-m", "glue.cloud.local.vm_init", str(vm_dir)], env)
    cfg = json.loads((vm_dir / "config.json").read_text())
    socket.sethostname(str(cfg["name"]))
    root = build_root(vm_dir, cfg)
    os.chroot(root)
    os.chdir("/")
    os.environ.update({"HOME": "/root", "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"})
    sshd_cmd = prepare_sshd(vm_dir, cfg)
    if shutil.which("sshd", path="/usr/sbin") is None:
        print("local_init: /usr/sbin/sshd missing; install openssh-server", flush=True)
        sys.exit(1)
    sshd = subprocess.Popen(sshd_cmd, stdin=subprocess.DEVNULL)
    print(f"local_init: {cfg['name']} up, sshd pid {sshd.pid}", flush=True)
    # As PID 1 we inherit every orphan; reap them all, and keep sshd alive like an init would.
    while True:
        try:
            pid, _ = os.wait()
        except ChildProcessError:
            time.sleep(0.5)
            continue
        if pid == sshd.pid:
            time.sleep(0.5)
            sshd = subprocess.Popen(sshd_cmd, stdin=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
