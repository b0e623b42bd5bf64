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

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pdpfl.config import ExperimentConfig
from pdpfl.fl.api import ClientAlgorithm, Contribution, Params, Scalars
from pdpfl.runtime.loop import run_federation


class InProcessTransport:
    """A :class:`~pdpfl.runtime.loop.Transport` that calls client objects directly."""

    def __init__(self, clients: dict[int, ClientAlgorithm]) -> None:
        self.clients = dict(sorted(clients.items()))
        self.client_ids = list(self.clients)
        #: Each silo's private protocol memory (never read by the server side).
        self._silo_memory: dict[int, dict[str, Any]] = {c: {} for c in self.client_ids}

    def exchange(
        self, protocol: str, stage: str, requests: dict[int, dict[str, Any]], round_index: int
    ) -> dict[int, dict[str, Any]]:
        from pdpfl.fl.aggregation import SiloContext, handle_silo_stage

        return {
            c: handle_silo_stage(
                protocol,
                stage,
                payload,
                round_index,
                SiloContext(self.clients[c], c, self._silo_memory[c]),
            )
            for c, payload in requests.items()
        }

    def fit(
        self, selected: list[int], params: Params, round_index: int, config: Scalars
    ) -> list[Contribution]:
        return [self.clients[c].fit(params, round_index, config) for c in selected]

    def evaluate(
        self, client_ids: list[int], params: Params, round_index: int, config: Scalars
    ) -> dict[int, Scalars]:
        return {c: self.clients[c].evaluate(params, round_index, config) for c in client_ids}

    def privacy_summaries(self) -> dict[int, Scalars]:
        return {c: client.privacy_summary() for c, client in self.clients.items()}

    def client_states(self) -> dict[int, dict]:
        return {c: client.state_dict() for c, client in self.clients.items()}

    def load_client_states(self, states: dict[int, dict]) -> None:
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


def load_federation_for(config: ExperimentConfig) -> Any:
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
    return load_federation(d.dataset, **kwargs)


def run_simulation(
    config: ExperimentConfig,
    out_dir: str | Path,
    resume: bool = False,
    *,
    progress: bool = True,
    federation: Any | None = None,
    stop_after: int | None = None,
) -> dict[str, Any]:
    """Run ``config`` in-process and write every output to ``out_dir``; returns the summary.

    ``federation`` may be passed to reuse an already-loaded one; ``stop_after`` stops (as if
    interrupted) after that many rounds, leaving a checkpoint that ``resume=True`` continues.
    """
    import time

    from pdpfl.fl.factory import build_federation_algorithms, prepare
    from pdpfl.runtime.outputs import write_outputs

    started = time.perf_counter()
    if federation is None:
        federation = load_federation_for(config)
    original = config
    config, federation = prepare(config, federation)
    with torch_threads(config.threads):
        server, clients = build_federation_algorithms(config, federation)
        transport = InProcessTransport(clients)
        result = run_federation(
            config, server, transport, out_dir, resume=resume, progress=progress,
            stop_after=stop_after,
        )
    result["setup_seconds"] = time.perf_counter() - started - result["seconds"]
    summary = write_outputs(original, result, out_dir, clients=clients, view="operator")
    return summary
