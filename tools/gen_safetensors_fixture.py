#!/usr/bin/env python3
"""Writes tests/data/safetensors/py_written.safetensors with the reference `safetensors` package.

tests/model/safetensors_test.cpp reads it back and checks these exact values, so the C++ reader
is verified against files the Python library produces (its layout: tensors sorted by dtype
alignment then name, header padded with spaces to a multiple of 8).

Usage (from the repository root): python3 tools/gen_safetensors_fixture.py
Needs: torch, safetensors.
"""
import os

import torch
from safetensors.torch import save_file

OUT = os.path.join("tests", "data", "safetensors", "py_written.safetensors")


def main():
    tensors = {
        # Values exactly representable in each dtype, so the test can compare exactly.
        "f32": torch.tensor([[1.5, -2.0, 3.25], [0.0, 1e-3, -65504.0]], dtype=torch.float32),
        "bf16": torch.tensor([1.0, -0.5, 3.0, 256.0], dtype=torch.bfloat16),
        "fp8": torch.tensor([[1.0, -2.0], [448.0, 0.015625]]).to(torch.float8_e4m3fn),
        "i64": torch.tensor([-1, 0, 1 << 40], dtype=torch.int64),
        "scalar_i32": torch.tensor(7, dtype=torch.int32),
        "u8_empty": torch.zeros((0, 3), dtype=torch.uint8),
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    save_file(tensors, OUT, metadata={"format": "pt", "producer": "gen_safetensors_fixture"})
    print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes)")


if __name__ == "__main__":
    main()
