"""Run outputs: ``summary.json``, the final model, the ledgers and PNG plots.

Every file is written atomically (:mod:`pdpfl.io`). ``metrics.jsonl`` and the checkpoint are
written every round by :func:`pdpfl.runtime.loop.run_federation`. Every privacy number of the
summary, the terminal headline, ``epsilon.png`` and ``pdpfl compare`` comes from one typed
:class:`~pdpfl.ledger.PrivacySummary` (``summary["privacy"]``, versioned by its ``schema``), in
the unit of the run's algorithm.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from pdpfl.checkpoint import (
    CHECKPOINT_NAME,
    LEGACY_CHECKPOINT_NAME,
    METRICS_NAME,
    finite_record,
    has_checkpoint,
)
from pdpfl.config import ExperimentConfig
from pdpfl.fl.aggregation import summary_fields
from pdpfl.fl.api import ServerAlgorithm
from pdpfl.fl.pool import SiloPool
from pdpfl.io import save_npz, stale_temporaries, write_json
from pdpfl.ledger import PrivacyLedger, PrivacySummary, observers_of, save_ledger
from pdpfl.ledger.risk import run_risk
from pdpfl.ledger.runfolder import POOLED_LEDGER, seal_ledgers
from pdpfl.runtime.lock import LOCK_NAME
from pdpfl.runtime.model_file import MODEL_NAME, model_metadata, write_model

#: What a run writes into its output folder; ``overwrite=True`` removes exactly these.
RUN_OUTPUTS = (
    CHECKPOINT_NAME,
    LEGACY_CHECKPOINT_NAME,
    METRICS_NAME,
    "summary.json",
    "model.npz",
    "model.safetensors",
    "models",
    "run.log",
    "accuracy.png",
    "epsilon.png",
    "ledgers",
    "flower",
    "budgets.csv",
    "keys",
)


class OutputDirError(ValueError):
    """The output folder cannot be used (not a folder, not writable, or holds other files)."""


class OutputWriteError(OSError):
    """A run's file could not be written (a full disk, a quota, a folder made read-only): the
    run stopped; every round its checkpoint holds is kept and a resume continues from there."""

    def __init__(
        self, message: str, *, out_dir: Path, file: str, reason: str, rounds_saved: int
    ) -> None:
        super().__init__(message)
        self.out_dir, self.file, self.reason = out_dir, file, reason
        self.rounds_saved = rounds_saved


def output_write_error(err: OSError, out_dir: Path, rounds: int) -> OutputWriteError:
    """:class:`OutputWriteError` for ``err`` raised while writing into ``out_dir``: names the
    file (not its temporary name), the reason and how many of ``rounds`` are saved."""
    import re

    from pdpfl.checkpoint import load_checkpoint

    name = Path(str(err.filename or "")).name
    match = re.fullmatch(r"\.(.+)\.[^.]+\.tmp", name)
    file = match.group(1) if match else (name or "an output file")
    reason = err.strerror or str(err)
    try:
        ckpt = load_checkpoint(out_dir) if has_checkpoint(out_dir) else None
        saved = int(ckpt["next_round"]) if ckpt is not None else 0
    except (OSError, ValueError):
        saved = 0
    kept = (
        f"{saved} of {rounds} rounds are saved in {out_dir} and a resume continues from there"
        if saved
        else "no round was saved yet"
    )
    return OutputWriteError(
        f"out_dir: cannot write {file} in {out_dir} ({reason}); the run stopped cleanly: {kept} "
        "(free space or fix the folder, then resume the run: --resume, resume=True)",
        out_dir=out_dir,
        file=file,
        reason=reason,
        rounds_saved=saved,
    )


def check_resumable(
    out_dir: str | os.PathLike[str], option: str = "out_dir", force_flag: str = "overwrite=True"
) -> None:
    """``--resume`` never starts a run: ``out_dir`` must be a folder holding a run checkpoint
    (else :class:`OutputDirError` naming the folder), in every runtime."""
    out = Path(out_dir)
    if not out.exists():
        raise OutputDirError(
            f"{option}: nothing to resume: {out} does not exist (is the folder name right? "
            "without --resume a new run starts there)"
        )
    if not out.is_dir():
        raise OutputDirError(f"{option}: {out} exists and is not a folder")
    if not has_checkpoint(out):
        entries = sorted(p.name for p in out.iterdir() if p.name != LOCK_NAME)
        held = (
            "it is empty" if not entries else "it holds " + ", ".join(entries[:4])
            + (", ..." if len(entries) > 4 else "")
        )  # fmt: skip
        raise OutputDirError(
            f"{option}: nothing to resume in {out} (no {CHECKPOINT_NAME}; {held}); pass "
            f"{force_flag} to start a new run there, or choose another folder"
        )


def prepare_output_dir(
    out_dir: str | os.PathLike[str],
    *,
    resume: bool = False,
    overwrite: bool = False,
    option: str = "out_dir",
    flags: tuple[str, str] = ("overwrite=True", "resume=True"),
    outputs: tuple[str, ...] = RUN_OUTPUTS,
) -> Path:
    """Apply pdpfl's one overwrite rule to ``out_dir`` and make sure it is a writable folder.

    The rule (CLI, :func:`~pdpfl.runtime.simulation.run_simulation` and ``pdpfl compare``): a
    folder that holds anything is refused unless ``overwrite`` (pdpfl's own outputs in it are
    removed, other files are left alone) or ``resume`` (the folder must exist and hold a run
    checkpoint: :func:`check_resumable`). A missing folder is created. Problems raise
    :class:`OutputDirError` naming ``option`` and the remedy (``flags`` are the
    overwrite/resume spellings to suggest).
    """
    out = Path(out_dir)
    force_flag, resume_flag = flags
    if out.exists() and not out.is_dir():
        raise OutputDirError(f"{option}: {out} exists and is not a folder")
    if resume:
        check_resumable(out, option, force_flag)
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".pdpfl-write-test-", dir=out)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise OutputDirError(
            f"{option}: cannot write to {out} ({err.strerror or err}); choose another folder"
        ) from None
    if resume or overwrite:  # what a process killed mid-write (SIGKILL) left: never read
        for stale in stale_temporaries(out, outputs):
            stale.unlink(missing_ok=True)
    entries = sorted(p.name for p in out.iterdir() if p.name != LOCK_NAME)
    if not entries:
        return out
    shown = ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")
    if resume:
        return out  # checked above: it holds a checkpoint
    if overwrite:
        for name in outputs:
            target = out / name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            elif target.exists() or target.is_symlink():
                target.unlink()
        return out
    if has_checkpoint(out):
        raise OutputDirError(
            f"{option}: {out} already holds a run; pass {resume_flag} to continue it, "
            f"{force_flag} to overwrite it, or choose another folder"
        )
    raise OutputDirError(
        f"{option}: {out} is not empty (it holds {shown}); pass {force_flag} to overwrite "
        "pdpfl's outputs there, or choose another folder"
    )


#: Version of ``summary.json``; bump on any incompatible change.
SUMMARY_SCHEMA = "pdpfl.summary/2"

#: What one unit's neighbouring relation is, per privacy unit.
NEIGHBOURING = {
    "record": "add/remove one record (record-level, per-record ε)",
    "client": "add/remove one client (all of its data)",
    "user": "add/remove one user (all of their records in every silo)",
    "none": "none (no differential privacy)",
}

#: How each view of a run came to its privacy numbers.
VIEWS = {
    "operator": "operator: merged from every silo's own summary (simulator)",
    "operator-collected": "operator: collected from the local silos' state folders after the "
    "run (loopback launcher)",
    "coordinator": "coordinator: per-unit privacy summaries stay at the silos",
}


def _tag(observer: str) -> str:
    return observer.replace("-", "_")


def per_group(privacy: PrivacySummary) -> dict[str, dict[str, Any]]:
    """``summary["per_group"]``: one flat row per budget group (derived from the typed summary)."""
    out: dict[str, dict[str, Any]] = {}
    for g in privacy.groups:
        row: dict[str, Any] = {
            "count": g.units,
            "budget": g.budget_max,
            "budget_min": g.budget_min,
            "excluded": g.excluded,
            "stopped": g.stopped,
            "floor": g.floor,
        }
        for obs in ("third-party", "server"):
            spent = g.spent_max.get(obs) if privacy.private else float("inf")
            row[f"max_spent_{_tag(obs)}"] = spent
            row[f"mean_utilization_{_tag(obs)}"] = g.mean_utilization(obs)
            row[f"over_budget_{_tag(obs)}"] = int(g.over_budget.get(obs, 0))
            if privacy.lifetime:
                row[f"lifetime_max_{_tag(obs)}"] = g.lifetime_max.get(obs)
        row.update(g.info)
        out[g.label] = row
    return out


def privacy_warnings(config: ExperimentConfig, privacy: PrivacySummary) -> list[str]:
    """Warnings a run must show: observers whose view exceeds budgets that were not enforced,
    and units that were never used."""
    out = []
    unit = privacy.unit
    views = {"server": "the coordinating server's view", "third-party": "third parties' view"}
    if privacy.private:
        for enforced, other in (("third-party", "server"), ("server", "third-party")):
            over = privacy.over_budget(other)
            if config.privacy.adversary == enforced and over:
                why = " (it sees which silos took part)" if other == "server" else ""
                out.append(
                    f"privacy.adversary is {enforced}: {views[other]} exceeds the budget of "
                    f"{over} {unit}(s){why}; use adversary: both to enforce budgets against "
                    "every observer"
                )
    if privacy.capped:
        out.append(
            f"{privacy.capped} {unit}(s) have budgets above ε_max and were trained at q = 1, "
            "spending less than their budget (budgets.cap_at_epsilon_max is on)"
        )
    if privacy.excluded:
        out.append(
            f"{privacy.excluded} {unit}(s) were never used (sampling rate 0: a budget below "
            "the smallest achievable ε with privacy.allow_exclusion on, or below the baseline's "
            "uniform ε)"
        )
    for g in privacy.groups:
        if g.floor:
            out.append(
                f"{g.floor} {unit}(s) contribute almost nothing at ε = {g.label} for this plan: "
                f"their sampling rate is the δ-only floor (ε = 0 after the planned rounds, δ "
                "alone covers them); more noise σ or fewer rounds/steps give them usable rates"
            )
    out += lifetime_warnings(config, privacy)
    return out


def lifetime_warnings(config: ExperimentConfig, privacy: PrivacySummary) -> list[str]:
    """Units over their budget for life although the store was enforced (earlier runs that
    re-spent, or a non-private run, took them there). With ``lifetime.allow_respend`` the
    headline and ``summary["lifetime"]`` say that budgets were not enforced (the user's
    explicit choice), without a warning per run."""
    if privacy.lifetime != "enforced" or not privacy.private:
        return []
    over = max(
        (privacy.lifetime_over(o) for o in observers_of(config.privacy.adversary)), default=0
    )
    if not over:
        return []
    return [
        f"{over} {privacy.unit}(s) are over their budget for life: earlier runs on this data "
        "(with lifetime.allow_respend, or without DP) spent it; they sat out this run (see "
        "pdpfl privacy --store)"
    ]


def lifetime_fields(
    config: ExperimentConfig, privacy: PrivacySummary | None, store: dict[str, Any] | None
) -> dict[str, Any] | None:
    """``summary["lifetime"]``: each unit's budget for life in this view (None: no budget store
    was charged here), from the typed summary and the round loop's store report."""
    if privacy is None or not privacy.lifetime:
        return None if store is None else {**store, "epsilon": None}
    adv = config.privacy.adversary
    return {
        "enforced": privacy.lifetime == "enforced",
        "epsilon": privacy.lifetime_headline(adv),
        "eps_max": {_tag(o): privacy.lifetime_max(o) for o in ("third-party", "server")},
        "over_budget": max((privacy.lifetime_over(o) for o in observers_of(adv)), default=0),
        "prior_units": privacy.prior,
        **({k: v for k, v in store.items() if k != "enforced"} if store else {}),
    }


def privacy_fields(
    config: ExperimentConfig, privacy: PrivacySummary | None, view: str
) -> dict[str, Any]:
    """The summary's privacy section, all read from the typed ``privacy`` summary of this view
    (None: nothing is accounted in this view, e.g. a coordinator whose silos keep theirs)."""
    if privacy is None:
        return {
            "privacy_view": VIEWS.get(view, view),
            "privacy": None,
            "units": None,
            "units_stopped": None,
            "units_excluded": None,
            "units_capped": None,
            "over_budget": None,
            "over_budget_third_party": None,
            "over_budget_server": None,
            "eps_spent_max": {"third_party": None, "server": None},
            "epsilon": None,
            "per_group": {},
            "units_floor": None,
            "lifetime": None,
            "warnings": [],
        }
    enforced = observers_of(config.privacy.adversary)
    return {
        "privacy_view": VIEWS.get(view, view),
        "privacy": privacy.to_dict(),
        "units": privacy.units,
        "units_stopped": privacy.stopped,
        "units_excluded": privacy.excluded,
        "units_capped": privacy.capped,
        "units_floor": privacy.floor,
        "lifetime": lifetime_fields(config, privacy, None),
        "over_budget": max(privacy.over_budget(o) for o in enforced),
        "over_budget_third_party": privacy.over_budget("third-party"),
        "over_budget_server": privacy.over_budget("server"),
        "eps_spent_max": {_tag(o): privacy.spent_max(o) for o in ("third-party", "server")},
        "epsilon": privacy.headline_epsilon(config.privacy.adversary),
        "per_group": per_group(privacy),
        **(
            {"noise_multiplier": privacy.info["noise_multiplier"]}
            if "noise_multiplier" in privacy.info
            else {}
        ),
        "warnings": privacy_warnings(config, privacy),
    }


def silo_report(
    names: dict[int, str], lost: list[dict[str, Any]], result: dict[str, Any]
) -> dict[str, Any]:
    """``summary["silos"]``: how many silos the run had, the ones it lost (by the data's name,
    with the round and the reason) and which rounds aggregated how many silos' contributions
    (consecutive rounds with the same count in one entry, 1-based)."""
    return {
        "total": len(names),
        "names": [names[s] for s in sorted(names)],
        "lost": lost,
        "aggregated": aggregated_runs(list(result.get("metrics") or [])),
    }


def aggregated_runs(metrics: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``[{"rounds": [first, last], "silos": n}, ...]`` from the metrics lines' contributions."""
    runs: list[dict[str, Any]] = []
    for line in metrics:
        r, n = int(line.get("round", 0)) + 1, line.get("contributions")
        if runs and runs[-1]["silos"] == n and runs[-1]["rounds"][1] == r - 1:
            runs[-1]["rounds"][1] = r
        else:
            runs.append({"rounds": [r, r], "silos": n})
    return runs


def holder_names(run_dir: str | os.PathLike[str]) -> dict[str, str]:
    """Ledger holder (file stem ``client_<i>``) → the silo's name in the data, read from the
    run's ``summary.json`` (``data.silo_names`` or ``silos.names``); empty when unknown.

    Ledger files keep their index names (``ledgers/client_<i>.npz``), so run folders written
    before the names were shown still read the same."""
    import json

    try:
        summary = json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(summary, dict):
        return {}
    names = (summary.get("data") or {}).get("silo_names") or (summary.get("silos") or {}).get(
        "names"
    )
    if not isinstance(names, list):
        return {}
    return {f"client_{i}": str(name) for i, name in enumerate(names)}


def with_silo_names(table: dict[str, np.ndarray], names: dict[str, str]) -> dict[str, np.ndarray]:
    """``table`` with each holder shown by the silo's name in the data (``client_2`` → ``s2``);
    holders without a known name (``server``, a silo state folder) are kept. A row of the
    simulator's pooled client ledger (``clients``) is shown as held by its client, as a client's
    own ledger was (its id is the client's name)."""
    pooled = np.asarray(table["holder"]).astype(str) == POOLED_LEDGER
    if not names and not pooled.any():
        return table
    holders = np.array([names.get(str(h), str(h)) for h in table["holder"]], dtype=object)
    holders[pooled] = np.asarray(table["id"]).astype(str)[pooled]
    return {**table, "holder": holders.astype(str) if len(holders) else table["holder"]}


def holder_stems(table: dict[str, np.ndarray], names: dict[str, str]) -> np.ndarray:
    """Each row's ledger file stem (``client_<i>``, ``server``), a pooled client row's being its
    client's (``client_<i>``, i its index in the run's silo names): the old spelling answers."""
    stems = np.asarray(table["holder"]).astype(str).astype(object)
    pooled = stems == POOLED_LEDGER
    if pooled.any():
        stem_of = {name: stem for stem, name in names.items()}
        ids = np.asarray(table["id"]).astype(str)
        stems[pooled] = [stem_of.get(i, POOLED_LEDGER) for i in ids[pooled]]
    return stems.astype(str) if len(stems) else np.asarray(table["holder"])


def build_summary(
    config: ExperimentConfig, result: dict[str, Any], view: str = "operator"
) -> dict[str, Any]:
    """The ``summary.json`` record of a finished (or interrupted) run.

    ``view="operator"`` (simulator): the privacy numbers merge every silo's own summary, which
    only an operator who owns all silos can see. ``view="coordinator"`` (a deployment): the
    silos' summaries stay at the silos; the privacy fields say so.
    """
    from pdpfl.randomness import REPRODUCIBLE_LABEL, SECURE_LABEL

    metrics = result["metrics"]
    accs = [m["accuracy"] for m in metrics if m.get("accuracy") is not None]
    server_state = result.get("server_state") or {}
    unit = config.algorithm.unit
    # an algorithm may state its own relation (e.g. PriFedSync's replace-one for WOR batches)
    relation = getattr(config.algorithm, "neighbouring", None)
    summary: dict[str, Any] = {
        "schema": SUMMARY_SCHEMA,
        "name": config.name,
        "algorithm": config.algorithm.name,
        "seed": config.seed,
        "randomness": SECURE_LABEL if config.randomness == "secure" else REPRODUCIBLE_LABEL,
        "privacy_unit": unit,
        "neighbouring": relation if isinstance(relation, str) else NEIGHBOURING.get(unit, unit),
        "adversary": config.privacy.adversary,
        "aggregation": summary_fields(config),
        "rounds_completed": len(metrics),
        "completed": bool(result.get("completed", True)),
        "diverged": result.get("diverged"),
        "final_accuracy": accs[-1] if accs else None,
        "last3_mean_accuracy": float(np.mean(accs[-3:])) if accs else None,
        "final_loss": metrics[-1]["loss"] if metrics else None,
        "final_mean_client_accuracy": metrics[-1].get("mean_client_accuracy") if metrics else None,
        "participation": {str(k): v for k, v in server_state.get("participation", {}).items()},
        "empty_rounds": server_state.get("empty_rounds"),
        "seconds": float(result["seconds"]),
        "config": config.model_dump(mode="json"),
        # the run's fingerprint (pdpfl.config.run_fingerprint), which its checkpoints carry
        "config_hash": result.get("fingerprint"),
        # the run's identity: its checkpoint, ledgers and model are sealed under it
        "run_id": result.get("run_id"),
    }
    if result.get("silos") is not None:
        summary["silos"] = result["silos"]
    if server_state.get("noise_shares"):  # the discrete shares' encoding (bits, scale, wrap)
        summary["aggregation"]["discrete_shares"] = server_state["noise_shares"]
    if server_state.get("central_noise"):  # privacy.central_noise: discrete (grid, scale)
        summary["central_noise"] = server_state["central_noise"]
    if server_state.get("weighting_noise"):  # ULDP-FL private weighting's discrete grid
        summary["aggregation"]["private_weighting_noise"] = server_state["weighting_noise"]
    summary.update(privacy_fields(config, result.get("privacy"), view))
    store = result.get("lifetime")
    summary["lifetime"] = lifetime_fields(config, result.get("privacy"), store)
    extension = result.get("extension")
    summary["extension"] = extension
    summary["warnings"] = (
        list(summary["warnings"])
        + list(server_state.get("warnings") or [])
        + list((store or {}).get("warnings") or [])
        + list((extension or {}).get("warnings") or [])
    )
    return summary


def write_outputs(
    config: ExperimentConfig,
    result: dict[str, Any],
    out_dir: str | Path,
    *,
    clients: dict[int, Any] | SiloPool | None = None,
    plots: bool = True,
    view: str = "operator",
    warnings: list[str] | None = None,
    data: dict[str, Any] | None = None,
    server: ServerAlgorithm | None = None,
    parameter_names: list[str] | None = None,
) -> dict[str, Any]:
    """Write ``summary.json``, ``model.npz``, ``ledgers/`` and plots; return the summary (as
    written: values that are not finite numbers, such as ε = ∞ without DP, are None).

    ``warnings`` (problems found before training, e.g. silos without test records) are
    listed first in the summary's ``warnings``; ``data`` describes the federation trained on
    (``summary["data"]``). Each silo's ledger (and the server's, where the unit's ledger lives
    there) is written to ``ledgers/`` for ``pdpfl privacy``.
    """
    from pdpfl.runtime.plots import write_plots

    out = Path(out_dir)
    if result.get("silos") is None and clients is not None:  # in-process: no silo is lost
        names = (data or {}).get("silo_names") or [str(c) for c in sorted(clients)]
        result = {
            **result,
            "silos": silo_report(dict(zip(sorted(clients), names, strict=False)), [], result),
        }
    summary = build_summary(config, result, view=view)
    if warnings:
        summary["warnings"] = [*warnings, *summary.get("warnings", [])]
    if data is not None:
        summary["data"] = data
    pool = clients if isinstance(clients, SiloPool) else None
    each: dict[int, Any] = clients if isinstance(clients, dict) else {}
    silos = [pool] if pool is not None else list(each.values())
    summary["risk"] = run_risk([*silos, server], summary["privacy_unit"])
    if plots:  # the plots and the model's header read ε = ∞ (no DP) as such
        write_plots(result["metrics"], summary, out)
    run_id, next_round = result.get("run_id"), result.get("next_round")
    if next_round is None:
        next_round = len(result["metrics"])
    write_model(
        out / MODEL_NAME,
        result["params"],
        parameter_names,
        model_metadata(summary),
        run_id=run_id,
        round_count=int(next_round),
    )
    summary = finite_record(summary)  # what is returned is what is on disk: NaN/inf become None
    save_npz(out / "model.npz", **{f"p{i:03d}": p for i, p in enumerate(result["params"])})
    holders: list[tuple[str, Any]] = (
        [(POOLED_LEDGER, pool)]  # one sealed file, one row per client
        if pool is not None
        else [(f"client_{cid}", c) for cid, c in each.items()]
    )
    holders.append(("server", server))
    ledgers = {
        name: holder.ledger
        for name, holder in holders
        if isinstance(getattr(holder, "ledger", None), PrivacyLedger)
    }
    if ledgers and run_id is not None:
        seal_ledgers(out / "ledgers", ledgers, str(run_id), int(next_round))
    else:
        for name, ledger in ledgers.items():  # a record without a run id (tests, stubs)
            save_ledger(ledger, out / "ledgers" / f"{name}.npz")
    write_json(out / "summary.json", summary)
    return summary
