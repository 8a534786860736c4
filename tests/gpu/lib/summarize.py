"""One verdict table over every job of run.sh: each HDF5 dump's provenance (engine, backend and precision
asked and got, the Vulkan device / WebGPU adapter, fp16 options) beside its verdict in each report.

Usage: summarize.py RUNS_DIR STEPS_TSV OUT_JSON OUT_MD [ENV_JSON]
RUNS_DIR/<job>/**.h5 are the dumps, RUNS_DIR/<job>/**/results.json the reports (collect's own report,
reference = the engine's cpu/high; report-golden: reference = the ONNX Runtime golden).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import h5py

runs_dir, steps_tsv, out_json, out_md = (Path(a) for a in sys.argv[1:5])
env = json.loads(Path(sys.argv[5]).read_text()) if len(sys.argv) > 5 and Path(sys.argv[5]).is_file() else {}

OPTION_KEYS = ("vulkan_device", "use_fp16_storage", "use_fp16_arithmetic", "use_fp16_packed", "use_bf16_storage",
               "cpu_fp16_arithmetic", "accelerator", "enforce_f32", "precision_why", "vulkan_icd", "vulkan_icd_why",
               "kernels_why")


def dump_facts(path: Path) -> dict:
    facts: dict = {"file": str(path.relative_to(runs_dir))}
    try:
        with h5py.File(path, "r") as f:
            attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
    except Exception as err:  # an unreadable dump is a fact too
        facts["error"] = f"{type(err).__name__}: {err}"
        return facts
    prov = json.loads(attrs.get("provenance", "{}") or "{}")
    for key in ("engine", "engine_version", "backend_requested", "backend_actual", "precision_requested",
                "precision_effective", "gpu", "complete", "exit_status", "infer_ms", "input_label", "model_name"):
        value = attrs.get(key, prov.get(key))
        facts[key] = value.item() if hasattr(value, "item") else value
    facts["harness_duration_s"] = prov.get("harness_duration_s")
    facts["timed_out"] = prov.get("timed_out")
    options = (prov.get("raw_header") or {}).get("options") or {}
    facts["options"] = {k: options[k] for k in OPTION_KEYS if k in options}
    placement = options.get("placement") or {}
    if placement:
        facts["options"]["placement"] = {k: placement.get(k) for k in
                                         ("adapter", "gpu_ops", "cpu_ops", "ops", "fully_accelerated", "split", "rejected")}
    facts["raw_problems"] = prov.get("raw_problems") or []
    return facts


def report_verdicts(results: Path) -> tuple[dict, dict]:
    data = json.loads(results.read_text())
    by_file, meta = {}, {"reference": (data.get("reference") or {}).get("run"), "problems": data.get("problems") or [],
                         "fail_findings": [f.get("sentence", "") for f in data.get("findings") or []
                                           if f.get("severity") == "fail"][:6]}
    for run in data.get("runs") or []:
        summary = run.get("summary") or {}
        by_file[str(Path(run.get("file", "")).resolve())] = {
            "report": str(results.parent.relative_to(runs_dir)), "reference": run.get("reference"),
            "role": run.get("role"), "verdict": run.get("verdict"),
            "n_fail": summary.get("n_fail"), "n_warn": summary.get("n_warn"),
            "first_divergence": summary.get("first_divergence"), "first_divergence_op": summary.get("first_divergence_op"),
            "output": summary.get("output"), "output_rel_l2": summary.get("output_rel_l2"),
            "output_judgement": summary.get("output_judgement"), "verdict_reason": summary.get("verdict_reason")}
    return by_file, meta


steps = []
if steps_tsv.is_file():
    for line in steps_tsv.read_text().splitlines():
        job, step, rc, seconds, note = (line.split("\t") + [""] * 5)[:5]
        steps.append({"job": job, "step": step, "rc": rc, "seconds": seconds, "note": note})

jobs = {}
for job_dir in sorted(p for p in runs_dir.iterdir() if p.is_dir()) if runs_dir.is_dir() else []:
    verdicts, reports = {}, {}
    for results in sorted(job_dir.rglob("results.json")):
        by_file, meta = report_verdicts(results)
        reports[str(results.parent.relative_to(runs_dir))] = meta
        for file, verdict in by_file.items():
            verdicts.setdefault(file, []).append(verdict)
    dumps = []
    for h5 in sorted(job_dir.rglob("*.h5")):
        facts = dump_facts(h5)
        facts["verdicts"] = verdicts.get(str(h5.resolve()), [])
        dumps.append(facts)
    jobs[job_dir.name] = {"dumps": dumps, "reports": reports}

out_json.write_text(json.dumps({"env": env, "steps": steps, "jobs": jobs}, indent=1, default=str))


def fmt(value, digits=4):
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return "" if value is None else str(value)


lines = ["# layerdiff on the GPU machine: verdicts", ""]
for key in ("nvidia_smi", "vulkan_devices", "layerdiff_gpu_name", "layerdiff_fp16_features", "python", "numpy", "icd"):
    if key in env:
        lines.append(f"- {key}: {env[key]}")
lines += ["", "## Steps", "", "| job | step | rc | seconds | note |", "|---|---|---|---|---|"]
lines += [f"| {s['job']} | {s['step']} | {s['rc']} | {s['seconds']} | {s['note']} |" for s in steps]
for job, info in jobs.items():
    lines += ["", f"## {job}", "", "| run | backend | precision asked -> effective | device / adapter | infer ms | "
              "verdict (report: vs reference) | fail | warn | first divergence | output rel L2 |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for d in info["dumps"]:
        opts = d.get("options", {})
        device = opts.get("vulkan_device") or (opts.get("placement") or {}).get("adapter") or d.get("gpu") or ""
        if d.get("backend_requested") == "cpu":
            device = "cpu"
        backend = f"{d.get('backend_requested')} -> {d.get('backend_actual')}"
        precision = f"{d.get('precision_requested')} -> {d.get('precision_effective')}"
        name = Path(d["file"]).name + ("" if d.get("complete") in (True, 1, None) else " (INCOMPLETE)")
        if d.get("error"):
            lines.append(f"| {name} | | | {d['error']} | | | | | | |")
        for v in d["verdicts"] or [{}]:
            verdict = f"{v.get('verdict', '')} ({v.get('report', '')}: vs {v.get('reference', '')})" if v else "(in no report)"
            lines.append(f"| {name} | {backend} | {precision} | {device} | {fmt(d.get('infer_ms'), 3)} | {verdict} | "
                         f"{fmt(v.get('n_fail'))} | {fmt(v.get('n_warn'))} | {fmt(v.get('first_divergence'))} | "
                         f"{fmt(v.get('output_rel_l2'))} |")
    for report, meta in info["reports"].items():
        for sentence in meta["fail_findings"]:
            lines.append(f"- {report}: FAIL finding: {sentence[:400]}")
        for problem in meta["problems"][:3]:
            lines.append(f"- {report}: problem: {str(problem)[:300]}")
out_md.write_text("\n".join(lines) + "\n")
print("\n".join(lines))
