"""glue up / down / status / ssh."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from glue.cloud import BACKENDS
from glue.cluster import current
from glue.commands import doctor
from glue.commands.bucket_options import asked, bucket_options
from glue.infra import ssh
from glue.infra.terraform import is_spare
from glue.operations import lifecycle, own_bucket, spares
from glue.paths import home

err = Console(stderr=True)
MAX_VMS = 16  # terraform/modules/cluster/variables.tf validates vm_count and name_prefix the same way
_PREFIX = re.compile(r"^[a-z][a-z0-9-]{0,30}[a-z0-9]$")


def _check_prefix(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not _PREFIX.match(value):
        raise click.BadParameter(f"{value!r}: 2-32 lowercase letters, digits and dashes, starting with a letter "
                                 "and not ending with a dash (e.g. team-a)")
    return value


@click.command()
@click.option("--vms", type=click.IntRange(1, MAX_VMS), default=None,
              help=f"Number of VMs, 1 to {MAX_VMS} (default: as last time, else 2).")
@click.option("--backend", type=click.Choice(list(BACKENDS)), default=None,
              help="Where VMs run (default: as last time, else local). Local VMs boot the baked image "
                   "(`glue image build`) as systemd-nspawn machines; qemu VMs boot it with their own kernel; ssh "
                   "takes machines you already have from --hosts; terraform runs your own root module (--module).")
@click.option("--name-prefix", default=None, callback=_check_prefix,
              help="VM name prefix (default: gpukit): 2-32 lowercase letters, digits and dashes.")
@click.option("--spares", type=click.IntRange(0, current.MAX_SPARES), default=None,
              help=f"Warm spares, 0 to {current.MAX_SPARES} (default: as last time, else 0): VMs configured, verified "
                   "and kept idle; a recovery takes one at once and the pool is refilled in the background.")
@click.option("--scheduler", type=click.Choice(list(current.SCHEDULERS)), default=None,
              help="Job scheduler on the cluster (default: as last time, else none). slurm: slurmctld on the first "
                   "VM, slurmd on every VM, a partition `gpu` (docs/slurm.md); none again stops it.")
@click.option("--hosts", "hosts_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The ssh backend's hosts file (YAML: address, port, user, identity_file, labels per host; "
                   "docs/guides/ssh-hosts.md); default: as last time. Hosts beyond --vms are the spares.")
@click.option("--accept-new-host-keys", is_flag=True,
              help="ssh backend: pin a host key seen for the first time without asking (its fingerprint is shown).")
@click.option("--module", "module_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="The terraform backend's root module: your own Terraform, any provider, emitting the kit's "
                   "outputs (docs/guides/own-terraform.md); default: as last time.")
@click.option("--no-configure", is_flag=True, help="Only create the VMs; skip the Ansible playbook.")
@click.option("--converge", "converge_all", is_flag=True,
              help="Run the playbook on every VM, even those whose configuration did not change.")
@click.option("--force", is_flag=True, help="Remove VMs (fewer --vms, another --name-prefix) even with runs "
                                            "unfinished or uploads pending on them.")
@bucket_options(kit_bucket=True)
def up(vms: int | None, backend: str | None, name_prefix: str | None, spares: int | None, scheduler: str | None,
       hosts_file: Path | None, accept_new_host_keys: bool, module_dir: Path | None, no_configure: bool,
       converge_all: bool, force: bool, bucket_endpoint: str | None, bucket_name: str | None,
       bucket_region: str | None, bucket_profile: str | None, kit_bucket: bool) -> None:
    """Create (or repair) the cluster: terraform apply, pin host keys, run the playbook on the VMs whose
    configuration changed (each named with the reason). With nothing changed and every VM alive, it applies
    and converges nothing: it checks that each VM answers with its bucket mount live, and says so. With your
    own bucket (--bucket-endpoint, --bucket) it first probes the bucket: one that fails configures nothing."""
    h = home()
    cfg = current.ClusterConfig.load(h)
    if vms is not None:
        cfg.vms = vms
    if backend is not None:
        cfg.backend = backend
    if name_prefix is not None:
        cfg.name_prefix = name_prefix
    if spares is not None:
        cfg.spares = spares
    if scheduler is not None:
        cfg.scheduler = scheduler
    if no_configure and converge_all:
        raise click.UsageError("--converge and --no-configure contradict each other: pick one")
    own_bucket.choose(h, cfg, asked(bucket_endpoint, bucket_name, bucket_region, bucket_profile, kit_bucket))
    adopt_bucket = own_bucket.prepare(h, cfg, lambda line: err.print(line, highlight=False, markup=False,
                                                                     soft_wrap=True))
    _ssh_hosts(cfg, hosts_file, accept_new_host_keys)
    _user_module(cfg, module_dir)
    adopt_bucket()  # only once every check before terraform passed
    hosts = lifecycle.up(h, cfg, err, configure=not no_configure, force=force, converge_all=converge_all)
    table = Table(title=f"cluster ({cfg.backend})", box=None)
    for col in ("vm", "ssh", "gpu"):
        table.add_column(col)
    for host in hosts:
        table.add_row(host.name + (" (spare)" if is_spare(host.name) else ""),
                      f"{host.ssh_user}@{host.ssh_host}:{host.ssh_port}",
                      f"{host.gpu_count}x {host.gpu_type}" + (" (spot)" if host.market == "spot" else ""))
    err.print(table)


def _ssh_hosts(cfg: current.ClusterConfig, hosts_file: Path | None, accept_new: bool) -> None:
    """The ssh backend: every host of the file checked (keys pinned or asked) before terraform runs."""
    if cfg.backend != "ssh":
        if hosts_file is not None or accept_new:
            raise click.UsageError("--hosts and --accept-new-host-keys are for --backend ssh")
        return
    from glue.cloud.ssh import setup

    if hosts_file is not None:
        cfg.hosts = str(hosts_file.expanduser().resolve())
    if not cfg.hosts:
        raise click.UsageError("--backend ssh needs --hosts FILE: the machines to use (docs/guides/ssh-hosts.md)")
    confirm = (lambda q: click.confirm(q, default=False, err=True)) if sys.stdin.isatty() else None
    setup.prepare(home(), Path(cfg.hosts), (cfg.vms, cfg.spares), setup.Asking(accept_new, confirm),
                  lambda line: err.print(line, highlight=False, markup=False, soft_wrap=True))


def _user_module(cfg: current.ClusterConfig, module_dir: Path | None) -> None:
    """The terraform backend: the user's root module checked and recorded before terraform runs."""
    if cfg.backend != "terraform":
        if module_dir is not None:
            raise click.UsageError("--module is for --backend terraform")
        return
    from glue.cloud.terraform import module

    if module_dir is not None:
        cfg.module = str(module.check(module_dir))
    if not cfg.module:
        raise click.UsageError("--backend terraform needs --module DIR: your root module "
                               "(docs/guides/own-terraform.md)")
    module.record(home(), Path(cfg.module))


@click.command()
@click.option("--force", is_flag=True, help="Destroy even with runs unfinished or uploads pending.")
def down(force: bool) -> None:
    """Destroy the cluster's VMs, once no run is still running or awaits a recovery with its outputs
    missing, and no upload is pending (a run ended with `glue stop` does not hold it up). The bucket stays."""
    if lifecycle.down(home(), err, force=force):
        err.print("[green]cluster destroyed[/]; the bucket and its data are kept")
    else:
        err.print("no VMs to destroy; the bucket and its data are kept")


@click.command()
@click.option("--run", "run_id", default=None, help="Show one run: attempt, state, step, failure class.")
@click.option("--verify", is_flag=True, help="Run verify.yml now instead of showing the last result.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(run_id: str | None, verify: bool, as_json: bool) -> None:
    """VMs (address, SSH reachable), the bucket (reachable) and runs; or one run with --run."""
    from glue.commands import runs

    if run_id is not None:
        runs.show_run(run_id, as_json)
        return
    st = lifecycle.status(home(), verify=verify)
    st["runs"] = runs.list_runs()
    slurm = runs.slurm_status()  # a Slurm cluster: its queue, pending reasons, GPUs in use and free
    if slurm is not None:
        st["slurm"] = slurm
    if as_json:
        click.echo(json.dumps(st, indent=2))
        return
    table = Table(title=f"VMs ({st['backend']})", box=None)
    for col in ("vm", "ssh", "reachable", "ready", "/mnt/s3", "gpu", "runtime"):
        # Names and addresses are copied from here: wrap the prose columns on a narrow terminal, never these.
        table.add_column(col, no_wrap=col in ("vm", "ssh", "reachable"), overflow="fold")
    for vm in st["vms"]:
        ok = "[green]yes[/]" if vm["reachable"] else "[red]no[/]"
        v = vm.get("verify") or {}
        mount = v.get("mount", {})
        gpu = v.get("gpu", {})
        runtime = v.get("runtime", {})
        table.add_row(
            vm["name"] + (" (spare, idle)" if vm["role"] == "spare" else ""), f"{vm['ssh_host']}:{vm['ssh_port']}", ok,
            ("[green]yes[/]" if v.get("ready") else "[red]no[/]") if v else "? (glue status --verify)",
            ("round trip ok" if mount.get("round_trip") else mount.get("error", "not mounted")) if v else "",
            (f"{gpu.get('count', 0)}x {', '.join(gpu.get('names') or []) or 'none'}"
             + (f" driver {gpu['driver_version']}" if gpu.get("driver_version") else "")) if v else "",
            (f"{runtime.get('mode', '')} torch {runtime.get('torch', '?')}" if runtime.get("ok") else "not ok")
            if v else "",
        )
    Console().print(table if st["vms"] else "no VMs (run `glue up`)")
    pool = st["spares"]
    if pool["wanted"] or pool["taken"]:
        serving = "".join(f"; {t['spare']} serves as {t['name']} (run {t['run']}) until the refill renames it"
                          for t in pool["taken"])
        Console().print(f"warm spares: {pool['idle']} of {pool['wanted']} idle{serving}"
                        + (f"; refilling (log: {spares.log_path(home())})" if pool["idle"] < pool["wanted"] else ""),
                        highlight=False)
    for k in st.get("kept", []):
        Console().print(f"kept for debugging: VM {k['id']} (was {k['name']}) at {k['ssh_host']}:{k['ssh_port']}, "
                        f"run {k['run']} attempt {k['attempt']} {k['failure_class']} since {k['kept_at']}; "
                        f"`glue ssh {k['id']} -- ...` reaches it, `glue down` removes it", highlight=False)
    b = st["bucket"]
    ok = "[green]reachable[/]" if b["reachable"] else "[red]not reachable[/]"
    Console().print(f"bucket {b['name']} at {b['endpoint']}: {ok}")
    if st["runs"]:
        Console().print("runs: " + ", ".join(st["runs"]) + "  (details: glue status --run ID)")
    if slurm is not None:
        runs.print_slurm(slurm)


@click.command(context_settings={"ignore_unknown_options": True})
@click.argument("vm")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def ssh_cmd(vm: str, command: tuple[str, ...]) -> None:
    """Run COMMAND on VM over SSH (pinned host key): glue ssh gpukit-1 -- nvidia-smi

    VM is a cluster VM's name, or the id of a VM kept for debugging (`glue status` lists them). Each word
    of COMMAND is quoted for the remote shell; for a shell line (;, |, $VAR) run a shell:
    glue ssh gpukit-1 -- sh -c 'findmnt /mnt/s3; df -h /'"""
    h = home()
    kept = {k.id: k for k in lifecycle.kept(h)}
    target = lifecycle.kept_host(kept[vm]) if vm in kept else current.host(h, vm)
    result = ssh.run(h, target, shlex.join(command), stream=True)
    sys.exit(result.exit_code)


ssh_cmd.name = "ssh"
# doctor is registered with the cluster commands: it checks what `up` needs.
COMMANDS = [up, down, status, ssh_cmd, *doctor.COMMANDS]
