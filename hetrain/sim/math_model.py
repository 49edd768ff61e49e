"""Real model math for the simulator (``--math digits``) and its timing-only stand-in.

With ``DigitsMath`` every simulated worker holds its own copy of a small MLP
(64-64-10, ReLU, softmax cross-entropy: the shape of ``hetrain train``'s mlp
workload, 4,810 parameters as one flat float32 vector) trained with plain SGD on scikit-learn's digits (no download). The
protocols apply real gradients and real weighted averages, so staleness,
dropped updates and partial averaging change accuracy as they would in a run.
Batches are drawn i.i.d. from the whole training split with a per-worker RNG
seeded from (seed, worker), so thousands of workers never run out of data.

``NullMath`` has the same interface and does nothing: timing only.
"""

from __future__ import annotations

import numpy as np

DIGITS_LAYERS = (64, 64, 10)
DIGITS_PARAMS = 64 * 64 + 64 + 64 * 10 + 10  # 4,810


class NullMath:
    """Timing only: no models, payloads are None."""

    enabled = False

    def local_step(self, worker: int) -> None:
        pass

    def snapshot(self, worker: int):
        return None

    def apply_average(self, worker: int, plan, progress=None) -> None:
        pass

    def set_params(self, worker: int, params) -> None:
        pass

    def maybe_evaluate(self, now_s: float, done: int) -> None:
        pass

    def final(self) -> dict:
        return {"final_accuracy_avg_model": None, "final_accuracy_worst_worker": None,
                "consensus_distance": None, "accuracy_curve": [], "time_to_target_worst_worker_s": None}


class DigitsMath:
    """One MLP per worker on digits; SGD steps, weighted averages and evaluation."""

    enabled = True

    def __init__(self, num_workers: int, *, batch_size: int = 32, lr: float = 0.1, seed: int = 0,
                 eval_points: int = 20, total_iterations: int = 1, target_accuracy: float = 0.95,
                 momentum: float = 0.0):
        from sklearn.datasets import load_digits

        data = load_digits()
        x = (data.data / 16.0).astype(np.float32)
        y = data.target.astype(np.int64)
        order = np.random.default_rng(seed).permutation(len(y))
        split = int(0.8 * len(y))
        self.x_train, self.y_train = x[order[:split]], y[order[:split]]
        self.x_test, self.y_test = x[order[split:]], y[order[split:]]
        self.batch_size = batch_size
        self.lr = np.float32(lr)
        self.momentum = np.float32(momentum)  # heavy-ball SGD, each worker's buffer its own (never averaged)
        init_rng = np.random.default_rng(seed)
        d0, d1, d2 = DIGITS_LAYERS
        init = np.concatenate([
            (init_rng.standard_normal(d0 * d1) / np.sqrt(d0)).astype(np.float32), np.zeros(d1, np.float32),
            (init_rng.standard_normal(d1 * d2) / np.sqrt(d1)).astype(np.float32), np.zeros(d2, np.float32),
        ])
        self.params = [init.copy() for _ in range(num_workers)]  # every worker starts from one model
        self.velocity = [np.zeros_like(init) for _ in range(num_workers)] if momentum else None
        self.rngs = [np.random.default_rng((seed, w)) for w in range(num_workers)]
        self.curve: list[dict] = []
        self._eval_every = max(1, total_iterations // max(1, eval_points))
        self._next_eval = self._eval_every
        self.target_accuracy = target_accuracy
        self.worst_worker_at_target_s: float | None = None
        self._miss_order = list(range(num_workers))  # the last worker to miss the target is tried first
        self.on_target = None  # called once when the averaged model first reaches the target accuracy

    # ----- the model -------------------------------------------------------------
    @staticmethod
    def _unpack(flat: np.ndarray):
        d0, d1, d2 = DIGITS_LAYERS
        a = d0 * d1
        b = a + d1
        c = b + d1 * d2
        return flat[:a].reshape(d0, d1), flat[a:b], flat[b:c].reshape(d1, d2), flat[c:]

    def gradient(self, flat: np.ndarray, xb: np.ndarray, yb: np.ndarray) -> np.ndarray:
        """Mean cross-entropy gradient of the flat parameters on one batch."""
        w1, b1, w2, b2 = self._unpack(flat)
        h = xb @ w1 + b1
        relu = np.maximum(h, 0)
        logits = relu @ w2 + b2
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        p[np.arange(len(yb)), yb] -= 1.0
        p /= len(yb)
        g_w2 = relu.T @ p
        g_h = (p @ w2.T) * (h > 0)
        return np.concatenate([(xb.T @ g_h).ravel(), g_h.sum(0), g_w2.ravel(), p.sum(0)])

    def batch(self, worker: int):
        index = self.rngs[worker].integers(0, len(self.y_train), self.batch_size)
        return self.x_train[index], self.y_train[index]

    def worker_gradient(self, worker: int, params: np.ndarray | None = None) -> np.ndarray:
        xb, yb = self.batch(worker)
        return self.gradient(self.params[worker] if params is None else params, xb, yb)

    def accuracy(self, flat: np.ndarray) -> float:
        w1, b1, w2, b2 = self._unpack(flat)
        logits = np.maximum(self.x_test @ w1 + b1, 0) @ w2 + b2
        return float((logits.argmax(1) == self.y_test).mean())

    # ----- what the protocols call ---------------------------------------------------
    def local_step(self, worker: int) -> None:
        gradient = self.worker_gradient(worker)
        if self.velocity is not None:  # torch.optim.SGD's momentum: v = m v + g; p -= lr v
            self.velocity[worker] = self.momentum * self.velocity[worker] + gradient
            gradient = self.velocity[worker]
        self.params[worker] -= self.lr * gradient

    def snapshot(self, worker: int) -> np.ndarray:
        return self.params[worker].copy()

    def apply_average(self, worker: int, plan, progress=None) -> None:
        """Apply a Hop-style plan: self_weight * own + sum(term.weight * term.payload), and for an old term
        the worker's own steps it lacks, when ``progress`` (:class:`~hetrain.protocols.lag_compensation.
        OwnProgress`) holds them."""
        new = plan.self_weight * self.params[worker]
        for term in plan.terms:
            new += np.float32(term.weight) * term.payload
            if progress is not None and (lost := progress.lost_steps(term)) is not None:
                now, then = lost
                new += np.float32(term.weight) * (now - then)
        self.params[worker] = new.astype(np.float32, copy=False)
        if progress is not None:
            progress.mixed(self.params[worker].copy())

    def set_params(self, worker: int, params: np.ndarray) -> None:
        self.params[worker] = params.copy()

    def maybe_evaluate(self, now_s: float, done: int) -> None:
        """Record a point of the accuracy curve each time ``done`` gradients pass a step."""
        if done >= self._next_eval:
            self._next_eval = (done // self._eval_every + 1) * self._eval_every
            point = {"t_s": now_s, "iterations": done, "accuracy_avg_model": self.accuracy(self.average_model())}
            if self.on_target is not None and point["accuracy_avg_model"] >= self.target_accuracy:
                self.on_target()
                self.on_target = None
            if self.worst_worker_at_target_s is None:
                point["worst_worker_at_target"] = self._every_worker_at_target()
                if point["worst_worker_at_target"]:
                    self.worst_worker_at_target_s = now_s
            self.curve.append(point)

    def _every_worker_at_target(self) -> bool:
        """Whether every worker's own model reaches the target accuracy (stops at the first that misses)."""
        for worker in self._miss_order:
            if self.accuracy(self.params[worker]) < self.target_accuracy:
                self._miss_order.remove(worker)
                self._miss_order.insert(0, worker)
                return False
        return True

    def average_model(self) -> np.ndarray:
        return np.mean(self.params, axis=0)

    def final(self) -> dict:
        mean = self.average_model()
        spread = float(np.sqrt(np.mean([np.sum((p - mean) ** 2) for p in self.params])))
        return {
            "final_accuracy_avg_model": self.accuracy(mean),
            "final_accuracy_worst_worker": min(self.accuracy(p) for p in self.params),
            "consensus_distance": spread,
            "accuracy_curve": self.curve,
            "time_to_target_worst_worker_s": self.worst_worker_at_target_s,
        }
