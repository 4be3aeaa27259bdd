"""The Triton kernel compiles for real GPUs, ahead of time, on this CPU-only machine.

The interpreter (TRITON_INTERPRET=1, the other kernel tests) checks the kernel's numbers but not that Triton's
compiler accepts it (types, loop-carried values, scalar stores). Here a subprocess with TRITON_INTERPRET=0
compiles `_ce_rows_kernel` through Triton's full pipeline (TTIR, TTGIR, LLVM IR, PTX, and ptxas to a cubin,
with the ptxas bundled in the triton wheel) for sm_90 (H100/H200) and sm_80 (A100), for every input dtype and
both NEED_GRAD variants, at the launch configurations `launch_config` picks on a GPU, and checks ptxas reports
no register spills. Running the cubin needs a GPU: studies/bench/gpu_check.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from collapse_hpo.kernels.cross_entropy import HAS_TRITON

SCRIPT = r"""
import json, pathlib, re, subprocess, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from collapse_hpo.kernels.cross_entropy import _ce_rows_kernel, launch_config

assert type(_ce_rows_kernel).__name__ == "JITFunction", type(_ce_rows_kernel)  # not the interpreter
ptxas = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
out = []
for arch, dtypes in ((90, ("bf16", "fp16", "fp32")), (80, ("bf16",))):
    for vocab in (50304, 300):
        block, warps = launch_config(vocab, interpreting=False)
        for dtype in dtypes:
            for need_grad in (True, False):
                signature = {
                    "logits_ptr": f"*{dtype}", "logits_row_stride": "i64", "targets_ptr": "*i64",
                    "loss_ptr": "*fp32", "n_cols": "i32", "ignore_index": "i32", "logit_scale": "fp32",
                    "grad_scale": "fp32", "NEED_GRAD": "constexpr", "BLOCK": "constexpr",
                }
                constexprs = {"NEED_GRAD": need_grad, "BLOCK": block}
                src = ASTSource(_ce_rows_kernel, signature, constexprs=constexprs)
                kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps})
                ptx = pathlib.Path(tempfile.mkdtemp()) / "kernel.ptx"
                ptx.write_text(kernel.asm["ptx"])
                gpu = re.search(r"^\.target\s+(sm_\w+)", kernel.asm["ptx"], re.M).group(1)  # e.g. sm_90a
                cmd = [str(ptxas), "-v", "--gpu-name", gpu, str(ptx), "-o", str(ptx.with_suffix(".cubin"))]
                info = subprocess.run(cmd, capture_output=True, text=True)
                out.append({"arch": arch, "vocab": vocab, "block": block, "warps": warps, "dtype": dtype,
                            "need_grad": need_grad, "cubin_bytes": len(kernel.asm["cubin"]),
                            "ptxas_rc": info.returncode, "ptxas": info.stderr})
print(json.dumps(out))
"""


@pytest.mark.skipif(not HAS_TRITON, reason="needs the triton package")
def test_kernel_compiles_to_cubin_without_spills():
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    cmd = [sys.executable, "-c", SCRIPT]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(results) == 2 * (3 + 1) * 2
    assert {r["block"] for r in results} == {16384, 512}
    for r in results:
        assert r["cubin_bytes"] > 0, r
        assert r["ptxas_rc"] == 0, r
        assert "0 bytes spill stores, 0 bytes spill loads" in r["ptxas"], r
