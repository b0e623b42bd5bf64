"""In-process simulation: every silo is a Python object, the transport is a direct call.

It runs the same :func:`pdpfl.runtime.loop.run_federation` loop and the same algorithm objects as
the Flower runtime, so with ``randomness: reproducible`` and the same seed both produce the same
model. Each silo object keeps its own secret randomness (``randomness: secure``), exactly as a
silo process would.

Because one operator owns every silo here, the simulator may read each silo's privacy summary
and assemble a full report (per budget group, per observer); a Flower deployment cannot, since
those summaries stay at the silos.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pdpfl.config import ExperimentConfig
from pdpfl.errors import TrainingDiverged
from pdpfl.fl.api import (
    ClientAlgorithm,
    Contribution,
    Params,
    Scalars,
    check_contribution,
    check_evaluation,
)
from pdpfl.fl.pool import PooledEvaluation, SiloPool
from pdpfl.ledger import PrivacySummary

if TYPE_CHECKING:
    from pdpfl.data.federation import Federation

log = logging.getLogger(__name__)

#: The key of a :class:`~pdpfl.fl.pool.SiloPool`'s one entry in ``client_states`` and
#: ``privacy_summaries`` (not a client id).
POOL_KEY = -1


class InProcessTransport:
    """A :class:`~pdpfl.runtime.loop.Transport` that calls client objects directly.

    What a silo hands over passes its gate (:mod:`pdpfl.fl.messages`) first, as in a Flower
    ClientApp: training replies and test metrics here, protocol stages in
    :func:`~pdpfl.fl.aggregation.handle_silo_stage`.
    """

    def __init__(
        self,
        clients: dict[int, ClientAlgorithm] | SiloPool,
        security: dict[int, Any] | None = None,
    ) -> None:
        #: The silos as one pool (IDP-FedAvg's central clients: a silo object only for a
        #: sampled client, one ledger row per client; :mod:`pdpfl.fl.pool`), or None.
        self.pool: SiloPool | None = clients if isinstance(clients, SiloPool) else None
        self.clients: dict[int, ClientAlgorithm] = (
            {} if isinstance(clients, SiloPool) else dict(sorted(clients.items()))
        )
        self.client_ids = (
            list(clients.client_ids) if isinstance(clients, SiloPool) else list(self.clients)
        )
        #: Each silo's private protocol memory (never read by the server side).
        self._silo_memory: dict[int, dict[str, Any]] = (
            {} if self.pool is not None else {c: {} for c in self.client_ids}
        )
        #: Each silo's own side of secure summation (identity, peer keys, its settings); built
        #: on first use with fresh in-memory identities and default settings when not given
        #: (:meth:`configure_security` sets it from an experiment config).
        self.security = security

    def configure_security(self, config: ExperimentConfig) -> None:
        """Give every silo its side of secure summation under ``config`` (fresh identities
        unless already configured with the run's keys)."""
        from pdpfl.fl.aggregation.secure_identity import ephemeral_security

        if self.security is not None:
            return
        secure = getattr(config, "secure", None)
        participation = str(getattr(config, "participation", "visible"))
        if secure is None:
            self.security = ephemeral_security(self.client_ids, participation=participation)
        else:
            self.security = ephemeral_security(
                self.client_ids,
                participation=participation,
                threshold=float(secure.threshold),
                min_survivors=int(secure.min_survivors),
            )

    def exchange(
        self, protocol: str, stage: str, requests: dict[int, dict[str, Any]], round_index: int
    ) -> dict[int, dict[str, Any]]:
        from pdpfl.fl.aggregation import SiloContext, handle_silo_stage
        from pdpfl.fl.aggregation.secure_identity import ephemeral_security

        if self.pool is not None:
            raise ValueError(
                f"{protocol}: pooled silos (IDP-FedAvg central) run under plain summation only"
            )
        if self.security is None:
            self.security = ephemeral_security(self.client_ids)
        return {
            c: handle_silo_stage(
                protocol,
                stage,
                payload,
                round_index,
                SiloContext(self.clients[c], c, self._silo_memory[c], self.security.get(c)),
            )
            for c, payload in requests.items()
        }

    def _batches(self, ids: list[int]) -> list[list[int]]:
        """Consecutive silos that can share one batched call (same ``batch_key``)."""
        from pdpfl.fl.template import BatchedSilo

        groups: list[list[int]] = []
        last: Hashable | None = None
        for c in ids:
            silo = self.clients[c]
            key = silo.batch_key() if isinstance(silo, BatchedSilo) else None
            if key is not None and groups and key == last:
                groups[-1].append(c)
            else:
                groups.append([c])
            last = key
        return groups

    def fit(
        self, selected: list[int], params: Params, round_index: int, config: Scalars
    ) -> list[Contribution]:
        """Each selected silo's contribution; silos of a :class:`~pdpfl.fl.template.BatchedSilo`
        algorithm are charged one by one, then trained together in one batch. Each passes the
        silo's gate (:func:`~pdpfl.fl.api.check_contribution`) before it is handed over."""
        from pdpfl.fl.template import BatchedSilo

        if self.pool is not None:  # every client charged at once, the selected ones trained
            contributions = self.pool.fit(list(selected), params, round_index, config)
            return [
                self._released(c, contribution, params, round_index)
                for c, contribution in zip(selected, contributions, strict=True)
            ]
        out: dict[int, Contribution] = {}
        for group in self._batches(list(selected)):
            silos = [self.clients[c] for c in group]
            if len(group) == 1 or not isinstance(silos[0], BatchedSilo):
                contribution = silos[0].fit(params, round_index, config)
                out[group[0]] = self._released(group[0], contribution, params, round_index)
                continue
            batched = [s for s in silos if isinstance(s, BatchedSilo)]
            jobs = [s.prepare(params, s.begin_round(round_index, config)) for s in batched]
            results = type(batched[0]).train_batch(jobs)
            for c, s, job, res in zip(group, batched, jobs, results, strict=True):
                contribution = s.release(s.finish(job, res), params)
                out[c] = self._released(c, contribution, params, round_index)
        return [out[c] for c in selected]

    def _released(
        self, silo: int, contribution: Contribution, params: Params, round_index: int
    ) -> Contribution:
        """The gate at silo ``silo``: the training reply it is about to hand over."""
        holder: SiloPool | ClientAlgorithm = (
            self.pool if self.pool is not None else self.clients[silo]
        )
        public = frozenset(getattr(holder, "public_metrics", frozenset()))
        return check_contribution(
            contribution,
            public,
            params=params,
            silo=silo,
            round_index=int(round_index),
            encoding=getattr(holder, "share_encoding", None),
        )

    def evaluate(
        self, client_ids: list[int], params: Params, round_index: int, config: Scalars
    ) -> dict[int, Scalars]:
        """Each silo's test metrics, through the silo's gate (``loss``, ``accuracy``, ``n``)."""
        from pdpfl.fl.template import BatchedSilo

        if self.pool is not None:
            raise ValueError("pooled silos: use evaluate_pooled (every client at once)")
        out: dict[int, Scalars] = {}
        for group in self._batches(list(client_ids)):
            silos = [self.clients[c] for c in group]
            if len(group) == 1 or not isinstance(silos[0], BatchedSilo):
                out[group[0]] = silos[0].evaluate(params, round_index, config)
                continue
            batched = [s for s in silos if isinstance(s, BatchedSilo)]
            for s in batched:
                s.catch_up(int(round_index) + 1)
            for c, metrics in zip(group, type(batched[0]).test_batch(batched, params), strict=True):
                out[c] = metrics
        for c, metrics in out.items():
            check_evaluation(metrics, silo=c, round_index=int(round_index))
        return out

    def evaluate_pooled(
        self, params: Params, round_index: int, config: Scalars
    ) -> PooledEvaluation | None:
        """A pool's test metrics of every client at once, through the gate (None: no pool;
        :meth:`evaluate` asks each silo)."""
        if self.pool is None:
            return None
        result = self.pool.evaluate(params, round_index, config)
        result.check(int(round_index))
        return result

    def privacy_summaries(self) -> dict[int, PrivacySummary | None]:
        """Each silo's summary (a pool: one summary of every client, under key -1)."""
        if self.pool is not None:
            return {POOL_KEY: self.pool.privacy_summary()}
        return {c: client.privacy_summary() for c, client in self.clients.items()}

    def client_states(self) -> dict[int, dict[str, Any]]:
        """Each silo's state (a pool: the state of every client as arrays, under key -1)."""
        if self.pool is not None:
            return {POOL_KEY: self.pool.state_dict()}
        return {c: client.state_dict() for c, client in self.clients.items()}

    def load_client_states(self, states: dict[int, dict[str, Any]]) -> None:
        if self.pool is not None:
            state = {int(k): v for k, v in states.items()}.get(POOL_KEY)
            if state is None or len(states) != 1:
                raise ValueError("cannot resume: the checkpoint holds no state of the clients")
            self.pool.load_state_dict(state)
            return
        for c, state in states.items():
            self.clients[int(c)].load_state_dict(state)


@contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Temporarily set torch's intra-op thread count (no-op for None)."""
    if threads is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(int(threads))
    try:
        yield
    finally:
        torch.set_num_threads(before)


class SetupWarning(UserWarning):
    """A problem found before training that does not stop the run (also in ``summary.json``)."""


#: Key under which :func:`load_federation_for` marks a federation with the config it came from.
_LOADED_FROM = "pdpfl.loaded_from"


def _data_key(config: ExperimentConfig) -> str:
    import json

    return json.dumps([config.data.model_dump(mode="json"), config.seed], sort_keys=True)


def load_federation_for(config: ExperimentConfig) -> Federation:
    """The federation described by ``config.data`` (seeded from ``config.seed``)."""
    from pdpfl.data import load_federation

    d = config.data
    kwargs: dict[str, Any] = dict(
        partition=d.partition,
        partition_params=dict(d.partition_params),
        seed=config.seed,
        data_dir=d.data_dir,
        **dict(d.options),
    )
    if d.num_clients is not None:
        kwargs["num_clients"] = d.num_clients
    federation = load_federation(d.dataset, **kwargs)
    federation.metadata[_LOADED_FROM] = _data_key(config)
    return federation


def from_config(config: ExperimentConfig, federation: Federation) -> bool:
    """True if ``federation`` was loaded by :func:`load_federation_for` from ``config.data``."""
    return getattr(federation, "metadata", {}).get(_LOADED_FROM) == _data_key(config)


def describe_data(config: ExperimentConfig, federation: Federation) -> dict[str, Any]:
    """``summary["data"]``: the federation a run really trained on (sizes are operator-only)."""
    user = not from_config(config, federation)
    meta = {
        k: v
        for k, v in getattr(federation, "metadata", {}).items()
        if k != _LOADED_FROM and isinstance(v, str | int | float | bool | type(None))
    }
    return {
        "source": "user-supplied federation (passed to run_simulation; config.data not used)"
        if user
        else "config.data",
        "dataset": str(federation.name),
        "clients": len(federation.clients),
        "silo_names": [str(c.name) for c in federation.clients],
        "train_records": int(sum(len(c.y_train) for c in federation.clients)),
        "test_records": int(sum(len(c.y_test) for c in federation.clients)),
        "input_shape": [int(v) for v in federation.input_shape],
        "num_classes": int(federation.num_classes),
        **({"partition": meta.pop("partition")} if "partition" in meta else {}),
        "metadata": meta,
    }


def config_for_federation(config: ExperimentConfig, federation: Federation) -> ExperimentConfig:
    """``config`` with a truthful ``data`` section for a user-supplied ``federation``.

    A federation loaded from ``config.data`` keeps the config unchanged; any other one is
    recorded by name (``data.dataset``), number of silos and partition ``user``, so that
    ``summary.json`` and the resume check never describe a dataset that was not used.
    """
    if from_config(config, federation):
        return config
    from pdpfl.config import DataConfig

    data = DataConfig(
        dataset=str(federation.name) or "user-data",
        num_clients=len(federation.clients),
        partition=str(getattr(federation, "metadata", {}).get("partition", "user")),
        public_silo_sizes=config.data.public_silo_sizes,
    )
    return config.model_copy(update={"data": data})


def check_federation(config: ExperimentConfig, federation: Federation) -> list[str]:
    """The algorithm's checks of ``federation`` before training (errors raise; warnings are
    returned): :meth:`pdpfl.fl.algorithm.Algorithm.check_federation`."""
    from pdpfl.fl.algorithm import as_algorithm

    return as_algorithm(config.algorithm).check_federation(config, federation)


def run_simulation(
    config: ExperimentConfig,
    out_dir: str | Path,
    resume: bool = False,
    *,
    progress: bool = True,
    federation: Federation | None = None,
    stop_after: int | None = None,
    overwrite: bool = False,
    allow_over_budget: bool = False,
) -> dict[str, Any]:
    """Run ``config`` in-process and write every output to ``out_dir``; returns the summary.

    ``federation`` may be passed to reuse an already-loaded one or to train on your own data
    (see :mod:`pdpfl.api`); a federation that was not loaded from ``config.data`` is recorded
    truthfully (``summary["data"]``, and ``config.data`` in the summary names it). ``stop_after``
    stops (as if interrupted) after that many rounds, leaving a checkpoint that ``resume=True``
    continues.

    The output rule: a folder that already holds files is refused unless ``overwrite=True``
    (pdpfl's previous outputs there are replaced) or ``resume=True`` (continue its checkpoint).

    ``allow_over_budget``: with ``resume=True`` and a ``training.rounds`` beyond the plan, extend
    the run even though an algorithm that cannot make its units sit out takes some of them over
    their budget (otherwise refused, :mod:`pdpfl.fl.extension`); the summary says so.
    """
    from pdpfl.runtime.lock import FolderLocked, folder_lock
    from pdpfl.runtime.outputs import OutputDirError, check_resumable, prepare_output_dir

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise OutputDirError(f"out_dir: {out} exists and is not a folder")
    if resume:  # before the lock creates the folder: --resume never starts a run
        check_resumable(out)
    lock = folder_lock(out, option="out_dir")
    try:
        lock.__enter__()
    except FolderLocked as err:
        raise OutputDirError(str(err)) from None
    except OSError as err:
        raise OutputDirError(
            f"out_dir: cannot write to {out} ({err.strerror or err}); choose another folder"
        ) from None
    try:
        prepare_output_dir(out_dir, resume=resume, overwrite=overwrite)
        return simulate_into(
            config,
            out_dir,
            resume,
            progress=progress,
            federation=federation,
            stop_after=stop_after,
            allow_over_budget=allow_over_budget,
        )
    finally:
        lock.__exit__(None, None, None)


def round_model_writer(
    out_dir: Path, names: list[str], fingerprint: str | None, algorithm: str
) -> Callable[[int, Params, str], None]:
    """``save_models: every-round``: the global model of each round as
    ``models/round-NNNN.safetensors`` (1-based round numbers), sealed by the run."""
    from pdpfl._version import __version__
    from pdpfl.runtime.model_file import FORMAT, write_model

    def save(round_index: int, params: Params, run_id: str) -> None:
        meta = {
            "format": FORMAT,
            "pdpfl_version": __version__,
            "config_hash": str(fingerprint),
            "algorithm": algorithm,
            "rounds": str(round_index + 1),
        }
        write_model(
            out_dir / "models" / f"round-{round_index + 1:04d}.safetensors",
            params,
            names,
            meta,
            run_id=run_id,
            round_count=round_index + 1,
        )

    return save


def _planned_rounds(out_dir: Path, config: ExperimentConfig) -> int | None:
    """T the checkpoint in ``out_dir`` was planned for (None without a checkpoint)."""
    from pdpfl.runtime.loop import load_checkpoint

    ckpt = load_checkpoint(out_dir)
    if ckpt is None:
        return None
    return int(ckpt.get("planned_rounds", config.training.rounds))


def simulate_into(
    config: ExperimentConfig,
    out_dir: str | Path,
    resume: bool = False,
    *,
    progress: bool = True,
    federation: Federation | None = None,
    stop_after: int | None = None,
    allow_over_budget: bool = False,
) -> dict[str, Any]:
    """:func:`run_simulation` into a folder its caller has already checked with
    :func:`~pdpfl.runtime.outputs.prepare_output_dir` (the output rule is not applied again).

    The parsed ``config.algorithm`` assembles the run once (prepare, checks, server, silos,
    summation protocol); the round loop then sees only those objects and public settings.
    """
    from pdpfl.logs import log_to_file

    Path(out_dir).mkdir(parents=True, exist_ok=True)
    with log_to_file(Path(out_dir) / "run.log"):
        return _simulate(
            config,
            out_dir,
            resume,
            progress=progress,
            federation=federation,
            stop_after=stop_after,
            allow_over_budget=allow_over_budget,
        )


def _simulate(
    config: ExperimentConfig,
    out_dir: str | Path,
    resume: bool,
    *,
    progress: bool,
    federation: Federation | None,
    stop_after: int | None,
    allow_over_budget: bool = False,
) -> dict[str, Any]:
    import time
    import warnings

    from pdpfl.fl.algorithm import as_algorithm
    from pdpfl.runtime.loop import LoopSettings, run_rounds
    from pdpfl.runtime.outputs import output_write_error, write_outputs
    from pdpfl.runtime.preflight import check_key_dir, check_model

    started = time.perf_counter()
    if federation is None:
        federation = load_federation_for(config)
    check_key_dir()  # before training: the first checkpoint is sealed with this machine's key
    check_model(config, federation)
    data = describe_data(config, federation)
    config = config_for_federation(config, federation)
    if str(config.output_dir) != str(out_dir):  # the summary records where outputs really are
        config = config.model_copy(update={"output_dir": str(out_dir)})
    log.info(
        "federation %s: %d silos, %d training records",
        data["dataset"],
        data["clients"],
        data["train_records"],
    )
    planned = _planned_rounds(Path(out_dir), config) if resume else None
    build = config
    if planned is not None and planned != config.training.rounds:
        # Extending a finished run: the mechanism stays the one published for T = planned
        # rounds (σ, the calibration); the ledgers charge every extra round and the pre-check
        # stops units before their budget.
        training = config.training.model_copy(update={"rounds": planned})
        build = config.model_copy(update={"training": training})
        log.warning("extending the run from %d to %d rounds", planned, config.training.rounds)
    run = as_algorithm(build.algorithm).assemble(build, federation, pooled=True)
    settings = replace(
        LoopSettings.of(run.config),
        rounds=config.training.rounds,
        planned_rounds=run.config.training.rounds,
        allow_over_budget=bool(allow_over_budget),
    )
    log.info(
        "algorithm %s (%s-level DP), %s summation, %d rounds",
        config.algorithm.name,
        config.algorithm.unit,
        run.protocol.name,
        run.config.training.rounds,
    )
    for message in run.warnings:
        log.warning("%s", message)
        warnings.warn(message, SetupWarning, stacklevel=3)
    diverged: TrainingDiverged | None = None
    from pdpfl.runtime.identities import simulator_security

    # every silo's long-term identity, published in keys/ (secure summation, receipts)
    silos: dict[int, Any] | SiloPool = run.clients
    if run.pool is not None:
        # one party holds the pool's one ledger and signs its clients' receipts; pooled silos
        # run under plain summation only (no per-client identity, no secure-summation side)
        from pdpfl.ledger.runfolder import POOLED_LEDGER
        from pdpfl.runtime.identities import publish_party

        silos = run.pool
        publish_party(Path(out_dir), POOLED_LEDGER)
        transport = InProcessTransport(silos, {})
    else:
        transport = InProcessTransport(
            silos, simulator_security(config, Path(out_dir), list(silos))
        )
    with torch_threads(config.threads):
        save_model = None
        if config.save_models == "every-round":
            save_model = round_model_writer(
                Path(out_dir), run.parameter_names, settings.fingerprint, config.algorithm.name
            )
        try:
            result = run_rounds(
                run.server,
                transport,
                out_dir,
                settings,
                run.protocol,
                resume=resume,
                progress=progress,
                stop_after=stop_after,
                save_model=save_model,
            )
        except TrainingDiverged as err:
            if err.result is None:
                raise
            diverged, result = err, err.result
        except OSError as err:  # a round's files could not be written: stop, keep what is saved
            raise output_write_error(err, Path(out_dir), config.training.rounds) from None
    result["setup_seconds"] = time.perf_counter() - started - result["seconds"]
    try:
        summary = write_outputs(
            config,
            result,
            out_dir,
            clients=silos,
            server=run.server,
            view="operator",
            warnings=run.warnings,
            data=data,
            parameter_names=run.parameter_names,
        )
    except OSError as err:
        raise output_write_error(err, Path(out_dir), config.training.rounds) from None
    if diverged is not None:  # the outputs (completed: false) are written; now say it loudly
        raise diverged
    return summary
