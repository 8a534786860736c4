"""The fleet view: runs grouped by GPU x driver x engine version x configuration, with their verdicts.

A GPU family is often banned for one bad output, when the cause was one driver build (or the loader
picking another driver than expected). Grouping the verdicts by the driver each run recorded
(`gpu_driver`, `gpu_driver_build`, and for a phone its `build_fingerprint`, which names the vendor driver
it ships) shows whether a configuration fails with one driver and passes with another. It reads only run
attributes and the runs' verdicts (summary.py): the judge stage, no tensor.
"""
from __future__ import annotations

import pandas as pd

from layerdiff.analyzer.findings.finding import Finding, FindingKind, Severity

FLEET_COLUMNS = ["gpu", "driver", "driver_build", "build_fingerprint", "engine", "engine_version", "backend",
                 "precision", "precision_effective", "runs", "n_pass", "n_warn", "n_fail", "run_labels"]
IDENTITY = ["gpu", "driver", "driver_build", "build_fingerprint"]
CONFIG = ["engine", "engine_version", "backend", "precision"]
JUDGED = ("pass", "warn", "fail")


def _identity(run) -> dict:
    attrs = run.attrs
    return {"gpu": str(attrs.get("gpu", "") or ""), "driver": str(attrs.get("gpu_driver", "") or ""),
            "driver_build": str(attrs.get("gpu_driver_build", "") or ""),
            "build_fingerprint": str(attrs.get("build_fingerprint", "") or ""),
            "engine": str(attrs.get("engine", "") or ""), "engine_version": str(attrs.get("engine_version", "") or ""),
            "backend": str(run.backend), "precision": str(run.precision)}


def _on_a_gpu(run) -> bool:
    """A run whose engine computed on a GPU (also partly: `vulkan+cpu`): CPU runs have no driver to
    blame, and counting them would make every CPU-versus-GPU comparison look like a fleet."""
    return run.backend.split("+")[0] not in ("", "cpu")


def fleet_view(runs: list, summary: pd.DataFrame) -> pd.DataFrame:
    """One row per GPU x driver x engine version x backend/precision among the judged GPU runs, with its
    pass / warn / fail counts; empty unless those runs span two or more GPU/driver identities (one identity
    is the ordinary report, and a table would only repeat it)."""
    # the summary holds one row per run, in the runs' order: two runs can share a label (the same
    # configuration on two drivers), so a verdict is matched by position, never by label
    verdicts = list(summary["verdict"]) if len(summary) == len(runs) else []
    rows = [{**_identity(run), "verdict": verdict, "run": run.label, "precision_effective": str(run.attrs.get(
             "precision_effective", "") or "")} for run, verdict in zip(runs, verdicts)
            if verdict in JUDGED and _on_a_gpu(run)]
    if not rows:
        return pd.DataFrame(columns=FLEET_COLUMNS)
    frame = pd.DataFrame(rows)
    identities = frame[IDENTITY].drop_duplicates()
    if len(identities) < 2 or (identities == "").all(axis=None):
        return pd.DataFrame(columns=FLEET_COLUMNS)
    grouped = []
    for key, group in frame.groupby(IDENTITY + CONFIG, sort=True):
        counts = group["verdict"].value_counts()
        grouped.append({**dict(zip(IDENTITY + CONFIG, key)), "runs": len(group),
                        "precision_effective": ", ".join(sorted(set(group["precision_effective"]) - {""})),
                        **{f"n_{v}": int(counts.get(v, 0)) for v in JUDGED}, "run_labels": ", ".join(group["run"])})
    return pd.DataFrame(grouped, columns=FLEET_COLUMNS)


def driver_label(row) -> str:
    """How a sentence names one driver identity: its GPU, driver version and library, build fingerprint."""
    parts = [row["gpu"] or "GPU not recorded"]
    if row["driver"]:
        parts.append(f"driver {row['driver']}")
    if row["driver_build"]:
        parts.append(f"build {row['driver_build'][:12]}")
    if row["build_fingerprint"]:
        parts.append(f"system {row['build_fingerprint']}")
    return ", ".join(parts)


def _outcome(row) -> str:
    """'fails with every run', 'passes with every run' or the counts, for one group."""
    for verdict, verb in (("fail", "fails"), ("warn", "warns"), ("pass", "passes")):
        if row[f"n_{verdict}"] == row["runs"]:
            return f"{verb} with {'every run' if row['runs'] > 1 else 'its run'}"
    return f"passes {row['n_pass']}, warns {row['n_warn']}, fails {row['n_fail']} of {row['runs']} runs"


def fleet_findings(view: pd.DataFrame) -> list[Finding]:
    """One finding per configuration (engine version, backend/precision) whose verdicts differ between
    driver identities: the driver, not the GPU family, is then what separates good from bad output."""
    found = []
    for key, groups in view.groupby(CONFIG, sort=True):
        if len(groups) < 2 or groups[["n_pass", "n_warn", "n_fail"]].drop_duplicates().shape[0] < 2:
            continue
        engine, version, backend, precision = key
        ordered = groups.sort_values(["n_fail", "n_warn"], ascending=False)
        parts = [f"{_outcome(row)} on {driver_label(row)}" for _, row in ordered.iterrows()]
        worst = ordered.iloc[0]
        severity = Severity.FAIL if worst["n_fail"] else Severity.WARN
        cause = ("the same GPU with another driver" if groups["gpu"].nunique() == 1
                 else "another GPU or driver")
        sentence = (f"{backend}/{precision} ({engine} {version}) " + "; ".join(parts[:-1]) + f"; but {parts[-1]}: "
                    f"same engine and configuration, so {cause} separates the outcomes.")
        numbers = {"groups": int(len(groups)), "runs": int(groups["runs"].sum()),
                   "failing_drivers": int((groups["n_fail"] > 0).sum()),
                   "passing_drivers": int((groups["n_pass"] == groups["runs"]).sum())}
        found.append(Finding(FindingKind.FLEET, str(worst["run_labels"]).split(", ")[0], "", "", sentence,
                             severity=severity, numbers=numbers))
    return found
