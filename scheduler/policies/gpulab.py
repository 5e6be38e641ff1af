"""gpulab's default placement: fragmentation gradient first, then pack tight.

Experimental: ranks candidates lexicographically.
"""

from __future__ import annotations

import numpy as np

from ..policy import register_policy
from ..slices import MILLI_PER_GPU
from .fgd import FragmentationAware, kube_score


@register_policy("gpulab")
class GpulabPolicy(FragmentationAware):
    def __init__(self, workload=None, seed: int = 0, mix=None, variant: str = "a", resolution: float = 1.0, ratio_steps: float = 2.0):
        super().__init__(workload, seed, mix)
        self.variant = variant
        self.resolution = resolution
        self.ratio_steps = ratio_steps
        self._ratio = None
        gpu_types = [t for t in self.mix.types if t.num_gpu]
        self.min_cpu = min((t.cpu_milli for t in gpu_types), default=0)

    def choose(self, cluster, request, state, cands) -> int:
        after = state.after(cands.nodes, cands.used, request.gpu_milli, request.cpu_milli)
        gain = state.frag[cands.nodes] - after
        primary = np.floor(kube_score(gain) / self.resolution)
        node_free = state.free_total[cands.nodes] - request.total_gpu_milli
        leftover = (cands.used - request.gpu_milli).sum(axis=1) if cands.used.shape[1] else np.zeros(len(cands))
        rank = self.order.of(len(cluster.cpu_free))[cands.nodes]
        v = self.variant
        if v.startswith("ss") and request.num_gpu == 1 and request.gpu_milli < MILLI_PER_GPU:
            exists = cluster.gpu_model >= 0
            live = exists & (cluster.cpu_free[:, None] >= self.min_cpu)
            gaps = cluster.gpu_free[live]
            hist = np.bincount(gaps[(gaps > 0) & (gaps < MILLI_PER_GPU)], minlength=MILLI_PER_GPU + 1)
            vfree = cands.used[:, 0]
            left = vfree - request.gpu_milli
            ss = np.where(left > 0, 2 * hist[left] + 1, 0) - np.where(vfree < MILLI_PER_GPU, 2 * hist[vfree] - 1, 0)
            if v == "ss":
                keys = (rank, -primary, ss)
            elif v == "ss2":
                keys = (rank, ss, -primary)
            return int(np.lexsort(keys)[0])
        if v == "a":  # gain, then tightest GPU, then order
            keys = (rank, leftover, -primary)
        elif v == "b":  # gain, tightest GPU, fullest node, order
            keys = (rank, node_free, leftover, -primary)
        elif v.startswith("r"):  # gain, then CPU/GPU ratio affinity, then order
            if self._ratio is None or len(self._ratio) != len(cluster.cpu_free):
                gpus = np.maximum((cluster.gpu_model >= 0).sum(axis=1), 1)
                self._ratio = (cluster.cpu_free + 1) / gpus  # static: taken on first sight (empty cluster)
            want = (request.cpu_milli + 1) / max(request.total_gpu_milli / MILLI_PER_GPU, 1e-3)
            ratio = self._ratio[cands.nodes]
            if v in ("r5", "r6", "r7", "r8", "r9", "r10", "r11"):
                ratio = (cluster.cpu_free[cands.nodes] + 1) / np.maximum(state.free_total[cands.nodes] / MILLI_PER_GPU, 1e-3)
            aff = np.round(np.abs(np.log2(ratio / want)) * self.ratio_steps)
            if v == "r":
                keys = (rank, aff, -primary)
            elif v == "r6":
                whole = request.num_gpu > 0 and request.gpu_milli >= MILLI_PER_GPU
                exists = cluster.gpu_model >= 0
                fresh = ((cluster.gpu_free == MILLI_PER_GPU) | ~exists).all(axis=1)[cands.nodes]
                keys = (rank, -primary) if whole else (rank, aff, fresh, -primary)
            elif v in ("r9", "r10"):
                frac = request.num_gpu == 1 and request.gpu_milli < MILLI_PER_GPU
                if request.num_gpu > 0 and not frac:
                    keys = (rank, -primary)
                elif not frac:
                    keys = (rank, aff, -primary)
                else:
                    exists = cluster.gpu_model >= 0
                    live = exists & (cluster.cpu_free[:, None] >= self.min_cpu)
                    gaps = cluster.gpu_free[live]
                    hist = np.bincount(gaps[(gaps > 0) & (gaps < MILLI_PER_GPU)], minlength=MILLI_PER_GPU + 1)
                    vfree = cands.used[:, 0]
                    left = vfree - request.gpu_milli
                    ss = np.where(left > 0, 2 * hist[left] + 1, 0) - np.where(vfree < MILLI_PER_GPU, 2 * hist[vfree] - 1, 0)
                    keys = (rank, ss, aff, -primary) if v == "r9" else (rank, aff, ss, -primary)
            elif v == "r11":
                whole = request.num_gpu > 0 and request.gpu_milli >= MILLI_PER_GPU
                keys = (rank, -primary) if whole else (rank, aff, -primary)
                row = int(np.lexsort(keys)[0])
                same = np.flatnonzero(cands.nodes == cands.nodes[row])
                return int(same[np.lexsort((leftover[same], -np.round(gain[same], 6)))[0]])
            elif v == "r7":
                whole = request.num_gpu > 0 and request.gpu_milli >= MILLI_PER_GPU
                keys = (rank, -primary) if whole else (rank, leftover, aff, -primary)
            elif v == "r8":
                whole = request.num_gpu > 0 and request.gpu_milli >= MILLI_PER_GPU
                keys = (rank, -primary) if whole else (rank, aff, leftover, -primary)
            elif v in ("r3", "r5"):
                whole = request.num_gpu > 0 and request.gpu_milli >= MILLI_PER_GPU
                keys = (rank, -primary) if whole else (rank, aff, -primary)
            elif v == "r4":
                keys = (rank, -primary) if request.num_gpu == 0 else (rank, aff, -primary)
            else:
                exists = cluster.gpu_model >= 0
                fresh = ((cluster.gpu_free == MILLI_PER_GPU) | ~exists).all(axis=1)
                keys = (rank, aff, fresh[cands.nodes], -primary) if v == "r2" else (rank, fresh[cands.nodes], aff, -primary)
        elif v == "o" or v.startswith("ss"):
            keys = (rank, -primary)
        elif v == "c":  # gain, fullest node, order
            keys = (rank, node_free, -primary)
        else:
            raise ValueError(v)
        return int(np.lexsort(keys)[0])
