"""The Ansible driver without VMs (glue.infra.ansible and the ansible_run / ansible_progress modules
behind it): results, first failure per host, changed counts, progress display, and no secrets in
ansible-runner's artifacts (no_log output, the caller's environment)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from glue.errors import GlueError
from glue.infra import ansible, ansible_progress, ansible_run, inventory

SECRET = "s3cr3t-do-not-log-4242"
API_KEY = "lk_api-key-do-not-log-1717"

PLAYBOOK = """
- name: A small play on local hosts
  hosts: all
  gather_facts: false
  tasks:
    - name: Write a file with a secret from a controller-side file
      ansible.builtin.copy:
        dest: "{{ out_dir }}/{{ inventory_hostname }}.conf"
        content: "key = {{ (lookup('ansible.builtin.file', creds_file) | from_json).secret_key }}\\n"
        mode: "0600"
      no_log: true
    - name: Change something
      ansible.builtin.command: "true"
      changed_when: inventory_hostname == 'h1'
    - name: Fail on one host with a cause on stderr
      ansible.builtin.shell: "echo 'noise' >&2; echo 'gpukit-mount: wrong bucket credentials: 403' >&2; exit 13"
      when: inventory_hostname == 'h2'
      changed_when: false
    - name: Record a summary
      ansible.builtin.set_fact:
        gpukit_summary:
          host: "{{ inventory_hostname }}"
          ready: true
"""


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    (home / "ansible").mkdir(parents=True)
    creds = home / "bucket" / "credentials.json"
    creds.parent.mkdir()
    creds.write_text(json.dumps({"access_key": "ak", "secret_key": SECRET}))
    creds.chmod(0o600)
    inv = {"all": {"hosts": {"h1": {}, "h2": {}},
                   "vars": {"ansible_connection": "local", "creds_file": str(creds),
                            "out_dir": str(tmp_path / "out")}}}
    (tmp_path / "out").mkdir()
    inventory.inventory_path(home).write_text(yaml.safe_dump(inv))
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    return home


def _all_text(root: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in root.rglob("*") if p.is_file())


def test_result_changed_failed_and_no_secrets(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LYCEUM_API_KEY", API_KEY)
    res = ansible.run_playbook(str(home.parent / "play.yml"), home, progress=False)
    assert not res.ok
    assert res.changed == {"h1": 2, "h2": 1}
    assert res.failed == {"h2": "Fail on one host with a cause on stderr: gpukit-mount: wrong bucket credentials: 403"}
    assert res.summaries == {"h1": {"host": "h1", "ready": True}}
    assert res.seconds > 0 and res.rc != 0
    assert (home.parent / "out" / "h1.conf").read_text() == f"key = {SECRET}\n"
    artifacts = _all_text(ansible.runner_dir(home))
    assert "censored" in artifacts or "no_log" in artifacts
    assert SECRET not in artifacts, "a no_log secret reached ansible-runner's artifacts"
    assert API_KEY not in artifacts, "the caller's environment reached ansible-runner's artifacts"
    assert not (ansible.runner_dir(home) / "env").exists(), "ansible-runner wrote env files"
    command = json.loads(next(Path(res.artifact_dir).glob("command")).read_text())
    assert command["env"]["ANSIBLE_HOST_KEY_CHECKING"] == "True"
    assert command["env"]["ANSIBLE_CONFIG"].endswith("ansible/ansible.cfg")


def test_limit_and_progress_display(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    res = ansible.run_playbook(str(home.parent / "play.yml"), home, limit=["h1"], progress=True)
    assert res.ok, res.failed
    assert res.changed == {"h1": 2}
    err = capsys.readouterr().err
    assert "h1" in err and "A small play on local hosts" in err
    assert err.endswith("\n")  # what is printed next starts on a line of its own


def test_missing_inventory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(GlueError, match="run `glue up`"):
        ansible.converge(tmp_path, progress=False)


def test_control_sockets_stay_under_home_unless_too_long(tmp_path: Path) -> None:
    assert ansible_run.control_path_dir(Path("/work/x/.gpukit")) == Path("/work/x/.gpukit/ansible/cp")
    long_home = Path("/tmp") / ("d" * 80) / "home"
    cp = ansible_run.control_path_dir(long_home)
    assert str(cp).startswith("/tmp/gpukit-cp-") and len(str(cp)) < 40
    assert cp == ansible_run.control_path_dir(long_home)


def test_playbooks_run_with_mitogen_and_its_absence_is_one_clear_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = ansible_run.runner_env(tmp_path)
    assert env["ANSIBLE_STRATEGY"] == "mitogen_linear"
    assert (Path(env["ANSIBLE_STRATEGY_PLUGINS"]) / "mitogen_linear.py").is_file()
    monkeypatch.setenv("GPUKIT_ANSIBLE_STRATEGY", "linear")  # the escape hatch: Ansible's own strategy
    env = ansible_run.runner_env(tmp_path)
    assert env["ANSIBLE_STRATEGY"] == "linear" and "ANSIBLE_STRATEGY_PLUGINS" not in env
    monkeypatch.setenv("GPUKIT_ANSIBLE_STRATEGY", "fast")
    with pytest.raises(GlueError, match="GPUKIT_ANSIBLE_STRATEGY='fast': use mitogen"):
        ansible_run.runner_env(tmp_path)
    monkeypatch.delenv("GPUKIT_ANSIBLE_STRATEGY")
    monkeypatch.setattr(ansible_run.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(GlueError, match=r"mitogen is not installed.*make bootstrap"):
        ansible_run.runner_env(tmp_path)


def test_failure_message() -> None:
    fm = ansible_progress.failure_message
    assert fm({"msg": "non-zero return code", "stderr": "a\nb: cause\n"}) == "b: cause"
    assert fm({"msg": "non-zero return code", "rc": 13,
               "stderr": "gpukit-mount: fuse missing: x\r\nShared connection to 127.0.0.1 closed.\r\n"}
              ) == "gpukit-mount: fuse missing: x"
    assert fm({"msg": "non-zero return code", "stdout": "gpukit-mount: bucket missing: b\r\n",
               "stderr": "Shared connection to 127.0.0.1 closed.\r\n"}) == "gpukit-mount: bucket missing: b"
    assert fm({"censored": "hidden"}) == "output hidden (no_log)"
    assert fm({"msg": "Failed   to\n connect"}) == "Failed to connect"
    assert fm({"msg": "All items completed", "results": [{"failed": False}, {"failed": True, "msg": "item 2"}]}
              ) == "All items completed"
    assert fm({"results": [{"failed": True, "msg": "item 2"}]}) == "item 2"


def test_verify_collects_summaries(home: Path, tmp_path: Path) -> None:
    res = ansible.run_playbook(str(tmp_path / "play.yml"), home, progress=False)
    assert "h1" in res.summaries and "h2" not in res.summaries
    assert ansible.last_verify(home) is None


def test_fact_cache_is_dropped_for_new_or_replaced_vms(tmp_path: Path) -> None:
    home = tmp_path / "home"
    inv = inventory.inventory_path(home)
    inv.parent.mkdir(parents=True)
    cache = ansible_run.facts_dir(home)

    def write(ids: dict[str, str]) -> None:
        inv.write_text(yaml.safe_dump({"all": {"hosts": {h: {"gpukit_vm_id": i} for h, i in ids.items()}}}))

    def seed() -> None:
        cache.mkdir(parents=True, exist_ok=True)
        for h in ("h1", "h2", "h10"):
            (cache / f"s1_{h}").write_text("{}")

    write({"h1": "vm-a", "h2": "vm-b", "h10": "vm-c"})
    seed()
    ansible_run.prune_fact_cache(home, inv)  # nothing known yet: everything gathered anew
    assert sorted(p.name for p in cache.iterdir()) == [".vm-ids.json"]
    seed()
    ansible_run.prune_fact_cache(home, inv)  # same VMs: cache kept
    assert {p.name for p in cache.iterdir()} == {".vm-ids.json", "s1_h1", "s1_h2", "s1_h10"}
    write({"h1": "vm-a", "h2": "vm-NEW", "h10": "vm-c"})
    ansible_run.prune_fact_cache(home, inv)  # h2 replaced: only its facts go
    assert {p.name for p in cache.iterdir()} == {".vm-ids.json", "s1_h1", "s1_h10"}
    write({"h10": "vm-c"})
    ansible_run.prune_fact_cache(home, inv)  # h1 left the cluster
    assert {p.name for p in cache.iterdir()} == {".vm-ids.json", "s1_h10"}


def _cmdline_has(proc_dir: Path, needle: str) -> bool:
    try:
        return needle.encode() in (proc_dir / "cmdline").read_bytes()
    except OSError:
        return False


SLOW_PLAY = """
- name: A play that waits
  hosts: all
  gather_facts: false
  tasks:
    - name: Wait long enough to be interrupted
      ansible.builtin.command: sleep 60
      changed_when: false
"""


def test_signals_work_again_after_a_playbook_and_one_during_it_cancels_it(home: Path) -> None:
    """ansible-runner left alone keeps its own SIGINT/SIGTERM handlers for the rest of the process: after
    one playbook, Ctrl-C or `glue watch --stop` (SIGTERM) would not end glue any more."""
    import signal
    import threading
    import time

    seen: list[int] = []
    before = signal.signal(signal.SIGTERM, lambda signum, _frame: seen.append(signum))
    try:
        handler, interrupt = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
        res = ansible.run_playbook(str(home.parent / "play.yml"), home, limit=["h1"], progress=False)
        assert res.ok and signal.getsignal(signal.SIGTERM) is handler
        assert signal.getsignal(signal.SIGINT) is interrupt  # as it was (ignored under nohup, as in CI)
        (home.parent / "slow.yml").write_text(SLOW_PLAY)
        threading.Timer(3.0, signal.raise_signal, (signal.SIGTERM,)).start()
        t0 = time.monotonic()
        res = ansible.run_playbook(str(home.parent / "slow.yml"), home, limit=["h1"], progress=False)
        assert time.monotonic() - t0 < 30 and not res.ok  # cancelled, not waited for
        assert seen == [signal.SIGTERM]  # and the signal reached the handler it was meant for
        assert signal.getsignal(signal.SIGTERM) is handler
        # Nothing of the cancelled playbook is left running (Mitogen's multiplexer used to linger forever).
        time.sleep(0.5)
        mine = str(home.parent / "slow.yml")
        left = [d.name for d in Path("/proc").iterdir() if d.name.isdigit() and _cmdline_has(d, mine)]
        assert left == [], left
    finally:
        signal.signal(signal.SIGTERM, before)
