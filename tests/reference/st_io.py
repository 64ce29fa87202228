"""safetensors load/save: the safetensors package where installed, else a small reader/writer of
the format (8-byte little-endian header length, JSON header, raw little-endian data) so that the
reference scripts dry-run on machines without the package. F8_E4M3 tensors are returned as
float32 by the fallback (older torch has no float8 dtype)."""
import json
import struct

import numpy as np
import torch

try:
    from safetensors.torch import load_file, save_file  # noqa: F401
except ImportError:
    _TO_NAME = {torch.bfloat16: "BF16", torch.float32: "F32", torch.float16: "F16",
                torch.uint8: "U8", torch.int32: "I32", torch.int64: "I64"}
    _FROM_NAME = {v: k for k, v in _TO_NAME.items()}

    def _e4m3_table():
        out = np.zeros(256, dtype=np.float32)  # [256] value of each e4m3 byte
        for b in range(256):
            s, e, m = b >> 7, (b >> 3) & 15, b & 7
            if e == 15 and m == 7:
                v = float("nan")
            elif e == 0:
                v = m / 8.0 * 2.0 ** -6
            else:
                v = (1 + m / 8.0) * 2.0 ** (e - 7)
            out[b] = -v if s else v
        return out

    def save_file(tensors, path, metadata=None):
        header, blobs, off = {}, [], 0
        if metadata:
            header["__metadata__"] = metadata
        for name, t in tensors.items():
            t = t.contiguous()
            raw = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()
            header[name] = {"dtype": _TO_NAME[t.dtype], "shape": list(t.shape),
                            "data_offsets": [off, off + len(raw)]}
            blobs.append(raw)
            off += len(raw)
        h = json.dumps(header).encode()
        h += b" " * (-len(h) % 8)
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h)
            for b in blobs:
                f.write(b)

    def load_file(path):
        with open(path, "rb") as f:
            data = f.read()
        n = struct.unpack("<Q", data[:8])[0]
        header = json.loads(data[8:8 + n])
        base, out = 8 + n, {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            a, b = info["data_offsets"]
            raw = data[base + a: base + b]
            shape, dt = info["shape"], info["dtype"]
            if dt == "F8_E4M3":
                out[name] = torch.from_numpy(_e4m3_table()[np.frombuffer(raw, np.uint8)].reshape(shape))
            elif dt == "BF16":
                out[name] = torch.from_numpy(np.frombuffer(raw, np.int16).copy()).view(torch.bfloat16).reshape(shape)
            else:
                t = torch.zeros(0, dtype=_FROM_NAME[dt])
                out[name] = torch.from_numpy(np.frombuffer(raw, t.numpy().dtype).copy()).reshape(shape)
        return out
