"""The host's process tree as the local backend walks it: a process that exits mid-walk is no error."""
from __future__ import annotations

import subprocess
import sys

from glue.process import children


def test_children_lists_a_live_child_and_nothing_once_the_parent_is_gone() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", "import subprocess,sys,time; c=subprocess.Popen(['sleep','30']);"
         " print(c.pid, flush=True); sys.stdin.read(); c.kill()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert child in children(parent.pid)
    finally:
        parent.communicate("")
    # the pid is reaped: its /proc/<pid>/task is gone, the walk a boot does at that moment returns []
    assert children(parent.pid) == []
