"""Recover the ATB op schema strings that `libop_plugin_atb.so` only holds as machine code.

The compiler turns every `m.def("...")` literal of up to a few hundred bytes into code that allocates a
std::string and fills it with 16-byte loads from `.rodata.cst16`, 8-byte immediates and small stores; the full text
never sits in the file. Schemas such as `_npu_reshape_and_cache(...)` exist only that way, so we replay those stores:
`objdump -d` gives the instructions, and this module tracks what each one writes into the fresh buffer.
Longer literals are ordinary strings and are read by `torch_npu_wheel` directly.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

OBJDUMP_TIMEOUT_S = 120


class AtbSchemaError(RuntimeError):
    """The ATB library's schema literals could not be recovered (objdump missing or failing)."""


_LOAD_XMM = re.compile(r"^movdq[au]\s+-?0x[0-9a-f]+\(%rip\),%xmm(\d+)\s+# ([0-9a-f]+)")
_STORE_XMM = re.compile(r"^movup[sd]\s+%xmm(\d+),(0x[0-9a-f]+)?\(%rax\)")
_LOAD_IMM = re.compile(r"^mov(?:abs|l|q)?\s+\$(0x[0-9a-f]+),%(\w+)$")
_STORE_GPR = re.compile(r"^mov\s+%(\w+),(0x[0-9a-f]+)?\(%rax\)$")
_STORE_IMM = re.compile(r"^mov([bwlq])\s+\$(0x[0-9a-f]+),(0x[0-9a-f]+)?\(%rax\)$")
_SCHEMA_LIKE = re.compile(rb"^_?npu_\w+(\.\w+)?\([\x20-\x7e]*\) -> [\x20-\x7e]+$")
_WIDTH = {"b": 1, "w": 2, "l": 4, "q": 4}  # movq $imm32 sign-extends; schema text never needs that form
_NAMES: dict[str, tuple[str, int]] = {}
for _base, _low in (("ax", "al"), ("bx", "bl"), ("cx", "cl"), ("dx", "dl"), ("si", "sil"), ("di", "dil"),
                    ("bp", "bpl"), ("sp", "spl")):
    _NAMES.update({f"r{_base}": (f"r{_base}", 8), f"e{_base}": (f"r{_base}", 4), _base: (f"r{_base}", 2),
                   _low: (f"r{_base}", 1)})
for _n in range(8, 16):
    _NAMES.update({f"r{_n}": (f"r{_n}", 8), f"r{_n}d": (f"r{_n}", 4), f"r{_n}w": (f"r{_n}", 2),
                   f"r{_n}b": (f"r{_n}", 1)})


def _register(name: str) -> tuple[str, int] | None:
    """(the 64-bit register, the width in bytes) a register name denotes: `%dx` -> ("rdx", 2), `%r8d` -> ("r8", 4)."""
    return _NAMES.get(name)


def _file_offset_reader(so: Path):
    data = so.read_bytes()
    sections = subprocess.run(["objdump", "-h", str(so)], capture_output=True, text=True, check=True).stdout
    # Map the read-only data sections' virtual addresses to file offsets (equal in practice; not relied on).
    spans = []
    for line in sections.splitlines():
        cols = line.split()
        if len(cols) >= 6 and cols[1].startswith(".rodata"):
            size, vma, off = int(cols[2], 16), int(cols[3], 16), int(cols[5], 16)
            spans.append((vma, vma + size, off))

    def read16(vma: int) -> bytes | None:
        for lo, hi, off in spans:
            if lo <= vma and vma + 16 <= hi:
                return data[off + vma - lo: off + vma - lo + 16]
        return None

    return read16


def recover_schema_literals(so: Path) -> list[str]:
    """Every string the library builds in code that looks like a schema (`name(...) -> ...`), in code order."""
    if shutil.which("objdump") is None:
        raise AtbSchemaError(f"objdump (GNU binutils) is needed to read the ATB schemas built in code in {so}; "
                             "install binutils")
    try:
        listing = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(so)], capture_output=True, text=True,
                                 check=True, timeout=OBJDUMP_TIMEOUT_S).stdout
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        raise AtbSchemaError(f"objdump -d {so} failed: {exc}") from exc
    read16 = _file_offset_reader(so)
    xmm: dict[str, bytes] = {}
    gpr: dict[str, int] = {}
    written: dict[int, int] = {}  # offset into the string the last call returned -> byte stored there
    found: list[str] = []

    def store(off: int, raw: bytes) -> None:
        written.update(zip(range(off, off + len(raw)), raw, strict=True))

    for line in listing.splitlines():
        ins = line.split("\t", 1)[-1].strip()
        if m := _LOAD_XMM.match(ins):
            chunk = read16(int(m.group(2), 16))
            if chunk is not None:
                xmm[m.group(1)] = chunk
        elif m := _STORE_IMM.match(ins):
            store(int(m.group(3) or "0", 16), int(m.group(2), 16).to_bytes(8, "little")[:_WIDTH[m.group(1)]])
        elif (m := _STORE_XMM.match(ins)) and m.group(1) in xmm:
            store(int(m.group(2) or "0", 16), xmm[m.group(1)])
        elif (m := _LOAD_IMM.match(ins)) and (reg := _register(m.group(2))):
            gpr[reg[0]] = int(m.group(1), 16)
        elif (m := _STORE_GPR.match(ins)) and (reg := _register(m.group(1))) and reg[0] in gpr:
            store(int(m.group(2) or "0", 16), gpr[reg[0]].to_bytes(8, "little")[:reg[1]])
        elif ins.startswith("call"):
            # The string is complete when a NUL terminator was stored and every byte before it was written.
            ends = sorted(off for off, byte in written.items() if byte == 0)
            if ends and all(off in written for off in range(ends[0])):
                text = bytes(written[off] for off in range(ends[0]))
                if _SCHEMA_LIKE.match(text):
                    found.append(text.decode("ascii"))
            written.clear()
    return found
