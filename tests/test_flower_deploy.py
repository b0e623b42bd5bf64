"""``docs/flower.md``'s deployment, command by command, on loopback.

The coordinator and three hospitals each get their own folder; the bash blocks marked
``<!-- deploy:NAME -->`` in the docs run as written, with ``coordinator.example.org`` →
``localhost``, fresh ports, and certificates (a CA and a server certificate for ``localhost``)
made here with ``cryptography``. Checked: TLS + SuperNode authentication end to end, the
simulator's model in reproducible mode, a SuperNode with an unregistered key, without a key, or
trusting another CA refused, and every process stopped (a silo pinned to its experiment refusing
another one: ``test_flower_toy.py``).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")

from pdpfl.runtime.flower.processes import _alive, descendants, flower_binary, free_port  # noqa: E402
from pdpfl.runtime.flower.transport import FlowerRunError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "flower.md"

try:
    flower_binary("flower-superlink")
except FlowerRunError as _err:  # pragma: no cover - depends on the installation
    pytest.skip(f"Flower binaries missing: {_err}", allow_module_level=True)

pytestmark = [pytest.mark.flower, pytest.mark.slow]

EXPERIMENT = [
    "data.num_clients=3",
    "rounds=2",
    "training.local_steps=3",
    "training.batch_size=12",
    "randomness=reproducible",
]


def make_certificates(folder: Path, names: tuple[str, ...] = ("localhost",)) -> None:
    """``ca.pem`` and a server certificate/key (``server.pem``/``server.key``) it signed."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    valid = (now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=1))
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pdpfl test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP384R1())
    sans = [x509.DNSName(n) for n in names] + [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    (folder / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (folder / "server.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "server.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def doc_blocks() -> dict[str, str]:
    """The bash blocks of docs/flower.md marked ``<!-- deploy:NAME -->``, by name."""
    text = DOCS.read_text()
    pattern = r"<!-- deploy:(\w+) -->\n<!-- no-run[^\n]*-->\n```bash\n(.*?)```"
    found = re.findall(pattern, text, re.S)
    return dict(found)


def test_docs_hold_every_deployment_step() -> None:
    blocks = doc_blocks()
    assert list(blocks) == ["superlink", "keygen", "register", "supernode", "submit"]
    assert "--enable-supernode-auth" in blocks["superlink"]
    assert "--auth-supernode-private-key" in blocks["supernode"]
    assert "--insecure" not in "".join(blocks.values())


class Deployment:
    """Runs the docs' blocks in per-host folders with loopback substitutions."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.blocks = doc_blocks()
        self.services: list[subprocess.Popen[bytes]] = []
        pdpfl_bin = Path(sys.executable).parent
        self.env = {
            **os.environ,
            "PATH": f"{pdpfl_bin}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), *sys.path]),
            "HOME": str(root / "home"),  # flwr keeps its app cache under ~/.flwr
        }

    def script(self, name: str, **replace: str) -> str:
        text = self.blocks[name]
        text = text.replace("coordinator.example.org:9093", f"localhost:{self.port}")
        text = text.replace("--host 0.0.0.0 --port 9093", f"--host 127.0.0.1 --port {self.port}")
        for old, new in replace.items():
            text = text.replace(old, new)
        return text

    def run(self, name: str, cwd: Path, timeout: float = 120, **replace: str) -> str:
        cwd.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["bash", "-ec", self.script(name, **replace)],
            cwd=cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert done.returncode == 0, f"{name}: {done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        return done.stdout + done.stderr

    def start(self, name: str, cwd: Path, **replace: str) -> subprocess.Popen[bytes]:
        cwd.mkdir(parents=True, exist_ok=True)
        log = (cwd / f"{name}.log").open("wb")
        # `exec` so that SIGTERM reaches the pdpfl command itself (it stops its children).
        script = self.script(name, **replace).replace("pdpfl flower ", "exec pdpfl flower ", 1)
        proc = subprocess.Popen(
            ["bash", "-ec", script],
            cwd=cwd,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.services.append(proc)
        return proc

    def stop(self) -> list[int]:
        """SIGTERM each service (as an operator would), then report what is still alive."""
        pids = [p.pid for p in self.services]
        family = pids + descendants(pids)
        for proc in self.services:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(_alive(pid) for pid in family):
            time.sleep(0.1)
        left = [pid for pid in family if _alive(pid)]
        for pid in left:  # leave nothing behind, even if the assertion below fails
            os.kill(pid, signal.SIGKILL)
        return left


def test_three_hospitals_with_tls_and_supernode_auth(tmp_path: Path) -> None:
    import yaml

    from pdpfl.config import config_to_dict, load_config
    from pdpfl.runtime.simulation import run_simulation

    config = load_config(ROOT / "examples" / "digits_demo.yaml", EXPERIMENT)
    run_simulation(config, tmp_path / "sim", progress=False)
    experiment = tmp_path / "experiment.yaml"
    experiment.write_text(yaml.safe_dump(config_to_dict(config)))

    coordinator = tmp_path / "coordinator"
    make_certificates(coordinator / "certs")
    hospitals = [tmp_path / f"hospital-{i}" for i in range(3)]
    deploy = Deployment(tmp_path)
    try:
        superlink = deploy.start("superlink", coordinator)
        _wait_for_port(deploy.port, superlink, coordinator / "superlink.log")
        (coordinator / "keys").mkdir()
        for i, host in enumerate(hospitals):
            deploy.run("keygen", host)
            assert (host / "keys" / "supernode.key").stat().st_mode & 0o777 == 0o600
            shutil.copy(host / "keys" / "supernode.pub", coordinator / "keys" / f"hospital-{i}.pub")
            shutil.copy(coordinator / "certs" / "ca.pem", host / "ca.pem")
            shutil.copy(experiment, host / "experiment.yaml")
            (host / "data").mkdir()
        out = deploy.run("register", coordinator)
        assert out.count("registered successfully") == 3
        for i, host in enumerate(hospitals):
            deploy.start("supernode", host, **{"I=0": f"I={i}", "9094": str(free_port())})
        # An unregistered SuperNode (its own fresh key) is refused by the SuperLink.
        intruder = tmp_path / "intruder"
        deploy.run("keygen", intruder)
        shutil.copy(coordinator / "certs" / "ca.pem", intruder / "ca.pem")
        shutil.copy(experiment, intruder / "experiment.yaml")
        (intruder / "data").mkdir()
        # (Flower's per-message mode: the intruder needs no worker to be refused.)
        refused = deploy.start(
            "supernode", intruder, **{"9094": f"{free_port()} --mode per-message"}
        )
        submit = deploy.run(
            "submit", coordinator, timeout=400, **{"experiment.yaml": str(experiment)}
        )
        assert "round 2/2" in submit
        assert refused.wait(timeout=120) != 0
        assert "Failed to activate SuperNode" in (intruder / "supernode.log").read_text()
        run = coordinator / "runs" / "exp1"
        a, b = np.load(tmp_path / "sim" / "model.npz"), np.load(run / "model.npz")
        for key in a.files:
            np.testing.assert_array_equal(a[key], b[key])
        # (A run with another configuration is refused by every pinned silo:
        # test_flower_toy.py::test_a_pinned_silo_refuses_any_other_experiment.)
    finally:
        left = deploy.stop()
    assert not left


def test_a_supernode_without_a_key_or_trusting_another_ca_is_refused(tmp_path: Path) -> None:
    """Against the docs' SuperLink (TLS + SuperNode authentication): a SuperNode started without
    its key, and one whose CA certificate is another CA's (its key registered: only TLS can
    refuse it), both exit non-zero without ever activating; a registered SuperNode with the
    right CA -- the control, same commands -- activates. (An unregistered key is refused in
    test_three_hospitals_with_tls_and_supernode_auth.)"""
    coordinator = tmp_path / "coordinator"
    make_certificates(coordinator / "certs")
    make_certificates(tmp_path / "other-ca")  # a CA the SuperLink's certificate is not from
    hosts = {name: tmp_path / name for name in ("control", "keyless", "foreign-ca")}
    deploy = Deployment(tmp_path)
    try:
        superlink = deploy.start("superlink", coordinator)
        _wait_for_port(deploy.port, superlink, coordinator / "superlink.log")
        (coordinator / "keys").mkdir()
        for i, (name, host) in enumerate(hosts.items()):
            deploy.run("keygen", host)
            shutil.copy(ROOT / "examples" / "digits_demo.yaml", host / "experiment.yaml")
            (host / "data").mkdir()
            ca = tmp_path / "other-ca" if name == "foreign-ca" else coordinator / "certs"
            shutil.copy(ca / "ca.pem", host / "ca.pem")
            if name != "keyless":
                shutil.copy(
                    host / "keys" / "supernode.pub", coordinator / "keys" / f"hospital-{i}.pub"
                )
        assert deploy.run("register", coordinator).count("registered successfully") == 2
        procs = {}
        for name, host in hosts.items():
            change = {"9094": f"{free_port()} --mode per-message"}
            if name == "keyless":
                change["--auth-supernode-private-key keys/supernode.key"] = ""
            procs[name] = deploy.start("supernode", host, **change)
        logs = {name: host / "supernode.log" for name, host in hosts.items()}
        for name in ("keyless", "foreign-ca"):
            assert procs[name].wait(timeout=120) != 0, logs[name].read_text()[-2000:]
        deadline = time.monotonic() + 60
        while "SuperNode ID:" not in logs["control"].read_text():
            assert procs["control"].poll() is None, logs["control"].read_text()[-2000:]
            assert time.monotonic() < deadline, "the control SuperNode did not activate"
            time.sleep(0.2)
        keyless, foreign = logs["keyless"].read_text(), logs["foreign-ca"].read_text()
        assert "SuperNode authentication is enabled" in keyless and "SuperNode ID:" not in keyless
        assert "CERTIFICATE_VERIFY_FAILED" in foreign and "SuperNode ID:" not in foreign
    finally:
        left = deploy.stop()
    assert not left


def _wait_for_port(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    import socket

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            with socket.create_connection(("127.0.0.1", port), 0.5):
                return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"the SuperLink did not listen on {port}")
