"""The rPDP-FL reference's non-private FedAvg loop on Fed-Heart-Disease, in plain torch.

Evidence for docs/reproduce/README.md (PrivacyFree on Heart): the training loop of the script
that wrote rPDP-FL's published Figure 8 results (FedAvg over the 4 hospitals, weights
proportional to the silos' sizes, 15 rounds of 50 local SGD steps at lr 0.01 on shuffled
batches of 16, a fresh loader iterator each round, logistic regression with a sigmoid output
and BCE loss), re-implemented without pdpfl's training code, on pdpfl's loading of the same
UCI files with FLamby's split. It prints the pooled test accuracy after the last round for ten
seeds, with shuffled batches (the reference) and with Poisson batches of expected size 16
(pdpfl's PrivacyFree).

    python docs/reproduce/heart_reference_loop.py --data-dir ../shared/data
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from pdpfl.data import load_federation


def run(fed, seed: int, sampler: str) -> float:
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    glob = torch.nn.Linear(13, 1)
    n = np.array([len(c.y_train) for c in fed.clients], dtype=float)
    batches: list[list[np.ndarray]] = [[] for _ in fed.clients]
    for _ in range(15):
        deltas = []
        for i, c in enumerate(fed.clients):
            model = torch.nn.Linear(13, 1)
            model.load_state_dict(glob.state_dict())
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            x = torch.tensor(c.x_train, dtype=torch.float32)
            y = torch.tensor(c.y_train, dtype=torch.float32)
            batches[i] = []  # the reference restarts its loader iterator every round
            for _ in range(50):
                if sampler == "shuffle":
                    if not batches[i]:
                        perm = rng.permutation(len(y))
                        batches[i] = [perm[k : k + 16] for k in range(0, len(y), 16)]
                    idx = batches[i].pop(0)
                else:
                    idx = np.flatnonzero(rng.random(len(y)) < 16 / len(y))
                    if idx.size == 0:
                        continue
                prob = torch.sigmoid(model(x[idx]).squeeze(-1))
                loss = torch.nn.functional.binary_cross_entropy(prob, y[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
            deltas.append([p.detach() - q.detach() for p, q in zip(model.parameters(), glob.parameters())])
        w = n / n.sum()
        with torch.no_grad():
            for k, p in enumerate(glob.parameters()):
                p += sum(w[i] * deltas[i][k] for i in range(len(deltas)))
    correct = total = 0
    with torch.no_grad():
        for c in fed.clients:
            pred = glob(torch.tensor(c.x_test, dtype=torch.float32)).squeeze(-1) > 0
            correct += int((pred.numpy() == c.y_test).sum())
            total += len(c.y_test)
    return correct / total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default="../shared/data")
    args = parser.parse_args()
    torch.set_num_threads(1)
    fed = load_federation("heart-disease", data_dir=args.data_dir, split="flamby")
    seeds = (42, 43, 44, 45, 46, 1, 2, 3, 4, 5)
    for sampler in ("shuffle", "poisson"):
        acc = [run(fed, s, sampler) for s in seeds]
        print(
            f"{sampler}: {np.mean(acc):.4f} ± {np.std(acc, ddof=1):.4f} over seeds {seeds}: "
            f"{[round(a, 4) for a in acc]}"
        )


if __name__ == "__main__":
    main()
