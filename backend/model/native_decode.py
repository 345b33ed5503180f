"""Our own kernels (backend.model.native) run a step's generated rows: attention read in place
from the paged pool, and, where every projection of the model is ours too, whole decoder layers
in one call (norms, projections, rotary, K/V writes, attention, SwiGLU, residuals). Prompt rows
get attention read in place too (PromptAttention), each query over its own context.

Invariant: what a generated row gets depends only on its own context: every op keeps rows apart
in one fixed order, so a row gets the same bits alone, in any batch, beside any prompt rows and on
any thread count. The tables and slots a step reads and writes are checked against the pool once,
before any call: the kernels read only blocks a query's table names, up to its context's end.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import torch

from backend.model import native
from backend.model.config import ModelConfig

_INT, _PTR = ctypes.c_int, ctypes.c_void_p


class DecodeAttention:
    """One step's B generated tokens, each a decode over its own context.

    blocks: [B, nb] block tables; ends: [B] context lengths (query b attends positions
    [0, ends[b]) of its table); slots: [B] the flat slots their K/V go to; k, v: the pool,
    [layers, blocks, block_size, Hkv, D] bfloat16."""

    __slots__ = ("_args", "_fn", "_k", "_v", "blocks", "ends", "longest", "slots")
    _KERNEL = "kvfence_decode_attention"

    def __init__(
        self, blocks: torch.Tensor, ends: torch.Tensor, slots: torch.Tensor, k: torch.Tensor,
        v: torch.Tensor, heads: int,
    ) -> None:  # fmt: skip
        lib = native.library()
        _, n_blocks, block_size, kv_heads, head_dim = k.shape
        if lib is None or not native.attends(head_dim, k.dtype, k.device):
            raise RuntimeError(f"our decode attention is not used here: {native.unavailable()}")
        self.blocks = blocks.to(torch.int32).contiguous()
        self.ends = ends.to(torch.int32).contiguous()
        self.slots = slots.to(torch.int64).contiguous()
        b, nb = self.blocks.shape
        self.longest = int(self.ends.max()) if b else 0  # the last position read is longest - 1
        if heads % kv_heads or self.ends.shape != (b,) or self.slots.shape != (b,):
            raise ValueError(f"{heads} heads over {kv_heads}, {b} tables, {tuple(slots.shape)}")
        if v.shape != k.shape or not (k.is_contiguous() and v.is_contiguous()):
            raise ValueError("K and V are one dense pool each, of one shape")
        if b and (
            int(self.ends.min()) < 1
            or self.longest > nb * block_size
            or int(self.blocks.min()) < 0
            or int(self.blocks.max()) >= n_blocks
            or int(self.slots.min()) < 0
            or int(self.slots.max()) >= n_blocks * block_size
        ):
            raise ValueError("a context runs past its table, or a table or slot leaves the pool")
        self._fn = getattr(lib, self._KERNEL)
        self._k, self._v = k, v
        self._args = (b, heads, kv_heads, head_dim, block_size, n_blocks * block_size)

    @property
    def rows(self) -> int:
        return self._args[0]

    def __call__(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """q: [B, Hq, D] bfloat16 (rows may be strided), its K/V already written -> [B, Hq * D]."""
        b, heads, kv_heads, d, block_size, _ = self._args
        if q.shape != (b, heads, d) or q.stride(2) != 1 or q.stride(1) != d:
            raise ValueError(f"queries {tuple(q.shape)}: expected {(b, heads, d)}, heads dense")
        if q.dtype != torch.bfloat16 or not 0 <= layer < self._k.shape[0]:
            raise ValueError(f"bfloat16 queries of a layer of the pool, not {q.dtype}, {layer}")
        out = torch.empty(b, heads * d, dtype=q.dtype)
        if b:
            self._fn(
                q.data_ptr(), q.stride(0), self._k[layer].data_ptr(), self._v[layer].data_ptr(),
                self.blocks.data_ptr(), self.blocks.shape[1], self.ends.data_ptr(),
                out.data_ptr(), b, heads, kv_heads, d, block_size, d**-0.5,
                torch.get_num_threads(),
            )  # fmt: skip
        return out

    def pool(self) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int]]:
        """The pool's K and V, and (block_size, slots per layer)."""
        return self._k, self._v, (self._args[4], self._args[5])


class PromptAttention(DecodeAttention):
    """One step's prompt rows, each query over its own context read in place, with
    DecodeAttention's arguments; rows of one table at consecutive positions share each key and
    value they read, yet a query's bits are the same in any chunk, batch or thread."""

    __slots__ = ()
    _KERNEL = "kvfence_prompt_attention"

    def __init__(
        self, blocks: torch.Tensor, ends: torch.Tensor, slots: torch.Tensor, k: torch.Tensor,
        v: torch.Tensor, heads: int,
    ) -> None:  # fmt: skip
        if heads > native.PROMPT_GROUP_MAX * k.shape[3]:
            raise ValueError(f"{heads} heads over {k.shape[3]}: at most {native.PROMPT_GROUP_MAX}")
        super().__init__(blocks, ends, slots, k, v, heads)


class _Layer(ctypes.Structure):
    _fields_ = [(n, _PTR) for n in ("attn_norm", "ffn_norm", "qkv", "o", "gate_up", "down")]


class _Model(ctypes.Structure):
    _fields_ = [
        *[(n, _INT) for n in ("H", "F", "Hq", "Hkv", "D", "positions")],
        ("eps", ctypes.c_float),
        ("scale", ctypes.c_float),
        ("cos", _PTR),
        ("sin", _PTR),
        ("layers", ctypes.POINTER(_Layer)),
    ]


class DecodeLayers:
    """Every decoder layer for generated rows, in our kernels; built once per model.

    layers: per layer (attn_norm, ffn_norm, qkv, o, gate_up, down) as backend.model.llama's
    LayerWeights holds them (norms float32, matrices bfloat16); cos, sin: [positions, D] float32
    rotary tables, sin's first half negated."""

    def __init__(
        self,
        config: ModelConfig,
        layers: Sequence[tuple[torch.Tensor, ...]],
        cos: torch.Tensor,
        sin: torch.Tensor,
    ) -> None:
        lib = native.library()
        c = config
        if lib is None or not native.attends(c.head_dim, torch.bfloat16, cos.device):
            raise RuntimeError(f"our decode layers are not used here: {native.unavailable()}")
        shapes = [
            (c.hidden,),
            (c.hidden,),
            (c.q_size + 2 * c.kv_size, c.hidden),
            (c.hidden, c.q_size),
            (2 * c.ffn, c.hidden),
            (c.hidden, c.ffn),
        ]
        dtypes = [torch.float32, torch.float32, *[torch.bfloat16] * 4]
        for weights in layers:
            for t, shape, dtype in zip(weights, shapes, dtypes, strict=True):
                if tuple(t.shape) != shape or t.dtype != dtype or t.device.type != "cpu":
                    raise ValueError(f"a {t.dtype} {tuple(t.shape)} weight: {dtype} {shape}")
        self._keep = [t.contiguous() for weights in layers for t in weights]
        self._tables = (cos.float().contiguous(), sin.float().contiguous())
        ptrs = [t.data_ptr() for t in self._keep]
        self._layers = (_Layer * len(layers))(
            *[_Layer(*ptrs[i : i + 6]) for i in range(0, len(ptrs), 6)]
        )
        self._model = _Model(
            c.hidden, c.ffn, c.n_heads, c.n_kv_heads, c.head_dim, self._tables[0].shape[0],
            c.rms_eps, c.head_dim**-0.5, self._tables[0].data_ptr(), self._tables[1].data_ptr(),
            self._layers,
        )  # fmt: skip
        self.count = len(layers)
        self._hidden = c.hidden
        self._fn = lib.kvfence_decode_layers
        self._fn.argtypes = [
            ctypes.POINTER(_Model), _INT, _INT, _PTR, _INT, _PTR, _PTR, _PTR,
            ctypes.c_long, _PTR, _INT, _PTR, _INT, _INT,
        ]  # fmt: skip
        self._fn.restype = None

    def __call__(self, x: torch.Tensor, first: int, last: int, decodes: DecodeAttention) -> None:
        """Layers [first, last) of the generated rows x ([B, H] float32, contiguous; updated in
        place), each a decode at its context's last position, its K/V written to its slot."""
        b = decodes.rows
        if x.shape != (b, self._hidden) or x.dtype != torch.float32 or not x.is_contiguous():
            raise ValueError(f"rows {tuple(x.shape)} {x.dtype}: [{b}, {self._hidden}] float32")
        if not 0 <= first <= last <= self.count:
            raise ValueError(f"layers [{first}, {last}) of {self.count}")
        if decodes.longest > self._model.positions:
            raise ValueError("a position past the rotary table")
        k, v, (block_size, per_layer) = decodes.pool()
        if k.shape[0] != self.count:
            raise ValueError(f"a pool of {k.shape[0]} layers for {self.count}")
        if b and last > first:
            self._fn(
                ctypes.byref(self._model), first, last, x.data_ptr(), b, decodes.slots.data_ptr(),
                k.data_ptr(), v.data_ptr(),
                per_layer * self._model.Hkv * self._model.D, decodes.blocks.data_ptr(),
                decodes.blocks.shape[1], decodes.ends.data_ptr(), block_size,
                torch.get_num_threads(),
            )  # fmt: skip
