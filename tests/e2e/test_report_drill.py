"""A drill run judged and shown: pinned evaluation set, verdict in `glue status`, `glue report` opened in a
real headless Chromium, `glue compare` against its reference, `glue budget`, and the scale gate."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

from glue.bucket_access import BucketInfo
from glue.cloud.local.bucket import LocalBucket
from glue.runs import gate
from glue.train import layout
from tests.integration.test_runs import here, run_config, s3

from .conftest import Kit

pytestmark = pytest.mark.e2e

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class Charts(HTMLParser):
    """chart id -> series name -> points, from the DOM Chromium rendered."""

    def __init__(self) -> None:
        super().__init__()
        self.charts: dict[str, dict[str, int]] = {}
        self.current = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "svg" and a.get("data-chart"):
            self.current = str(a["data-chart"])
            self.charts[self.current] = {}
        if tag == "g" and a.get("data-series"):
            self.charts[self.current][str(a["data-series"])] = int(a.get("data-points") or 0)


def chromium(*args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM, "chromium is missing: run `make bootstrap` (it installs Debian's chromium)"
    # --no-sandbox: the suite runs as root. Console messages go to stderr with --enable-logging.
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           "--enable-logging=stderr", "--v=0", *args], capture_output=True, text=True, timeout=120)


def console_errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]


@pytest.mark.timeout(900)
def test_drill_report_opens_in_chromium_with_every_chart_and_judges_the_run(cluster_kit: Kit, tmp_path: Path) -> None:
    kit, fast = cluster_kit, here(cluster_kit)
    t0 = time.monotonic()
    data = ("the model saves the weights before dawn.\n" * 40).encode()
    pin = hashlib.sha256(data).hexdigest()
    client = s3(fast)
    client.put_object(Bucket="gpukit", Key="eval/report-heldout.txt", Body=data)
    cfg = run_config(tmp_path, config={"steps": 30, "step_sleep": 0.05, "checkpoint_interval": 10, "eval_every": 10},
                     checkpoint={"interval_steps": 10}, monitor={"heartbeat_seconds": 0.5},
                     evaluation={"dataset": {"uri": "s3://{bucket}/eval/report-heldout.txt", "sha256": pin},
                                 "metrics": {"val_loss": {"max": 10.0}}})

    # Scale gate: nothing of this commit is validated yet, so a group is refused before anything starts.
    res = kit.glue("deploy", "--run", "gated", "--config", str(cfg), "--nodes", "2", "--require-validated",
                   check=False)
    assert res.returncode != 0 and "scale gate: refusing --nodes 2" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
    assert "Contents" not in client.list_objects_v2(Bucket="gpukit", Prefix=layout.run_prefix("gated"))

    res = kit.glue("drill", "--run", "rep", "--config", str(cfg), "--kill-at", "15", check=False, timeout=900)
    assert res.returncode == 0, res.stderr
    assert "check applied bitwise (same world size)" in " ".join(res.stderr.split()), res.stderr
    st = json.loads(fast.glue("status", "--run", "rep-drill1", "--json").stdout)
    verdict = st["verdict"]
    assert verdict["accepted"], verdict
    assert verdict["evaluation"]["step"] == 30 and verdict["evaluation"]["dataset"]["sha256"] == pin
    key = layout.run_prefix("rep-drill1") + layout.MANIFEST
    manifest = json.loads(client.get_object(Bucket="gpukit", Key=key)["Body"].read())
    assert manifest["evaluation"]["dataset"] == {"uri": "s3://gpukit/eval/report-heldout.txt", "sha256": pin,
                                                 "size": len(data)}

    shown = " ".join(kit.glue("status", "--run", "rep-drill1").stdout.split())
    assert "eval val_loss" in shown and "verdict accepted" in shown, shown

    out = tmp_path / "report.html"
    kit.glue("report", "--run", "rep-drill1", "--out", str(out))
    stored = client.get_object(Bucket="gpukit", Key=layout.run_prefix("rep-drill1") + layout.REPORT)["Body"].read()
    assert stored == out.read_bytes()
    assert "check bitwise: losses equal" in out.read_text()  # the recovery's resume check, by name

    dom = chromium("--dump-dom", out.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert not console_errors(dom.stderr), console_errors(dom.stderr)
    broken = tmp_path / "broken.html"  # the check above can fail: a page with a script error is caught
    broken.write_text("<html><body><script>undefinedFn()</script></body></html>")
    assert console_errors(chromium("--dump-dom", broken.as_uri()).stderr)
    charts = Charts()
    charts.feed(dom.stdout)
    c = charts.charts
    loss = c["loss"]
    assert loss["reference rep-drill1-ref"] == 30 and loss["attempt 1 (first, lost)"] == 15
    assert loss["attempt 2 (resumed)"] == 20  # resumed from step 10: 11..30 over the lost attempt's 11..15
    assert c["timeline"]["attempt"] == 2 and c["timeline"]["failure"] == 1 and c["timeline"]["recovery"] == 1
    assert c["timeline"]["checkpoint"] >= 3 and c["timeline"]["evaluation"] == 3
    assert set(c["recovery-phases"]) == {"detect", "validate", "provision", "configure", "verify", "restore",
                                         "replay"}
    assert c["work-lost"]["training replayed"] == 1
    assert c["checkpoint-stall"]["stall (training waits)"] >= 2 and c["checkpoint-size"]["size"] >= 2
    assert c["step-gaps"]["attempt 1"] == 14 and c["step-gaps"]["attempt 2"] == 19
    assert c["evaluation"] == {"val_loss": 3}  # steps 10 (attempt 1), 20 and 30 (attempt 2)
    shot = tmp_path / "report.png"  # the artifact: kept under the test's tmp dir
    res_shot = chromium("--hide-scrollbars", "--window-size=900,3600", f"--screenshot={shot}", out.as_uri())
    assert res_shot.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", res_shot.stderr[-2000:]

    cmp = json.loads(kit.glue("compare", "rep-drill1", "rep-drill1-ref", "--json").stdout)
    assert cmp["a"]["accepted"] and cmp["b"]["accepted"] and cmp["a"]["eval_set"] == cmp["b"]["eval_set"] == pin
    assert cmp["a"]["recoveries"] == 1 and cmp["b"]["recoveries"] == 0 and cmp["a"]["steps"] == cmp["b"]["steps"] == 30
    assert {d["key"] for d in cmp["config_diff"]} <= {"env.GPUKIT_HOLD_AT"}  # the drill's hold, nothing else
    assert re.search(r"\d+ / 1", kit.glue("compare", "rep-drill1", "rep-drill1-ref").stdout)

    bud = json.loads(kit.glue("budget", "--run", "rep-drill1", "--steps", "1000", "--mtbf", "24", "--json").stdout)
    assert bud["wall_s"] == pytest.approx(bud["train_s"] + bud["checkpoint_s"] + bud["lost_s"])
    assert bud["cost"] == 0.0 and bud["expected_failures"] > 0  # local VMs are free

    for bad in (("report", "--run", "no-such-run"), ("budget", "--run", "rep-drill1-ref", "--steps", "10")):
        res = kit.glue(*bad, check=False)  # unknown run; a run without failures and no --mtbf
        assert res.returncode != 0 and len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert "Traceback" not in res.stderr and ("unknown run" in res.stderr or "--mtbf" in res.stderr)

    # The run and its drill validate this commit for a group now.
    status = json.loads(fast.glue("status", "--json").stdout)["bucket"]
    info = BucketInfo(status["endpoint"], status["name"], status["region"])
    found = gate.validation(info, LocalBucket(kit.home).credentials(), manifest["code"]["git_sha"], nodes=2)
    assert found.ok, found.missing()
    print(f"drill + report + compare + budget took {time.monotonic() - t0:.0f}s; screenshot {shot}")
