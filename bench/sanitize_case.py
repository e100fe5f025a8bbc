"""A small case for compute-sanitizer (memcheck, racecheck): ragged lengths, PARTIAL + FULL + ragged tiles,
an empty row block, GQA. Exits non-zero if the output is wrong."""
import math
import sys
from pathlib import Path

import numpy as np
import torch

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent.parent / "tests")]
import mock_masks as mm  # noqa: E402
from maskc.runtime import attention  # noqa: E402

torch.manual_seed(0)
ok = True
for bound, D in ((mm.late_start(300, 130), 128), (mm.document(257, 3, batch=2), 64), (mm.full(100, 77), 128)):
    B = bound.batch
    q = torch.randn(B, 4, bound.seq_len, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, 2, bound.kv_len, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, 2, bound.kv_len, D, device="cuda", dtype=torch.bfloat16)
    o, lse = attention(q, k, v, bound, return_lse=True)
    torch.cuda.synchronize()
    # reference, float64
    s = torch.einsum("bhqd,bhkd->bhqk", q.double(), k.double().repeat_interleave(2, 1)) / math.sqrt(D)
    vis = torch.as_tensor(np.stack([bound.visible(b if bound.batch > 1 else 0, np.arange(bound.seq_len)[:, None],
                                                  np.arange(bound.kv_len)[None, :]) for b in range(B)]), device="cuda")
    s = s.masked_fill(~vis[:, None], -math.inf)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    ref = p @ v.double().repeat_interleave(2, 1)
    err = ((o.double() - ref).norm() / ref.norm()).item()
    print(f"{bound.name}: rel err {err:.2e}, nan {torch.isnan(o).any().item()}")
    ok &= err < 1e-2 and not torch.isnan(o).any().item()
sys.exit(0 if ok else 1)
