"""Live tensor bytes of a (fake) training step, counted the way CUDA's caching allocator counts them.

``LiveBytes`` is a TorchDispatchMode: every aten op's output storages are registered with their
size rounded up to CUDA's 512-byte allocation granularity, a weak reference on each storage
subtracts it again when the storage dies, and the running total's maximum is the analogue of
``torch.cuda.max_memory_allocated``. At each new maximum a caller-supplied classifier splits the
total into parameters / gradients / optimizer states / other, so the breakdown is the one *at
the peak*, not a sum of per-category maxima.

Why not ``torch.distributed._tools.mem_tracker.MemTracker`` (which memory-notes used): on torch
2.13 it rounds to 512 B only for ``cuda`` devices (pitfall 7), and fake CUDA tensors abort
autograd on a CPU build (pitfall 1), so its counts of fake CPU tensors are unrounded; its
categories are decided when a storage is first seen (a gradient is "temp" until its hook runs,
everything the optimizer allocates is "optimizer", temporaries included), which is not MARP's
split; and it re-scans every tracked module on every op. The counting rule is the same (one
entry per untyped storage, released through a weak reference), and ``tests/unit/measure``
checks that the two agree when rounding is off.

One way memory comes and goes without an aten op: ``UntypedStorage.resize_``. FSDP2 frees a
gathered layer that way (``_fsdp_param.free_storage``: ``storage.resize_(0)``, the tensor and its
storage object live on) and re-allocates it before the next all-gather (``alloc_storage``); no
dispatch mode sees either, so a tracker that only watches op outputs keeps every gathered layer
counted until the storage dies. ``LiveBytes.counting_resizes`` hooks the storage method for as
long as it is entered.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves

from frenzy.measure.config import CUDA_ROUND_BYTES


def _storage_holders(t: object) -> list[torch.Tensor]:
    """The plain tensors that own ``t``'s memory: itself, or a wrapper subclass's (DTensor's)
    inner tensors."""
    if not isinstance(t, torch.Tensor):
        return []
    if is_traceable_wrapper_subclass(t):
        names, _ = t.__tensor_flatten__()
        return [x for name in names for x in _storage_holders(getattr(t, name))]
    return [t]


def rounded(nbytes: int, granularity: int) -> int:
    if granularity <= 1 or nbytes == 0:
        return nbytes
    return -(-nbytes // granularity) * granularity


class LiveBytes(TorchDispatchMode):
    """Running total and peak of live storage bytes seen by aten ops inside the mode.

    Tensors that exist before the mode is entered (parameters, optimizer states) must be
    registered with ``track``. ``classify`` (optional) is called at every new peak and returns
    the breakdown to remember for it; ``phase`` is a label the caller moves along (forward,
    backward, optimizer) and is remembered with the peak.
    """

    def __init__(self, granularity: int = CUDA_ROUND_BYTES,
                 classify: Callable[[LiveBytes], dict[str, int]] | None = None) -> None:  # fmt: skip
        super().__init__()
        self.granularity = granularity
        self.classify = classify
        self.current = 0
        self.peak = 0
        self.peak_phase = ""
        self.peak_breakdown: dict[str, int] = {}
        self.phase = ""
        self.phase_peaks: dict[str, int] = {}
        # id(storage) -> (weakref whose callback frees it, counted bytes). The weakref must be kept
        # alive for its callback to fire; ids cannot be reused before the callback has run.
        self._live: dict[int, tuple[weakref.ref, int]] = {}

    # ---- registration ------------------------------------------------------------------------

    def track(self, tensors: Iterable[torch.Tensor | None]) -> None:
        for t in tensors:
            for local in _storage_holders(t):
                self._add(local)

    def bytes_of(self, t: torch.Tensor | None) -> int:
        """Counted bytes of a tensor's storage (a DTensor's: its local shard's) if it is live and
        tracked, else 0."""
        total = 0
        for local in _storage_holders(t):
            entry = self._live.get(id(local.untyped_storage()))
            total += entry[1] if entry is not None else 0
        return total

    def observe(self, out: object) -> None:
        """Count the tensors ``out`` holds as one op's outputs (the multi-GPU oracle calls this from
        its fake-tensor mode, where DTensor's inner ops are seen too)."""
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._add(t)
        self._note_peak()

    def _add(self, t: torch.Tensor) -> None:
        self._add_storage(t.untyped_storage())

    def _add_storage(self, st: torch.UntypedStorage) -> None:
        key = id(st)
        nbytes = rounded(st.nbytes(), self.granularity)
        entry = self._live.get(key)
        if entry is not None:
            if entry[1] != nbytes:  # resized in place (resize_, out= ops)
                self.current += nbytes - entry[1]
                self._live[key] = (entry[0], nbytes)
            return
        if nbytes == 0:
            return
        ref = weakref.ref(st, self._release_cb(key))
        self._live[key] = (ref, nbytes)
        self.current += nbytes

    def _release_cb(self, key: int) -> Callable[[weakref.ref], None]:
        def release(_: weakref.ref) -> None:
            entry = self._live.pop(key, None)
            if entry is not None:
                self.current -= entry[1]

        return release

    def storage_resized(self, st: torch.UntypedStorage) -> None:
        """``st`` was resized in place: count its new size (0 after FSDP2's free). A storage at 0
        bytes keeps its entry and weak reference, so growing it again counts it again."""
        self._add_storage(st)
        self._note_peak()

    @contextmanager
    def counting_resizes(self) -> Iterator[LiveBytes]:
        """While entered, every ``UntypedStorage.resize_`` (FSDP2's ``free_storage`` and
        ``alloc_storage``) updates this tracker; nested trackers are each told."""
        _RESIZE_WATCHERS.append(self)
        if len(_RESIZE_WATCHERS) == 1:
            torch.UntypedStorage.resize_ = _resize_and_tell  # type: ignore[method-assign]
        try:
            yield self
        finally:
            _RESIZE_WATCHERS.remove(self)
            if not _RESIZE_WATCHERS:
                del torch.UntypedStorage.resize_

    def set_phase(self, phase: str) -> None:
        self.phase = phase
        self.phase_peaks.setdefault(phase, self.current)

    # ---- dispatch ----------------------------------------------------------------------------

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._add(t)
        self._note_peak()
        return out

    def _note_peak(self) -> None:
        if self.phase and self.current > self.phase_peaks.get(self.phase, 0):
            self.phase_peaks[self.phase] = self.current
        if self.current > self.peak:
            self.peak = self.current
            self.peak_phase = self.phase
            if self.classify is not None:
                self.peak_breakdown = self.classify(self)


# The trackers inside ``counting_resizes``. UntypedStorage inherits ``resize_`` from the C
# ``StorageBase``; the hook is a method set on the Python subclass and deleted again, so the C
# method is what runs outside any ``counting_resizes``.
_RESIZE_WATCHERS: list[LiveBytes] = []
_STORAGE_RESIZE = torch._C.StorageBase.resize_


def _resize_and_tell(self: torch.UntypedStorage, size: int) -> torch.UntypedStorage:
    out = _STORAGE_RESIZE(self, size)
    for tracker in list(_RESIZE_WATCHERS):
        tracker.storage_resized(self)
    return out


__all__ = ["CUDA_ROUND_BYTES", "LiveBytes", "rounded"]
