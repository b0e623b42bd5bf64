"""The sections of an experiment configuration: data, model, budgets, privacy, training, secure
summation, Flower, and :class:`ExperimentConfig` itself (:mod:`pdpfl.config`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from pdpfl.config.base import FLOAT32_MAX, MAX_BATCH_SIZE, _Section


class DataConfig(_Section):
    """The federation: see :func:`pdpfl.data.load_federation`."""

    dataset: str = Field(..., min_length=1, description="heart-disease, mnist-10k, digits, ...")
    num_clients: int | None = Field(None, ge=1, le=10_000)
    partition: str = "iid"
    partition_params: dict[str, Any] = Field(default_factory=dict)
    data_dir: str | None = None
    options: dict[str, Any] = Field(default_factory=dict)
    public_silo_sizes: bool = Field(
        False,
        description="declare the silos' training-set sizes public (needed to weight updates "
        "by silo size under DP); by default sizes never leave a silo",
    )
    public_user_histograms: bool = Field(
        default=False,
        description="declare every silo's per-user record counts n_{s,u} public (ULDP-FL "
        "enhanced weights and GROUP-k flags under plain aggregation need them): they are then "
        "disclosed to the server and, through the weights, to the silos",
    )


#: The built-in models (:mod:`pdpfl.models`) and the options their builders take: a config is
#: parsed without importing torch. ``tests/test_config_imports.py`` checks the table against the
#: registered builders' signatures; any other name is looked up in :data:`pdpfl.models.MODELS`.
BUILTIN_MODELS: dict[str, tuple[str, ...]] = {
    "logreg": (),
    "mlp": ("hidden",),
    "mnist-cnn": (),
    "prifedsync-mnist-cnn": ("dropout",),
    "prifedsync-cifar-cnn": (),
    "resnet18-gn": ("num_groups",),
    "idp-cnn": ("dropout", "rescale"),
    "cnnmnist": ("dropout",),
    "private-fraud-net": ("hidden", "layers", "dropout"),
}


def model_options(name: str) -> list[str] | None:
    """The option names model ``name`` takes (None: any keyword); KeyError if unregistered."""
    if name in BUILTIN_MODELS:
        return list(BUILTIN_MODELS[name])
    import inspect

    from pdpfl.models import MODELS

    builder = MODELS[name]
    try:
        params = list(inspect.signature(builder).parameters.values())
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return [p.name for p in params[2:] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


class ModelConfig(_Section):
    """The model: any name registered with :func:`pdpfl.models.register_model`."""

    name: str = "logreg"
    options: dict[str, Any] = Field(
        default_factory=dict, description="keyword arguments of the registered model builder"
    )

    @field_validator("name")
    @classmethod
    def _registered(cls, value: str) -> str:
        if value in BUILTIN_MODELS:
            return value
        from pdpfl.models import MODELS

        if value not in MODELS:
            raise ValueError(f"unknown model {value!r}; registered: {', '.join(sorted(MODELS))}")
        return value

    @model_validator(mode="after")
    def _options_fit_the_builder(self) -> ModelConfig:
        """``options`` must be keyword arguments the registered builder takes."""
        if not self.options:
            return self
        try:
            allowed = model_options(self.name)
        except KeyError:
            return self
        if allowed is None:
            return self
        unknown = sorted(set(self.options) - set(allowed))
        if unknown:
            raise ValueError(
                f"options: unknown option(s) {unknown} for model {self.name!r}; allowed: {allowed}"
            )
        return self


class BudgetsConfig(_Section):
    """Per-record privacy budgets (see :mod:`pdpfl.budgets`, :mod:`pdpfl.data.budget_table`)."""

    scenario: str = "three-levels"
    params: dict[str, Any] = Field(default_factory=dict)
    file: str | None = Field(
        None,
        min_length=1,
        description="budgets file: a .csv with the columns record_id and "
        "epsilon (matched by id), or one ε per training record in order (.csv/.npy); "
        "{client_id} and {client} are replaced per silo",
    )
    on_unmatched: Literal["error", "ignore"] = Field(
        "error",
        description="budgets for record ids that are not in the data: an error "
        "(default), or ignore them -- counted in the run's warnings",
    )
    cap_at_epsilon_max: bool = Field(
        False,
        description="records whose budget is above the ε that sampling at q = 1 spends "
        "(privacy.epsilon_max) are an error by default; true trains them at q = 1 (they spend "
        "less than their budget), counted in the run's warnings",
    )

    @field_validator("file")
    @classmethod
    def _placeholders(cls, value: str | None) -> str | None:
        if value is not None:
            from pdpfl.data.budget_table import file_placeholders

            file_placeholders(value)
        return value

    @model_validator(mode="after")
    def _scenario_builds(self) -> BudgetsConfig:
        """The scenario and its params are checked here (not when the run assigns budgets),
        so that a bad value is reported as ``budgets: ...`` before anything runs."""
        if self.file is None:
            from pdpfl.budgets import make_scenario

            try:
                scenario = make_scenario(self.scenario, **self.params)
            except (ValueError, TypeError) as exc:
                text = str(exc)
                raise ValueError(
                    text if text.startswith("scenario") else f"params: {text}"
                ) from None
            from pdpfl.budgets import MIN_BUDGET, public_statistics

            lowest, _ = public_statistics(scenario)
            if lowest is not None and lowest < MIN_BUDGET:
                raise ValueError(
                    f"params: the scenario's smallest budget ε = {lowest!r} is below the "
                    f"minimum {MIN_BUDGET:g} (a smaller ε gives no usable sampling rate)"
                )
        return self


class PrivacyConfig(_Section):
    """The DP mechanism: σ (or ε_max, giving σ at q = 1), δ, adversary, calibration."""

    noise_multiplier: float | None = Field(None, gt=0)
    epsilon_max: float | None = Field(None, gt=0)
    delta: float = Field(1e-5, gt=0, lt=1)
    adversary: Literal["third-party", "server", "both"] = Field(
        "both",
        description="observer(s) the budgets are enforced against: the coordinating server "
        "(sees who took part), third parties (see the models), or both (default)",
    )
    calibration: Literal["certified", "scf", "scf-paper", "binary-search"] = Field(
        "certified",
        description="ε → q: certified (exact on a grid, default), scf (pdpfl's "
        "curve fit), scf-paper (rPDP-FL's SCF as its reference code ran it), binary-search",
    )
    accountant: str = Field(
        "rdp",
        description="accountant of every ledger and calibration (σ from epsilon_max, rates, "
        "targets): rdp (Rényi DP, optimal order), pld (privacy-loss distributions: tighter, so "
        "larger rates or less noise at the same budgets), or any accountant registered with "
        "pdpfl.privacy.register_accountant whose ε are upper bounds; an algorithm whose events "
        "the accountant cannot interpret refuses it",
    )
    allow_exclusion: bool = Field(
        False,
        description="give q = 0 to records whose budget is below the smallest achievable ε "
        "(counted in the headline) instead of refusing the run",
    )
    noise_shares: Literal["discrete", "continuous"] = Field(
        "discrete",
        description="where silos add shares of the noise (ULDP-AVG/SGD, IDP-FedAvg "
        "variant: distributed): discrete (default) -- each silo rounds its clipped "
        "contribution to integers and adds an exact discrete Gaussian share; the integers are "
        "summed modulo 2^b (secure.bits) and the ledgers charge the distributed discrete "
        "Gaussian (Kairouz, Liu & Steinke 2021; accountant rdp) -- or continuous: float "
        "Gaussian shares in the fixed-point ring (the released sum is then only close to the "
        "accounted one). ULDP-FL's private weighting adds exact discrete Gaussians on its "
        "own grid 2^m·secure.precision (discrete) or float Gaussians (continuous)",
    )

    central_noise: Literal["continuous", "discrete"] = Field(
        "continuous",
        description="the noise of every central DP step (one party adds all of it): continuous "
        "(default) -- the secure float Gaussian sampler -- or discrete: the clipped sum is "
        "scaled by γ = 2^k, rounded to integers (sensitivity γC + √d, inflation ≤ 2^-10) and "
        "an exact discrete Gaussian drawn with integer arithmetic is added (Canonne, Kamath & "
        "Steinke 2020): no floating-point attack on the noise (Mironov 2012; Jin et al. 2022); "
        "accountant rdp only. Supported by the rPDP-FL family (rpdp, its uniform baselines, "
        "centralized, centralized-filter), idp-sgd-scale, the silos of uldp-naive and "
        "uldp-group (uldp-avg/sgd: with noise_shares: discrete, whose shares are exact "
        "already), prifedsync (rdp, no CLT) and idp-fedavg (variant: central: the update sum "
        "and the adaptive-clipping count); other algorithms refuse it",
    )

    @field_validator("accountant")
    @classmethod
    def _registered_accountant(cls, value: str) -> str:
        """A registered accountant whose every ε is an upper bound (pdpfl.privacy.registry)."""
        from pdpfl.privacy.registry import accountant_names, as_accountant_name, make_accountant

        rigorous = accountant_names(rigorous=True)
        try:
            name = as_accountant_name(value)
        except ValueError:
            raise ValueError(
                f"expected one of {', '.join(rigorous)} (registered accountants), got {value!r}"
            ) from None
        if make_accountant(name).approximate:
            raise ValueError(
                f"{name} reports an approximation, not an upper bound, so it cannot enforce "
                f"budgets; choose one of {', '.join(rigorous)}"
            )
        return name


class LifetimeConfig(_Section):
    """A person's budget is for life: the budget store every run on the same data charges
    (:mod:`pdpfl.ledger.lifetime`)."""

    store: str | None = Field(
        None,
        min_length=1,
        description="folder of the budget stores (default: $PDPFL_BUDGET_DIR, else "
        "$XDG_DATA_HOME/pdpfl/budgets); a Flower silo keeps its own under its SuperNode's "
        "state folder",
    )
    allow_respend: bool = Field(
        False,
        description="true: earlier runs on this data do not limit this one (public or "
        "synthetic data, e.g. the shipped examples); the run is still recorded in the store "
        "and the headline and summary.json say that lifetime budgets were not enforced",
    )
    wait_s: float = Field(
        0.0,
        ge=0,
        le=86_400,
        description="seconds a run waits for a budget store that another run is charging "
        "before it is refused (0: refuse at once)",
    )


class TrainingConfig(_Section):
    rounds: int = Field(..., ge=1, le=100_000, description="T, communication rounds")
    local_steps: int = Field(..., ge=1, le=1_000_000, description="τ, local DP-SGD steps")
    client_rate: float = Field(1.0, gt=0, le=1, description="λ, client sampling rate")
    max_grad_norm: float = Field(1.0, gt=0, description="C, per-example clipping bound")
    optimizer: Literal["sgd", "adam", "rmsprop"] = "sgd"
    lr: float = Field(0.1, gt=0)
    momentum: float = Field(0.0, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    batch_size: float | list[float] | None = Field(
        None,
        description="the public expected batch size B (one value, or one per silo): under DP "
        "each step's noisy sum is divided by this constant, never by a count computed from "
        "private data; the privacy-free baseline samples at rate B/n",
    )
    physical_batch_size: int = Field(512, ge=1)
    device: str = Field(
        "cpu",
        description="where each silo trains: cpu (default), cuda, cuda:<index>, mps, or auto "
        "(cuda if available, else mps, else cpu); parameters leave the device as CPU arrays "
        "before release and aggregation, and the random numbers are drawn on the CPU",
    )

    @field_validator("device")
    @classmethod
    def _device_name(cls, value: str) -> str:
        import re

        if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", value):
            raise ValueError(f"expected one of auto, cpu, cuda, cuda:<index>, mps, got {value!r}")
        return value

    @field_validator("lr", "weight_decay")
    @classmethod
    def _float32(cls, value: float) -> float:
        if value > FLOAT32_MAX:  # (non-finite values are refused by the loader)
            raise ValueError(
                f"must be at most {FLOAT32_MAX:.4g} (the largest float32 the model takes), "
                f"got {value:g}"
            )
        return value

    @field_validator("batch_size")
    @classmethod
    def _positive(cls, value: float | list[float] | None) -> float | list[float] | None:
        values = value if isinstance(value, list) else [value] if value is not None else []
        if isinstance(value, list) and not value:
            raise ValueError("expected a number > 0 or a non-empty list (one per silo)")
        for v in values:
            if not (v > 0 and v <= MAX_BATCH_SIZE):
                raise ValueError(
                    f"every batch size must be a number in (0, {MAX_BATCH_SIZE:.0e}], got {v}"
                )
        return value

    def batch_size_for(self, client_id: int) -> float | None:
        """The public expected batch size B of silo ``client_id`` (None if not configured)."""
        b = self.batch_size
        if isinstance(b, list):
            if not 0 <= client_id < len(b):
                raise ValueError(
                    f"training.batch_size: {len(b)} values given but silo {client_id} exists"
                )
            return float(b[client_id])
        return None if b is None else float(b)


class SecureConfig(_Section):
    """Parameters of the cryptographic protocols (``aggregation: secure``, ``weights: private``).

    See docs/secure_aggregation.md. None of these is a secret: keys and masks are drawn from the
    operating system's CSPRNG by the party that owns them and never appear in a config.
    """

    fractional_bits: int = Field(
        32,
        ge=0,
        le=52,
        description="secure summation: fixed-point fractional bits f of the "
        "ring Z_2^64 (resolution 2^-f; each of m silos may send values up to 2^(55-f)/m)",
    )
    paillier_bits: int = Field(
        3072, ge=3072, le=8192, description="private weighting: Paillier modulus size (bits)"
    )
    n_max: int = Field(
        2000,
        ge=1,
        le=100_000,
        description="private weighting: N_max, the largest total "
        "record count of a user (DIV = lcm(1..N_max) must leave room in the Paillier modulus)",
    )
    allowed_totals: list[int] | None = Field(
        None,
        description="private weighting: the paper's remedy for large N_u -- the only "
        "record totals a user may have (e.g. powers of two); DIV = lcm(allowed_totals)",
    )
    precision: float = Field(
        1e-10, gt=0, lt=1, description="private weighting: fixed-point precision P of Encode"
    )
    workers: int | None = Field(
        None,
        ge=1,
        le=64,
        description="processes for the Paillier arithmetic of each party (default: min(2, CPUs))",
    )
    threshold: float = Field(
        2.0 / 3.0,
        description="secure summation and private weighting: a round's sum is "
        "released only if at least t = max(min_survivors, ceil(threshold * n)) of the n silos "
        "asked contributed (dropout tolerance n - t; the server and up to t - 1 silos learn "
        "nothing beyond the sum; a noise share is sized sigma^2 C^2 / t); in (1/2, 1]",
    )
    min_survivors: int = Field(
        2, description="the smallest t of any round (>= 2: a lone upload is never unmasked)"
    )
    bits: int = Field(
        32,
        ge=2,
        le=62,
        description="discrete noise shares (privacy.noise_shares: discrete): the sum is taken "
        "modulo 2^bits (uint32 on the wire when bits <= 32); the scale is the largest power "
        "of two whose wrap probability stays below max_wrap, refused when none keeps the "
        "rounding's sensitivity inflation within max_inflation",
    )
    rotation: Literal["auto", "on", "off"] = Field(
        "auto",
        description="discrete noise shares: randomized Walsh-Hadamard rotation before "
        "rounding (flattens coordinates against wrapping; pads to a power of two); auto: on "
        "for IDP-FedAvg, off for ULDP-FL's per-user rounding (its cost grows with the users)",
    )
    max_wrap: float = Field(
        1e-6,
        gt=0,
        lt=1,
        description="discrete noise shares: the largest accepted bound on the probability "
        "that a coordinate of a round's sum wraps modulo 2^bits (utility, never privacy)",
    )
    max_inflation: float = Field(
        0.05,
        ge=0,
        le=1,
        description="discrete noise shares: the largest accepted relative growth of the "
        "sensitivity by the integer rounding (sqrt(N)/(gamma C) - 1; accounted, so it costs "
        "noise, not privacy)",
    )

    @field_validator("threshold")
    @classmethod
    def _threshold(cls, value: float) -> float:
        if not 0.5 < value <= 1.0:
            raise ValueError(
                f"must be in (1/2, 1] (the fraction of a round's silos that must survive; above "
                f"1/2 so that two disjoint survivor sets can never both reach it), got {value}"
            )
        return value

    @field_validator("min_survivors")
    @classmethod
    def _min_survivors(cls, value: int) -> int:
        if value < 2:
            raise ValueError(
                f"must be >= 2 (with one survivor its masked upload would be its update), got "
                f"{value}"
            )
        return value

    @field_validator("allowed_totals")
    @classmethod
    def _totals(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and (not value or any(v < 1 for v in value)):
            raise ValueError("expected a non-empty list of positive record counts")
        return value


class ClientResourcesConfig(_Section):
    """Ray resources of each ClientApp actor of Flower's Simulation Engine."""

    num_cpus: float = Field(
        1.0,
        gt=0,
        le=1024,
        description="CPUs per actor (the actor pool has about CPUs / num_cpus actors)",
    )
    num_gpus: float = Field(
        0.0, ge=0, le=64, description="GPUs (or a fraction of one) per actor; 0 trains on the CPU"
    )


class FlowerSimulationConfig(_Section):
    """``runtime: flower-simulation``: Flower's Simulation Engine (Ray backend)."""

    client_resources: ClientResourcesConfig = Field(
        default_factory=lambda: ClientResourcesConfig.model_validate({})
    )


class FlowerConfig(_Section):
    """Settings of the Flower runtimes (they never change what is computed)."""

    simulation: FlowerSimulationConfig = Field(
        default_factory=lambda: FlowerSimulationConfig.model_validate({})
    )


class ServerOptimizerConfig(_Section):
    """``server_optimizer:``: how the server turns each round's released aggregate into the next
    global model (Reddi et al., ICLR 2021, "Adaptive Federated Optimization", Algorithm 2).

    The algorithm's own server step proposes x̂_{t+1}; with ``name`` other than ``none`` the
    pseudo-gradient Δ_t = x̂_{t+1} − x_t drives a server optimizer instead. It reads only the
    released global models, so it is post-processing: every ε is unchanged
    (:mod:`pdpfl.fl.server_optimizer`).
    """

    name: Literal["none", "fedavgm", "fedadam", "fedyogi"] = Field(
        "none",
        description="none (the algorithm's own step), fedavgm (server momentum), fedadam or "
        "fedyogi (adaptive server steps)",
    )
    eta: float | None = Field(
        None,
        gt=0,
        le=1e6,
        description="η, the server learning rate (default: 1.0 for fedavgm, 0.01 for "
        "fedadam/fedyogi)",
    )
    beta1: float = Field(0.9, ge=0, lt=1, description="β₁: momentum of Δ (fedavgm's β)")
    beta2: float = Field(0.99, ge=0, lt=1, description="β₂: decay of the second moment")
    tau: float = Field(
        1e-3, gt=0, le=1e6, description="τ: adaptivity (the second moment starts at τ²)"
    )

    def server_lr(self) -> float:
        """η: the configured value, else the method's default."""
        if self.eta is not None:
            return float(self.eta)
        return 1.0 if self.name == "fedavgm" else 0.01
