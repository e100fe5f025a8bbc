"""Find where the wgmma_tma kernel stops: run it with MASKC_DEBUG_WAITS=1 (an mbarrier wait that has not
finished after a second prints block, thread, barrier and parity, then gives up) on a few small cases, after
the copy-engine check (maskc.tma.check_copy_engine). Prints the barrier layout to read the reports with.

    python bench/tma_debug.py
"""
import math
import os
import sys
from pathlib import Path

os.environ["MASKC_DEBUG_WAITS"] = "1"
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]
import maskc  # noqa: E402
from maskc.emit import KV_STAGES  # noqa: E402
from maskc.runtime import attention  # noqa: E402
from maskc.schedule import choose_tiles  # noqa: E402
from maskc.tma import check_copy_engine  # noqa: E402

print("copy-engine check:", check_copy_engine() or "ok", flush=True)
print(f"barriers (offset from q_full, 8 bytes each): 0 q_full, 1 q_empty, 2.. k_full[{KV_STAGES}], "
      f"{2 + KV_STAGES}.. v_full, {2 + 2 * KV_STAGES}.. kv_empty", flush=True)
torch.manual_seed(0)
for name, params, S, D, persistent in [("causal", {}, 256, 64, "0"), ("causal", {}, 256, 128, "0"),
                                       ("causal", {}, 1000, 64, "1"), ("document", {"docs": [300, 400, 300]}, 1000, 128, "1")]:
    os.environ["MASKC_PERSISTENT"] = persistent
    bound = maskc.load(ROOT / "examples" / f"{name}.mask").bind(seq_len=S, **params)
    tiles = choose_tiles(D, "bf16", engine="wgmma_tma")
    q, k, v = (torch.randn(1, 1, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    print(f"--- {name} S={S} D={D} tiles={tuple(tiles)} persistent={persistent}", flush=True)
    o, lse = attention(q, k, v, bound, return_lse=True, tiles=tiles)
    torch.cuda.synchronize()
    vis = torch.as_tensor(bound.dense(0, 0), device="cuda")
    s = (q[0, 0].double() @ k[0, 0].double().T) * D ** -0.5
    ref_lse = torch.logsumexp(s.masked_fill(~vis, -math.inf), dim=-1)
    err = ((lse[0, 0].double() - ref_lse).norm() / ref_lse.norm()).item()
    print(f"    LSE rel err {err:.2e}", flush=True)
