"""The checks `glue up` runs on each host of the file before anything is configured: SSH as the file's user,
sudo without a password, the OS, Python, free disk, GPUs. Read-only: nothing on the host changes."""

from __future__ import annotations

from dataclasses import dataclass

from glue.cloud.jumps import Jump
from glue.cloud.ssh import remote
from glue.cloud.ssh.hosts import HostEntry
from glue.errors import GlueError

# The driver role's distributions (ansible/roles/nvidia_driver) and the VM side's Python (requires-python).
SUPPORTED_OS = {("debian", "12"), ("ubuntu", "22.04"), ("ubuntu", "24.04")}
MIN_PYTHON = (3, 10)  # the VM side's floor (requires-python; make lint checks it as 3.10)
MIN_DISK_GB = 5

SCRIPT = r"""
( . /etc/os-release 2>/dev/null && echo "os=$ID $VERSION_ID" ) || echo "os=unknown"
if command -v python3 >/dev/null 2>&1; then
  python3 -c 'import sys; print("python=%d.%d" % sys.version_info[:2])'
else echo python=none; fi
if [ "$(id -u)" = 0 ]; then echo sudo=root
elif sudo -n true >/dev/null 2>&1; then echo sudo=yes
else echo sudo=no; fi
echo "disk_kb=$(df -Pk / | awk 'NR==2 {print $4}')"
n=0
for d in /sys/bus/pci/devices/*; do
  [ "$(cat "$d/vendor" 2>/dev/null)" = 0x10de ] || continue
  case "$(cat "$d/class" 2>/dev/null)" in 0x03*) n=$((n+1));; esac
done
echo "gpus=$n"
"""


@dataclass(frozen=True)
class HostReport:
    host: str
    ok: bool
    line: str  # one line: what was found, or what is wrong and how to fix it
    gpu_type: str = "none"
    gpu_count: int = 0
    fatal: bool = False  # a changed host key: refused even for a host the cluster holds or lost


def _facts(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def _problems(host: HostEntry, facts: dict[str, str]) -> list[str]:
    out = []
    if facts.get("sudo") == "no":
        out.append(f"{host.user} cannot sudo without a password (gpukit configures the machine as root: add "
                   f"`{host.user} ALL=(ALL) NOPASSWD:ALL` in /etc/sudoers.d/, or log in as root)")
    os_id = tuple(facts.get("os", "unknown").split()[:2])
    if os_id not in SUPPORTED_OS:
        names = ", ".join(f"{a} {b}" for a, b in sorted(SUPPORTED_OS))
        out.append(f"OS {' '.join(os_id) or 'unknown'} is not supported (supported: {names})")
    py = facts.get("python", "none")
    parts = tuple(int(p) for p in py.split(".")) if py.replace(".", "").isdigit() else ()
    if parts < MIN_PYTHON:
        need = ".".join(map(str, MIN_PYTHON))
        out.append(f"Python {py} found, gpukit's VM side needs python3 >= {need} (install python{need} as python3, "
                   "or use a newer OS image)")
    free_gb = int(facts.get("disk_kb") or 0) / 1024 ** 2
    if free_gb < MIN_DISK_GB:
        out.append(f"{free_gb:.1f} GB free on / (gpukit needs {MIN_DISK_GB} GB for the trainer's venv and "
                   "scratch): free some space")
    return out


def check(host: HostEntry, pinned: str, via: Jump | None = None) -> HostReport:
    """Log in (pinned key, the file's identity, through its jump if any), run the checks; a report either
    way, never an exception for what is wrong with the host."""
    where = f"{host.id} ({host.where}{f' via {via.where}' if via else ''})"
    try:
        client = remote.connect(host, pinned, via=via)
    except GlueError as exc:  # one line naming the host
        return HostReport(host.id, False, str(exc), fatal=isinstance(exc, remote.HostKeyChanged))
    try:
        code, out, err = remote.run(client, host, SCRIPT)
    except GlueError as exc:
        return HostReport(host.id, False, str(exc))
    finally:
        client.close()
    facts = _facts(out)
    if code != 0 or "sudo" not in facts:
        return HostReport(host.id, False, f"{where}: the checks did not run (exit {code}: "
                                          f"{(err.strip().splitlines() or ['?'])[-1]})")
    problems = _problems(host, facts)
    if problems:
        return HostReport(host.id, False, f"{where}: " + "; ".join(problems))
    found = int(facts.get("gpus") or 0)
    gpu_count = host.labels.gpu_count if host.labels.gpu_count is not None else found
    gpu_type = host.labels.gpu_type or ("nvidia" if gpu_count else "none")
    if host.labels.gpu_count is not None and host.labels.gpu_count > found:
        return HostReport(host.id, False, f"{where}: labels say {host.labels.gpu_count} GPU(s), {found} NVIDIA "
                                          "GPU(s) found on the PCI bus; fix labels.gpu_count")
    gpus = f"{gpu_count}x {gpu_type}" if gpu_count else "no GPU"
    return HostReport(host.id, True, f"{where}: {facts['os']}, Python {facts['python']}, "
                                     f"{int(facts['disk_kb']) / 1024 ** 2:.0f} GB free, {gpus}", gpu_type, gpu_count)

