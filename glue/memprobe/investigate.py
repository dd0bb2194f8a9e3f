"""The whole investigation: one boundary search per varied input, the phase breakdown of a step that
fits, and the remedies at the input that fails. Every trial is a fresh process (runner.run_trial).
Returns the report as a plain dict (the JSON that is saved, rendered by report.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from glue.errors import GlueError
from glue.memprobe import remedies as rem
from glue.memprobe import search
from glue.memprobe.limits import safety_limit_mb
from glue.memprobe.runner import ERROR, FIT, OOM, TrialOutcome, run_trial

if TYPE_CHECKING:
    from glue.memprobe.job import JobTrials

# Integer trainer settings that size a step, and how far a default search reaches above the config.
VARIABLES = ("batch_size", "seq_len", "d_model", "n_layer")
DEFAULT_REACH = 8
REPORT_VERSION = 1
CHECKPOINTING = ("checkpointing", "gradient_checkpointing")  # the same arithmetic, recomputed: a reference loss


@dataclass
class Options:
    vary: list[str] = field(default_factory=lambda: ["batch_size"])
    ranges: dict[str, tuple[int, int]] = field(default_factory=dict)
    grid: str = "int"
    device: str = "cpu"
    memory_limit_mb: int | None = None
    limit_source: str = ""
    mechanism: str = "auto"
    trial_steps: int = 2
    accept_steps: int = 20
    tolerance: float = 0.05
    accum: int = 4
    remedies: tuple[str, ...] = rem.NAMES
    breakdown: bool = True
    remedies_at: int | None = None
    trial_timeout_s: float = 600.0
    snapshot_path: Path | None = None
    progress: Callable[[str, TrialOutcome | None], None] = field(default=lambda msg, outcome: None)
    on_stage: Callable[[dict[str, Any]], None] = field(default=lambda partial: None)  # after each stage
    job: JobTrials | None = None  # a run's own job: trials of its command on a VM (else tiny_gpt's worker here)
    declared: dict[str, dict[str, Any]] = field(default_factory=dict)  # a run's own remedies: NAME -> config changes
    run: str | None = None
    config_path: str | None = None  # --config: the run.yaml the reproducer names
    acceptance: dict[str, dict[str, float | None]] = field(default_factory=dict)  # run.yaml evaluation.metrics


def default_range(var: str, cfg: dict[str, Any]) -> tuple[int, int]:
    lo = int(cfg["n_head"]) if var == "d_model" and "n_head" in cfg else 1
    return lo, max(lo, int(cfg[var]) * DEFAULT_REACH)


def values_for(var: str, lo: int, hi: int, grid: str, cfg: dict[str, Any]) -> Sequence[int]:
    if var == "d_model" and "n_head" in cfg:  # must stay a multiple of n_head
        head = int(cfg["n_head"])
        vals: Sequence[int] = [v for v in search.candidates(lo, hi, grid) if v % head == 0] if grid != "int" \
            else range(-(-lo // head) * head, hi + 1, head)
        if not len(vals):
            raise GlueError(f"no d_model in {lo}:{hi} is a multiple of n_head={head}")
        return vals
    return search.candidates(lo, hi, grid)


class Prober:
    def __init__(self, cfg: dict[str, Any], opts: Options) -> None:
        self.cfg, self.opts = cfg, opts
        self.trials = 0
        self.model: dict[str, Any] | None = None
        # Room to run without the probe's limit: on this machine 90% of what is free; a job's VM has its own.
        self.safety_mb = safety_limit_mb() if opts.device == "cpu" and opts.job is None else None

    def trial(self, changed: dict[str, Any], *, steps: int, limit_mb: int | None, mode: str = "trial",
              what: str = "", snapshot: Path | None = None) -> TrialOutcome:
        cfg = {**self.cfg, **changed}
        if self.opts.job is not None:
            out = self.opts.job.trial(cfg, changed, steps=steps, limit_mb=limit_mb, mode=mode,
                                      timeout_s=self.opts.trial_timeout_s, mechanism=self.opts.mechanism)
        else:
            spec: dict[str, Any] = {"mode": mode, "cfg": cfg, "device": self.opts.device, "steps": steps}
            if snapshot is not None:
                spec["snapshot"] = str(snapshot)
            out = run_trial(spec, changed, limit_mb=limit_mb, mechanism=self.opts.mechanism,
                            timeout_s=self.opts.trial_timeout_s)
        self.trials += 1
        if self.model is None and out.detail.get("model"):
            self.model = out.detail["model"]
        if self.trials == 1 and out.status == ERROR:
            last = out.evidence.splitlines()[-1] if out.evidence else ""
            raise GlueError(f"the first trial failed before any memory question could be asked: {out.error}"
                            + (f" — {last}" if last and last not in (out.error or "") else ""))
        self.opts.progress(what, out)
        return out

    # -- boundary search --------------------------------------------------------------------

    def search(self, var: str) -> dict[str, Any]:
        if var not in VARIABLES and self.opts.job is None:
            raise GlueError(f"cannot vary {var!r}; choose from {', '.join(VARIABLES)}")
        lo, hi = self.opts.ranges.get(var) or default_range(var, self.cfg)
        values = values_for(var, lo, hi, self.opts.grid, self.cfg)
        start = int(self.cfg[var])
        done: list[TrialOutcome] = []

        def probe(value: int) -> str:
            out = self.trial({var: value}, steps=self.opts.trial_steps, limit_mb=self.opts.memory_limit_mb,
                             what=f"{var}={value}")
            done.append(out)
            return out.status

        found = search.find_boundary(probe, values, start=start if lo <= start <= hi else None)
        return {
            "vary": var, "config_value": start, "range": [lo, hi], "grid": self.opts.grid,
            "candidates": len(values), "trial_bound": search.trial_bound(len(values)),
            "trial_count": found.trials, "largest_fit": found.largest_fit, "smallest_fail": found.smallest_fail,
            "stopped": found.stopped, "lowest_value": values[0], "highest_value": values[-1],
            "trials": [_row(o) for o in sorted(done, key=lambda o: o.changed[var])],
        }

    # -- phase breakdown --------------------------------------------------------------------

    def breakdown(self, first: dict[str, Any]) -> dict[str, Any]:
        var = first["vary"]
        value = first["largest_fit"] if first["largest_fit"] is not None else first["lowest_value"]
        limit = self.safety_mb  # the profiler needs room of its own: not the probe's limit
        out = self.trial({var: value}, steps=2, limit_mb=limit, mode="breakdown", what=f"breakdown at {var}={value}",
                         snapshot=self.opts.snapshot_path if self.opts.device == "cuda" else None)
        rec: dict[str, Any] = {"at": {var: value}, "status": out.status, "limit": out.limit,
                               "why_here": "largest input that fits" if first["largest_fit"] is not None
                               else "smallest input (nothing fits under the limit; measured without it)"}
        rec.update({k: out.detail[k] for k in ("breakdown", "resident", "model", "cuda_snapshot")
                    if k in out.detail})
        rec.update(peak_rss_mb=out.peak_rss_mb, rss_base_mb=out.rss_base_mb, cuda=out.cuda, error=out.error)
        if self.opts.job is not None:  # the snapshot is on the VM: fetched as it is (never unpickled here)
            rec.pop("cuda_snapshot", None)
            data = self.opts.job.fetch_snapshot() if out.detail.get("cuda_snapshot") else None
            if data is not None and self.opts.snapshot_path is not None:
                self.opts.snapshot_path.write_bytes(data)
                rec["cuda_snapshot_file"] = str(self.opts.snapshot_path)
        elif self.opts.snapshot_path is not None and out.detail.get("cuda_snapshot"):
            rec["cuda_snapshot_file"] = str(self.opts.snapshot_path)
        return rec

    # -- remedies ---------------------------------------------------------------------------

    def remedies(self, first: dict[str, Any]) -> dict[str, Any]:
        var = first["vary"]
        probed = {t["changed"][var]: t for t in first["trials"]}
        if self.opts.remedies_at is not None:
            value = self.opts.remedies_at
        elif probed.get(first["config_value"], {}).get("status") == OOM:
            value = first["config_value"]
        elif first["smallest_fail"] is not None:
            value = first["smallest_fail"]
        else:
            return {"skipped": f"nothing failed in {var} {first['range'][0]}:{first['range'][1]}: no remedy needed"}
        at = {**self.cfg, var: value}
        steps = self.opts.accept_steps
        # The reference: the unchanged step at this input with room to run (no probe limit).
        ref = self.trial({var: value}, steps=steps, limit_mb=self.safety_mb, what=f"reference at {var}={value}")
        baseline = probed.get(value)
        if baseline is None:
            b = self.trial({var: value}, steps=steps, limit_mb=self.opts.memory_limit_mb,
                           what=f"baseline at {var}={value}")
            baseline = _row(b)
        rows: list[dict[str, Any]] = []
        if self.opts.job is not None:  # the run's declared remedies, and its framework's, at this input
            available = {**rem.implied(at, self.opts.accum), **self.opts.declared}
            chosen = rem.declared({k: available[k] for k in self.opts.remedies if k in available}, at)
        else:
            chosen = rem.remedies(at, self.opts.accum, self.opts.remedies)
        for remedy in chosen:
            row: dict[str, Any] = {"name": remedy.name, "description": remedy.description, "change": remedy.change}
            if remedy.skipped:
                rows.append({**row, "status": "skipped", "note": remedy.skipped})
                continue
            out = self.trial({var: value, **remedy.change}, steps=steps, limit_mb=self.opts.memory_limit_mb,
                             what=f"remedy {remedy.name} at {var}={value}")
            rows.append({**row, **_row(out)})
        reference_loss, ref_note = None, ""
        if ref.status == FIT:
            reference_loss, ref_note = ref.loss_last, "the unchanged step at this input, run without the limit"
        else:
            ck = next((r for r in rows if r["name"] in CHECKPOINTING and r["status"] == FIT), None)
            if ck is not None:
                reference_loss = ck["loss_last"]
                ref_note = ("activation checkpointing (the same arithmetic, recomputed): the unchanged step "
                            f"does not fit even without the limit ({ref.status})")
        for r in rows:
            rem.judge(r, reference_loss, self.opts.tolerance, self.opts.acceptance)
        return {
            "at": {var: value}, "steps": steps, "tolerance": self.opts.tolerance,
            "acceptance": _acceptance_text(self.opts, steps),
            "reference": {**_row(ref), "loss": reference_loss, "note": ref_note},
            "baseline": baseline, "items": rows,
            "works": [r["name"] for r in rows if r.get("status") == FIT and r.get("accepted")],
        }


def _acceptance_text(opts: Options, steps: int) -> str:
    loss = f"loss after {steps} steps within {opts.tolerance:.1%} of the reference"
    if not opts.acceptance:
        return loss
    return (f"the run's acceptance criteria ({rem.criteria_text(opts.acceptance)}) on the last evaluation the trial "
            f"recorded in {steps} steps; a trial that recorded none: the {loss}")


def _row(o: TrialOutcome) -> dict[str, Any]:
    d = o.as_dict()
    d.pop("detail", None)
    return d


def run(cfg: dict[str, Any], opts: Options) -> dict[str, Any]:
    """Searches, breakdown, remedies: the report."""
    if not opts.vary:
        raise GlueError("nothing to vary: give --vary batch_size (or seq_len, d_model, n_layer)")
    for var in opts.vary:
        if var not in VARIABLES and opts.job is None:
            raise GlueError(f"cannot vary {var!r}; choose from {', '.join(VARIABLES)}")
        if var not in cfg:
            raise GlueError(f"the trainer config has no {var!r}")
    at = opts.remedies_at
    if opts.remedies and at is not None:  # checked before any trial, not found out by the last ones
        if at < 1:
            raise GlueError(f"--remedies-at {at}: {opts.vary[0]} must be at least 1")
        if opts.vary[0] == "d_model" and opts.job is None and at % int(cfg["n_head"]):
            raise GlueError(f"--remedies-at {at}: d_model must be a multiple of n_head={cfg['n_head']}; "
                            f"try {max(1, round(at / int(cfg['n_head']))) * int(cfg['n_head'])}")
    prober = Prober(cfg, opts)
    searches: list[dict[str, Any]] = []
    report: dict[str, Any] = {"searches": searches, "complete": False}
    for var in opts.vary:
        searches.append(prober.search(var))
        opts.on_stage(report)
    if opts.breakdown:
        report["breakdown"] = prober.breakdown(searches[0])
        opts.on_stage(report)
    if opts.remedies:
        report["remedies"] = prober.remedies(searches[0])
    report["complete"] = True
    report["model"] = prober.model
    report["reproducer"] = reproducer(report, opts)
    report["trial_count"] = prober.trials
    report["findings"] = findings(report, opts)
    return report


def _mb(x: float | None) -> str:
    return "?" if x is None else f"{x:,.1f} MB"


def findings(report: dict[str, Any], opts: Options) -> list[str]:
    """The report in a few sentences."""
    lines: list[str] = []
    model = report.get("model") or {}
    fixed = sum(float(model.get(k) or 0) for k in ("weights_mb", "expected_gradients_mb",
                                                   "expected_optimizer_state_mb"))
    limit = f"{opts.memory_limit_mb} MB" if opts.memory_limit_mb else "the device's memory"
    for s in report["searches"]:
        var = s["vary"]
        head = f"{var}: {s['trial_count']} trials (bound {s['trial_bound']})"
        if s["stopped"]:
            lines.append(f"{head}; stopped: {s['stopped']}")
        if s["smallest_fail"] is None:
            lines.append(f"{head}; everything up to {s['highest_value']} fits under {limit}: "
                         "raise --range to find the boundary")
        elif s["largest_fit"] is None and all(t.get("phase") == "startup" for t in s["trials"]):
            lines.append(f"{head}; every trial died while starting up (importing torch): {limit} is below what the "
                         "runtime itself needs; raise --memory-limit-mb")
        elif s["largest_fit"] is None:
            base = next((t.get("rss_base_mb") for t in s["trials"] if t.get("rss_base_mb")), None)
            host = f" + the torch runtime ~{_mb(base)} on the host" if opts.device == "cpu" and base else ""
            lines.append(f"{head}; even {var}={s['smallest_fail']} does not fit under {limit}: the fixed part "
                         f"(weights + gradients + optimizer state = {_mb(fixed)}{host}) leaves no room — a smaller "
                         "input cannot help; train fewer weights, shard or offload, or get more memory")
        else:
            lines.append(f"{head}; largest that fits {s['largest_fit']}, smallest that fails "
                         f"{s['smallest_fail']} (under {limit})")
    bd = report.get("breakdown") or {}
    parts = (bd.get("breakdown") or {}).get("at_peak_mb")
    if parts:
        b = bd["breakdown"]
        lines.append(f"whole step at {_fmt_at(bd['at'])}: peak {_mb(b['peak_mb'])} of tensors in {b['peak_phase']} = "
                     f"weights {_mb(parts['weights'])}, gradients {_mb(parts['gradients'])}, optimizer state "
                     f"{_mb(parts['optimizer_state'])}, activations {_mb(parts['activations'])}"
                     + "".join(f", {k} {_mb(parts[k])}" for k in ("runtime", "other") if k in parts))
    rp = report.get("reproducer")
    if rp:
        verdict = (f"the fixed part (weights + gradients + optimizer state, {_mb(rp['fixed_mb'])}) alone exceeds "
                   f"{rp['limit_mb']} MB: no smaller input can help" if rp["fixed_exceeds_limit"] else
                   f"the fixed part (weights + gradients + optimizer state) is {_mb(rp['fixed_mb'])}: "
                   "a smaller input or a remedy can fit")
        lines.append(f"reproduce the failure: {rp['command']}; {verdict}")
    rm = report.get("remedies") or {}
    if rm.get("skipped"):
        lines.append(f"remedies: {rm['skipped']}")
    elif rm.get("items"):
        works = ", ".join(rm["works"]) or "none"
        off = [r["name"] for r in rm["items"] if r.get("status") == FIT and not r.get("accepted")]
        oom = [r["name"] for r in rm["items"] if r.get("status") == OOM]
        check = "the run's acceptance criteria (else the loss check)" if opts.acceptance else "the loss check"
        text = f"remedies at {_fmt_at(rm['at'])}: fit and pass {check}: {works}"
        if off:
            text += f"; fit but fail {check}: {', '.join(off)}"
        if oom:
            text += f"; still out of memory: {', '.join(oom)}"
        lines.append(text)
    return lines


def _fmt_at(at: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in at.items())


def reproducer(report: dict[str, Any], opts: Options) -> dict[str, Any] | None:
    """The smallest failing input as a command the user can run (one memprobe trial at that value: glue
    deploy has no per-run config override), and whether the fixed part alone exceeds the memory."""
    s = report["searches"][0]
    if s["smallest_fail"] is None:
        return None
    var, value = s["vary"], s["smallest_fail"]
    where = f"--run {opts.run}" if opts.run else f"--config {opts.config_path or 'run.yaml'}"
    model = report.get("model") or {}
    fixed = sum(float(model.get(k) or 0) for k in ("weights_mb", "expected_gradients_mb"))
    fixed += float(model.get("optimizer_state_mb") or model.get("expected_optimizer_state_mb") or 0)
    limit = opts.memory_limit_mb
    return {
        "at": {var: value},
        "command": f"glue memprobe {where} --vary {var} --range {value}:{value} --no-breakdown --no-remedies",
        "fixed_mb": round(fixed, 3), "limit_mb": limit,
        "fixed_exceeds_limit": bool(limit and fixed > limit),
    }
