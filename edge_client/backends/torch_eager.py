"""The PyTorch eager backend: :mod:`har_models.nn.training`'s path behind the backend interface.

Each batch runs exactly ``train_local``'s operations (same model, loss, FedProx term, SGD without
momentum; dropout from the global torch RNG), so :func:`edge_client.backends.base.train` through
this backend reproduces ``train_local`` bit for bit. Explicit dropout masks are applied by a
forward pre-hook on the output layer with the model in eval mode. FedALA's kernel
(:meth:`TorchBackend.learn_ala`) learns W with autograd, computing the lower layers' output on the
sample once per round when only the head is blended.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from har_models.nn.arch import ArchSpec
from har_models.nn.metrics import confusion_matrix
from har_models.nn.model import HarCNN, build_model, init_state
from har_models.nn.training import make_loss
from har_models.settings import AlaConfig

from .base import BackendBase, EpochArgs, EvalResult, check_weights

if TYPE_CHECKING:
    from edge_client.backends.ala_kernel import AlaLearned

State = dict[str, torch.Tensor]


class TorchBackend(BackendBase):
    """:class:`~edge_client.backends.base.TrainingBackend` on a PyTorch :class:`~har_models.nn.model.HarCNN` (CPU, float32).

    Default weights: ``init_state`` with seed 0; ``eval_batch`` windows per inference pass (512, as
    ``har_models.nn.training.predict``). Raises ValueError if ``weights`` do not match ``spec``.
    """

    def __init__(self, spec: ArchSpec, weights: Mapping[str, np.ndarray] | None = None, eval_batch: int = 512):
        self._spec = spec
        start = {n: v.numpy() for n, v in init_state(spec, 0).items()} if weights is None else weights
        self.model = build_model(spec, {n: torch.from_numpy(v) for n, v in check_weights(spec, start, None, "TorchBackend").items()})
        self.eval_batch = int(eval_batch)

    def set_weights(self, weights: Mapping[str, np.ndarray], arch_version: int | None = None, *, partial: bool = False) -> None:
        """Load parameters by name; see :meth:`TrainingBackend.set_weights`."""
        arrays = self._weights_in(weights, arch_version, partial)
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                if name in arrays:
                    p.copy_(torch.from_numpy(arrays[name]))

    def get_weights(self) -> dict[str, np.ndarray]:
        """Copies of the parameters by name (float32)."""
        return {n: p.detach().numpy().copy() for n, p in self.model.named_parameters()}

    @contextmanager
    def _masked(self, mask: np.ndarray | None) -> Iterator[None]:
        """Within the block, dropout multiplies by ``mask`` (B, H) instead of drawing one (model in eval mode)."""
        if mask is None:
            yield
            return
        m = torch.from_numpy(np.ascontiguousarray(mask, dtype=np.float32))
        was_training = self.model.training
        self.model.eval()
        handle = self.model.out.register_forward_pre_hook(lambda _mod, args: (args[0] * m,))
        try:
            yield
        finally:
            handle.remove()
            self.model.train(was_training)

    def _reseed(self, seed: int | None) -> None:
        """Reseed the global torch RNG, dropout's stream as in ``train_local``; None continues it."""
        if seed is not None:
            torch.manual_seed(int(seed))

    def _epoch(self, xa: np.ndarray, ya: np.ndarray, o: np.ndarray, a: EpochArgs) -> list[float]:
        """One epoch operation for operation as ``train_local``."""
        model = self.model
        model.train()
        params = []
        for name, p in model.named_parameters():
            p.requires_grad_(name not in a.frozen)
            if name not in a.frozen:
                params.append((name, p))
        ref = {n: torch.as_tensor(np.asarray(a.prox_ref[n], np.float32)) for n, _ in params} if a.prox_mu > 0 and a.prox_ref else {}
        loss_fn = make_loss(a.class_weights)
        opt = torch.optim.SGD([p for _, p in params], lr=a.lr, momentum=0.0)
        xt, yt, ot = torch.from_numpy(xa), torch.from_numpy(ya), torch.from_numpy(o)
        self._reseed(a.dropout_seed)
        losses = []
        for i, s in enumerate(range(0, len(xa), a.batch_size)):
            idx = ot[s : s + a.batch_size]
            opt.zero_grad(set_to_none=True)
            with self._masked(a.mask(i)):
                loss = loss_fn(model(xt[idx]), yt[idx])
            if ref:
                loss = loss + 0.5 * a.prox_mu * sum(((p - ref[name]) ** 2).sum() for name, p in params)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        for _, p in model.named_parameters():
            p.requires_grad_(True)
        return losses

    @torch.no_grad()
    def logits(self, x: np.ndarray) -> np.ndarray:
        """Logits ``(N, C)`` float32 with dropout off, in chunks of ``eval_batch``."""
        xa, _ = self._windows(x, None)
        self.model.eval()
        out = [self.model(torch.from_numpy(xa[s : s + self.eval_batch])).numpy() for s in range(0, len(xa), self.eval_batch)]
        return np.concatenate(out) if out else np.empty((0, self._spec.n_classes), np.float32)

    def _mean_loss(self, z: np.ndarray, y: np.ndarray, class_weights: np.ndarray | None) -> float:
        """Mean (weighted) CE by PyTorch's loss, as ``train_local`` computes it."""
        return float(make_loss(class_weights)(torch.from_numpy(z), torch.from_numpy(y)))

    head_params: tuple[str, ...] = HarCNN.HEAD_PARAMS
    """The output layer's tensors, the only ones :meth:`evaluate_pair` may swap."""

    def evaluate_pair(self, x: np.ndarray, y: np.ndarray, head: Mapping[str, np.ndarray]) -> tuple[EvalResult, EvalResult] | None:
        """:meth:`evaluate` of the model held and of the same model with output layer ``head``, lower layers run once.

        For FedALA's round (p = 2): the hidden activations are computed once (:func:`fast_features`, in
        chunks of ``eval_batch``) and both heads run on them; the results equal two :meth:`evaluate`
        calls. Returns None when ``head`` names a tensor outside :attr:`head_params` (evaluate one by
        one then). Raises ValueError if x/y or the head's shapes do not fit. The held model is unchanged.
        """
        xa, ya = self._windows(x, y, "evaluate_pair")
        assert ya is not None
        if not set(head) <= set(self.head_params):
            return None
        swapped = check_weights(self._spec, head, None, "TorchBackend.evaluate_pair", True)
        held = self.model.out
        heads = [(held.weight.detach(), held.bias.detach()),
                 tuple(torch.from_numpy(swapped[n]) if n in swapped else getattr(held, n.split(".")[1]).detach()
                       for n in ("out.weight", "out.bias"))]  # fmt: skip
        self.model.eval()
        zs: list[list[np.ndarray]] = [[], []]
        with torch.no_grad():
            for s in range(0, len(xa), self.eval_batch):
                h = fast_features(self.model, torch.from_numpy(xa[s : s + self.eval_batch]), self.eval_batch)
                for dest, (w, b) in zip(zs, heads, strict=True):
                    dest.append(F.linear(h, w, b).numpy())
        out = []
        for parts in zs:
            z = np.concatenate(parts) if parts else np.empty((0, self._spec.n_classes), np.float32)
            loss = float(make_loss(None)(torch.from_numpy(z), torch.from_numpy(ya))) if len(ya) else float("nan")
            out.append(EvalResult(confusion_matrix(ya, z.argmax(axis=1).astype(np.int64), self._spec.n_classes), loss))
        return out[0], out[1]

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Class probabilities ``(B, C)`` float32, dropout off."""
        return torch.softmax(torch.from_numpy(self.logits(x)), dim=1).numpy()

    def _grads(
        self, xa: np.ndarray, ya: np.ndarray, names: Sequence[str], class_weights: np.ndarray | None,
        dropout: bool, dropout_seed: int | None, dropout_mask: np.ndarray | None,
    ) -> tuple[float, dict[str, np.ndarray]]:  # fmt: skip
        params = dict(self.model.named_parameters())
        unknown = set(names) - set(params)
        if unknown:
            raise ValueError(f"TorchBackend.top_layer_grads: {sorted(unknown)} are not parameters; known {list(params)}")
        for p in params.values():
            p.grad = None
        self._reseed(dropout_seed)
        self.model.train(dropout)
        with torch.enable_grad(), self._masked(dropout_mask):
            loss = make_loss(class_weights)(self.model(torch.from_numpy(xa)), torch.from_numpy(ya))
            grads = torch.autograd.grad(loss, [params[n] for n in names])
        return float(loss.detach()), {n: g.detach().numpy().copy() for n, g in zip(names, grads, strict=True)}

    def learn_ala(
        self, received: Mapping[str, np.ndarray], local: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray],
        x: np.ndarray, y: np.ndarray, *, config: AlaConfig, batch_size: int, seed: int, start_phase: bool,
        class_weights: np.ndarray | None = None,
    ) -> AlaLearned:  # fmt: skip
        """FedALA's W learning (steps 3-5 of :func:`edge_client.ala.adaptive_local_aggregation`) with PyTorch autograd.

        Zhang et al., AAAI 2023, Algorithm 1 lines 6-16, with the contract of
        :func:`edge_client.ala.learn_ala_weights`, on a temporary model built from ``received`` after
        seeding the torch RNG with ``seed``; the blend is ``torch.lerp``. The global torch RNG state
        and this backend's model are left as they were. ``weights``: W of the higher tensors (its
        keys define them). Raises ValueError if the tensors do not match the architecture.
        """
        from edge_client.backends.ala_kernel import AlaLearned, stop_after_pass

        theta = {n: torch.from_numpy(np.asarray(v, np.float32)) for n, v in received.items()}
        theta_i = {n: torch.from_numpy(np.asarray(v, np.float32)) for n, v in local.items()}
        w = {h: torch.from_numpy(np.array(v, np.float32)) for h, v in weights.items()}
        higher = tuple(w)
        xs = torch.as_tensor(x, dtype=torch.float32)
        ys = torch.as_tensor(y, dtype=torch.long)
        loss_fn = make_loss(class_weights)

        def out(state: State, weights_: State, losses: list[float], n: int, converged: bool, fallback: str | None) -> AlaLearned:
            return AlaLearned(
                {k: v.detach().numpy() for k, v in state.items()}, {k: v.detach().numpy() for k, v in weights_.items()},
                tuple(losses), n, converged, fallback,
            )  # fmt: skip

        # Every random draw (model construction, sample, batch order, dropout) is seeded here and
        # the caller's global RNG state is restored afterwards.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))
            # The lower tensors are only read (W's learning writes the higher ones): the model holds theta's own
            # tensors there instead of a copy of them (25.8 MB for the paper CNN), and copies of those it writes.
            model = build_model(self._spec, {n: t.clone() if n in w else t for n, t in theta.items()}, copy=False)
            w_stored = dict(w)  # entries are replaced, never modified in place, during learning
            n_total = int(xs.shape[0])
            n_sample = int(n_total * config.rand_percent // 100)  # floor(s/100 * N), exact for whole percentages
            if n_sample == 0:
                return out(_blend(theta, theta, {}), w_stored, [], 0, False, "empty sample")
            if config.eta == 0:
                return out(_blend(theta_i, theta, w), w_stored, [], n_sample, False, None)
            diff = {h: theta[h] - theta_i[h] for h in higher}
            params = dict(model.named_parameters())
            for name, p in params.items():
                p.requires_grad_(name in higher)
            model.train(config.mode == "train")
            losses: list[float] = []
            converged = False
            with torch.enable_grad():
                gen = torch.Generator().manual_seed(int(seed))
                sample = torch.randperm(n_total, generator=gen)[:n_sample]
                _write(params, theta_i, theta, w)
                head = _head_on_cached_features(model, higher, xs, sample, batch_size)
                while True:
                    order = sample[torch.randperm(n_sample, generator=gen)]
                    loss = torch.zeros(())
                    for lo in range(0, n_sample, batch_size):
                        idx = order[lo : lo + batch_size]
                        for h in higher:
                            params[h].grad = None
                        logits = head(idx) if head is not None else model(xs[idx])
                        loss = loss_fn(logits, ys[idx])
                        loss.backward()
                        with torch.no_grad():
                            for h in higher:
                                g = params[h].grad
                                if g is not None:
                                    w[h] = torch.clamp(w[h] - config.eta * g * diff[h], 0.0, 1.0)
                            _write(params, theta_i, theta, w)
                    losses.append(float(loss.detach()))
                    if not math.isfinite(losses[-1]):
                        return out(_blend(theta, theta, {}), w_stored, losses, n_sample, False, "non-finite loss")
                    stop, converged = stop_after_pass(losses, config, start_phase)
                    if stop:
                        break
            return out(_blend(theta_i, theta, w), w, losses, n_sample, converged, None)


def _blend(local: State, received: State, weights: State) -> State:
    """thetahat = ``torch.lerp(theta_i, theta, W)`` on the tensors of ``weights``; the received tensors
    themselves (no copy, 25.8 MB saved per round for the paper CNN) elsewhere."""
    return {n: torch.lerp(local[n], theta, weights[n]) if n in weights else theta.detach() for n, theta in received.items()}


def _head_on_cached_features(
    model: nn.Module, higher: tuple[str, ...], xs: torch.Tensor, sample: torch.Tensor, batch_size: int
) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """Window indices ``(b,)`` -> logits ``(b, C)`` from features computed once, or None where that does not apply.

    When only head tensors are blended (p = 2), the lower layers hold theta throughout, so their
    output on the sample is computed once (in batches of ``batch_size``) and each pass runs only the
    head, with the same dropout draws: W, losses and thetahat equal the whole model's to float
    rounding. Costs n_sample x H floats.
    """
    if not isinstance(model, HarCNN) or not set(higher) <= set(HarCNN.HEAD_PARAMS):
        return None
    # In batches of ``batch_size`` as before: the hidden layer's matmul rounds differently for another batch size.
    feats = fast_features(model, xs[sample], batch_size)
    row = torch.full((int(xs.shape[0]),), -1, dtype=torch.long)
    row[sample] = torch.arange(int(sample.shape[0]))
    return lambda idx: model.head(feats[row[idx]])


def fast_features(model: HarCNN, x: torch.Tensor, chunk: int) -> torch.Tensor:
    """:meth:`HarCNN.features` without autograd, about twice as fast on CPU: raw windows ``(N, 6, T)`` or
    ``(N, 6, T, 1)`` -> hidden activations ``(N, H)`` after ReLU, ``chunk`` windows per pass.

    The (k, 1) convolution runs as a 1-D convolution and the max-pool as a max over a reshaped axis:
    the same numbers (timings in docs/benchmarks-client.md). Only for inference and FedALA's cached features;
    training keeps :meth:`HarCNN.features`. ``tests/test_backends.py`` checks it.
    """
    spec = model.spec
    mean, std = model.get_buffer("input_mean"), model.get_buffer("input_std")
    pad = spec.same_padding
    out = []
    with torch.no_grad():
        for lo in range(0, int(x.shape[0]), chunk):
            xb = x[lo : lo + chunk]
            if xb.dim() == 3:
                xb = xb.unsqueeze(-1)
            xb = F.pad((xb - mean) / std, (0, 0, pad[0], pad[1]))
            c = F.relu(F.conv1d(xb.squeeze(-1), model.conv.weight.squeeze(-1), model.conv.bias))
            b, f, t = c.shape
            pooled = c.reshape(b, f, t // spec.pool, spec.pool).amax(3)  # = max_pool2d(c, (pool, 1)); T % pool == 0
            out.append(F.relu(model.hidden(pooled.reshape(b, f * (t // spec.pool)))))
    return torch.cat(out) if out else torch.empty((0, spec.dense_units))


def _write(params: dict[str, nn.Parameter], base: State, theta: State, w: State) -> None:
    """Load theta_i + (theta - theta_i) ⊙ W into the temporary model's higher tensors."""
    with torch.no_grad():
        for h, wh in w.items():
            params[h].copy_(torch.lerp(base[h], theta[h], wh))
