"""The PyTorch eager backend: today's training path (:mod:`har_models.nn.training`) behind the backend interface.

Each batch runs exactly the operations of :func:`har_models.nn.training.train_local` (the same
:class:`~har_models.nn.model.HarCNN`, loss from :func:`~har_models.nn.training.make_loss`, FedProx term
``0.5 * mu * sum ||p - ref||^2``, ``torch.optim.SGD`` without momentum), so
:func:`edge_client.backends.base.train` through this backend reproduces ``train_local`` bit for bit.
Dropout draws from the global torch RNG (seeded by ``dropout_seed``), as ``train_local`` does.

Explicit dropout masks are applied by a forward pre-hook on the output layer with the model in
eval mode (where ``F.dropout`` is the identity): the hook multiplies the hidden activations by the
mask, which is where dropout acts in ``HarCNN.forward``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

import numpy as np
import torch

from har_models.nn.arch import ArchSpec
from har_models.nn.metrics import confusion_matrix
from har_models.nn.model import build_model, init_state
from har_models.nn.training import make_loss

from .base import EvalResult, check_train_args, check_weights, check_windows


class TorchBackend:
    """:class:`~edge_client.backends.base.TrainingBackend` on a PyTorch :class:`~har_models.nn.model.HarCNN` (CPU, float32).

    Parameters
    ----------
    spec : ArchSpec
    weights : name -> ndarray, optional
        Initial parameters (default :func:`har_models.nn.model.init_state` with seed 0).
    eval_batch : int
        Windows per forward pass in :meth:`evaluate` and :meth:`predict` (512, as ``har_models.nn.training.predict``).

    Raises
    ------
    ValueError
        If ``weights`` do not match ``spec``.
    """

    def __init__(self, spec: ArchSpec, weights: Mapping[str, np.ndarray] | None = None, eval_batch: int = 512):
        self._spec = spec
        start = {n: v.numpy() for n, v in init_state(spec, 0).items()} if weights is None else weights
        self.model = build_model(spec, {n: torch.from_numpy(v) for n, v in check_weights(spec, start, None, "TorchBackend").items()})
        self.eval_batch = int(eval_batch)

    @property
    def spec(self) -> ArchSpec:
        """The architecture this backend runs."""
        return self._spec

    def set_weights(self, weights: Mapping[str, np.ndarray], arch_version: int | None = None, *, partial: bool = False) -> None:
        """Load parameters by name; see :meth:`TrainingBackend.set_weights`."""
        arrays = check_weights(self._spec, weights, arch_version, "TorchBackend.set_weights", partial)
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

    def train_epoch(
        self,
        x: np.ndarray,
        y: np.ndarray,
        order: np.ndarray,
        *,
        lr: float,
        batch_size: int,
        class_weights: np.ndarray | None = None,
        prox_mu: float = 0.0,
        prox_ref: Mapping[str, np.ndarray] | None = None,
        frozen: Sequence[str] = (),
        dropout_seed: int | None = None,
        dropout_masks: Sequence[np.ndarray] | None = None,
    ) -> np.ndarray:
        """One epoch of SGD, operation for operation as ``train_local``; see :meth:`TrainingBackend.train_epoch`."""
        xa, ya = check_windows(self._spec, x, y, "TorchBackend.train_epoch")
        assert ya is not None
        o = check_train_args(self._spec, len(xa), order, batch_size, prox_mu, prox_ref, frozen, dropout_masks, "TorchBackend")
        model = self.model
        model.train()
        params = []
        for name, p in model.named_parameters():
            p.requires_grad_(name not in frozen)
            if name not in frozen:
                params.append((name, p))
        ref = {n: torch.as_tensor(np.asarray(prox_ref[n], np.float32)) for n, _ in params} if prox_mu > 0 and prox_ref else {}
        loss_fn = make_loss(class_weights)
        opt = torch.optim.SGD([p for _, p in params], lr=lr, momentum=0.0)
        xt, yt, ot = torch.from_numpy(xa), torch.from_numpy(ya), torch.from_numpy(o)
        if dropout_seed is not None:
            torch.manual_seed(int(dropout_seed))
        losses = []
        for i, s in enumerate(range(0, len(xa), batch_size)):
            idx = ot[s : s + batch_size]
            opt.zero_grad(set_to_none=True)
            with self._masked(dropout_masks[i] if dropout_masks is not None else None):
                loss = loss_fn(model(xt[idx]), yt[idx])
            if ref:
                loss = loss + 0.5 * prox_mu * sum(((p - ref[name]) ** 2).sum() for name, p in params)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        for _, p in model.named_parameters():
            p.requires_grad_(True)
        return np.asarray(losses, dtype=np.float64)

    @torch.no_grad()
    def logits(self, x: np.ndarray) -> np.ndarray:
        """Logits ``(N, C)`` float32 with dropout off, in chunks of ``eval_batch``."""
        xa, _ = check_windows(self._spec, x, None, "TorchBackend")
        self.model.eval()
        out = [self.model(torch.from_numpy(xa[s : s + self.eval_batch])).numpy() for s in range(0, len(xa), self.eval_batch)]
        return np.concatenate(out) if out else np.empty((0, self._spec.n_classes), np.float32)

    def evaluate(self, x: np.ndarray, y: np.ndarray, class_weights: np.ndarray | None = None) -> EvalResult:
        """Confusion matrix ``(C, C)`` and mean (weighted) CE with dropout off."""
        xa, ya = check_windows(self._spec, x, y, "TorchBackend.evaluate")
        assert ya is not None
        z = self.logits(xa)
        loss = float(make_loss(class_weights)(torch.from_numpy(z), torch.from_numpy(ya))) if len(ya) else float("nan")
        return EvalResult(confusion_matrix(ya, z.argmax(axis=1).astype(np.int64), self._spec.n_classes), loss)

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Class probabilities ``(B, C)`` float32, dropout off."""
        return torch.softmax(torch.from_numpy(self.logits(x)), dim=1).numpy()

    def top_layer_grads(
        self,
        x: np.ndarray,
        y: np.ndarray,
        names: Sequence[str],
        *,
        class_weights: np.ndarray | None = None,
        dropout: bool = False,
        dropout_seed: int | None = None,
        dropout_mask: np.ndarray | None = None,
    ) -> tuple[float, dict[str, np.ndarray]]:
        """The batch loss and its gradient w.r.t. ``names``; see :meth:`TrainingBackend.top_layer_grads`."""
        xa, ya = check_windows(self._spec, x, y, "TorchBackend.top_layer_grads")
        assert ya is not None
        params = dict(self.model.named_parameters())
        unknown = set(names) - set(params)
        if unknown:
            raise ValueError(f"TorchBackend.top_layer_grads: {sorted(unknown)} are not parameters; known {list(params)}")
        for p in params.values():
            p.grad = None
        if dropout_seed is not None:
            torch.manual_seed(int(dropout_seed))
        self.model.train(dropout)
        with torch.enable_grad(), self._masked(dropout_mask):
            loss = make_loss(class_weights)(self.model(torch.from_numpy(xa)), torch.from_numpy(ya))
            grads = torch.autograd.grad(loss, [params[n] for n in names])
        return float(loss.detach()), {n: g.detach().numpy().copy() for n, g in zip(names, grads, strict=True)}
