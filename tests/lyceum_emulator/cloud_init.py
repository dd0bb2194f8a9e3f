"""What a cloud image's first boot does to the emulator's VMs when it is told the image's user is not
root (Emulator(login_user="ubuntu")): like cloud-init on Ubuntu's images, it creates the user with
the launch key and passwordless sudo, and disables root the way cloud-init's `disable_root` does (the
key still authenticates root, but every command only answers 'Please login as the user "ubuntu"
rather than the user "root".' and exits 142). login_user="lyceum" is what live Lyceum VMs do: the
user `lyceum` with passwordless sudo, and root's key refused at authentication (publickey).

It works through the VM itself, over SSH as root with a key of the emulator's own (authorised next to
the user's at boot and removed here), so it does not depend on how the local VM is built. The image
must contain: sshd, useradd/usermod, and sudo — a VM without sudo gets it from apt-get, and when that
fails the VM errors with the reason.
"""

from __future__ import annotations

import base64
import shlex
import subprocess
import threading
from pathlib import Path

import paramiko

from glue.cloud.base import VMRecord

_key_lock = threading.Lock()  # VMs boot in parallel threads: one of them makes the key


def emulator_key(home: Path) -> tuple[Path, str]:
    """The emulator's own key pair (0600), made once: (private key path, public key line)."""
    path = home / "emulator_ed25519"
    with _key_lock:
        if not path.exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "lyceum-emulator", "-f", str(path)],
                           check=True, stdin=subprocess.DEVNULL)
    return path, Path(f"{path}.pub").read_text().strip()


# Live Lyceum VMs log in as `lyceum` and refuse root's key outright (publickey), as seen on the live API.
ROOT_REFUSED_FOR = frozenset({"lyceum"})


def script(user: str, user_key: str) -> str:
    message = f"Please login as the user \\\"{user}\\\" rather than the user \\\"root\\\"."
    root_line = "" if user in ROOT_REFUSED_FOR else (
        f'no-port-forwarding,no-agent-forwarding,no-X11-forwarding,command="echo \'{message}\';echo;'
        f'exit 142" {user_key}')
    return f"""set -e
if ! command -v sudo >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends sudo >/tmp/sudo-install.log 2>&1 || {{
    echo "sudo is missing and apt-get install sudo failed (the image must contain sudo):" \
      "$(tail -1 /tmp/sudo-install.log)"
    exit 3
  }}
fi
# sudo looks its host up: a cloud image lists its own name (cloud-init's manage_etc_hosts).
grep -qw "$(hostname)" /etc/hosts || echo "127.0.1.1 $(hostname)" >> /etc/hosts
id -u {user} >/dev/null 2>&1 || useradd -m -s /bin/bash {user}
usermod -p '*' {user}  # no password, but not locked: sshd refuses locked accounts
home=$(getent passwd {user} | cut -d: -f6)
install -d -m 700 -o {user} -g {user} "$home/.ssh"
printf '%s\\n' {shlex.quote(user_key)} > "$home/.ssh/authorized_keys"
chown {user}:{user} "$home/.ssh/authorized_keys"
chmod 600 "$home/.ssh/authorized_keys"
printf '%s ALL=(ALL) NOPASSWD:ALL\\n' {user} > /etc/sudoers.d/90-cloud-init-users
chmod 440 /etc/sudoers.d/90-cloud-init-users
pid=$(cat /run/sshd.pid 2>/dev/null || pgrep -o -x sshd)
# sshd shows its command line as its title ("sshd: /usr/sbin/sshd -D -f <conf> [listener] ...").
conf=$(tr '\\0' ' ' < /proc/"$pid"/cmdline | sed -n 's/.* -f \\([^ ]*\\).*/\\1/p')
conf=${{conf:-/etc/ssh/sshd_config}}
# The first value of a keyword wins: each user's own authorized_keys from now on.
sed -i '1i AuthorizedKeysFile .ssh/authorized_keys' "$conf"
printf '%s\\n' {shlex.quote(root_line)} > /root/.ssh/authorized_keys
kill -HUP "$pid"
"""


def configure(rec: VMRecord, home: Path, user: str, user_key: str, timeout: float = 120.0) -> None:
    """Run the first-boot script on the VM as root; raises RuntimeError with its output on failure."""
    key_path, _ = emulator_key(home)
    client = paramiko.SSHClient()
    host_key = paramiko.Ed25519Key(data=base64.b64decode(rec.host_key.split()[1]))
    name = rec.ssh_host if rec.ssh_port == 22 else f"[{rec.ssh_host}]:{rec.ssh_port}"
    client.get_host_keys().add(name, host_key.get_name(), host_key)
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(rec.ssh_host, port=rec.ssh_port, username="root", key_filename=str(key_path), timeout=10,
                   allow_agent=False, look_for_keys=False)
    try:
        stdin, stdout, stderr = client.exec_command("sh -s", timeout=timeout)
        stdin.write(script(user, user_key))
        stdin.channel.shutdown_write()
        out = stdout.read().decode(errors="replace") + stderr.read().decode(errors="replace")
        code = stdout.channel.recv_exit_status()
    finally:
        client.close()
    if code != 0:
        raise RuntimeError(" ".join(out.split())[-300:] or f"first-boot script exited {code}")
