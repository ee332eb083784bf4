"""A torch_npu release that renames one keyword of one op: an unpacked wheel tree the testkit's torch_npu reads as it
reads the real wheel (`ASCEND_TESTKIT_TORCH_NPU_WHEEL=<tree>`), to show that an engine's calls are bound to the
schemas a wheel declares, as a card's dispatcher binds them.

The tree holds the real wheel's members the reader and the fake use (the ATB library, its op list, both meta
registration files) and, as `lib/libtorch_npu.so`, the real `npu` schema literals, NUL-separated as in the binary,
with the one renamed.
"""

from __future__ import annotations

import os
import re
import zipfile
from pathlib import Path

from ascend_contracts.torch_npu_wheel import (
    ATB_LIBRARY,
    ATB_META_REGISTRATIONS,
    ATB_OPS,
    META_REGISTRATIONS,
    NPU_LIBRARY,
    open_torch_npu_wheel,
)

_COPIED = (ATB_LIBRARY, ATB_OPS, META_REGISTRATIONS, ATB_META_REGISTRATIONS)


def _member(path: Path, member: str) -> bytes:
    if path.is_dir():
        return (path / member).read_bytes()
    with zipfile.ZipFile(path) as zf:
        return zf.read(member)


def planted_wheel_tree(dest: str | os.PathLike, op: str, keyword: str, renamed: str,
                       version: str = "2.13.0") -> Path:
    """Write to `dest` the torch_npu `version` whose `op` (an `npu`-library op) calls `keyword` `renamed`."""
    wheel = open_torch_npu_wheel(version)
    if wheel.namespaces.get(op) != "npu":
        raise ValueError(f"{op!r} is not an op of torch_npu {wheel.version}'s npu library")
    pattern = re.compile(rf"(?<=[ *(]){re.escape(keyword)}(?=[=,)])")
    schemas = {key: text for key, text in wheel.schemas.items() if wheel.namespaces[key] == "npu"}
    planted, count = pattern.subn(renamed, schemas[op])
    if count != 1:
        raise ValueError(f"{op}'s schema has {count} parameters named {keyword!r} (want one): {schemas[op]}")
    schemas[op] = planted
    root = Path(dest)
    for member in _COPIED:
        target = root / member
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(_member(wheel.path, member))
    (root / NPU_LIBRARY).write_bytes(b"\0".join(text.encode("ascii") for text in schemas.values()) + b"\0")
    (root / "torch_npu" / "version.py").write_text(f'__version__ = "{wheel.version}+{op}.{keyword}-{renamed}"\n')
    return root
