"""Memory traffic of a compiled program, counted kernel by kernel from its optimised HLO text.

XLA's own cost analysis is not always there or not always fair: a program compiled for a GPU
that is not attached (`bench.gpu_plan`) has none, and XLA:CPU's charges a fusion that updates a
donated buffer in place with a read and a write of the whole buffer. This module reads the
scheduled HLO of `compiled.as_text()` and charges each kernel of the entry computation (a
fusion, a library call such as a cuBLAS GEMM, a copy, a collective) what a roofline model of
memory charges it: every distinct operand read once and its result written once, values inside
a fusion staying on chip. A fusion whose root updates one of its operands in place
(`dynamic-update-slice`, or a tuple of them) reads and writes only the update, not the buffer;
an operand that a fusion only slices (slice, dynamic-slice, gather) is charged the slices.
Free: parameters, constants, tuples, tuple elements, bitcasts. A `while` loop with a known trip
count (XLA's `known_trip_count` backend config) charges its body that many times; one without
counts the body once and is reported in `Traffic.uncounted_loops`.
"""
from __future__ import annotations

import dataclasses
import functools
import re
from typing import Optional

# Bits per element of XLA's primitive types (sub-byte types rounded up per element).
_BITS = {"pred": 8, "s1": 8, "u1": 8, "s2": 8, "u2": 8, "s4": 8, "u4": 8, "s8": 8, "u8": 8,
         "s16": 16, "u16": 16, "f16": 16, "bf16": 16, "s32": 32, "u32": 32, "f32": 32,
         "s64": 64, "u64": 64, "f64": 64, "c64": 64, "c128": 128, "token": 0}
_FREE = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "after-all",
         "partition-id", "replica-id", "opt-barrier"}
_ARRAY = re.compile(r"\b([a-z]+[0-9]*(?:e[0-9]m[0-9][a-z]*)?)\[([0-9,]*)\]")
_HEADER = re.compile(r"^(ENTRY\s+)?%([\w.\-]+)\s*\((.*)\)\s*->\s*(.*?)\s*\{\s*$")
_INSTR = re.compile(r"^\s*(ROOT\s+)?%([\w.\-]+)\s*=\s*(.*)$")


def _elem_bits(dtype: str) -> int:
  if dtype in _BITS:
    return _BITS[dtype]
  if dtype.startswith("f8") or dtype.startswith("f4") or dtype.startswith("f6"):
    return 8
  raise ValueError(f"hlo_traffic: unknown element type {dtype!r}")


def shape_bytes(text: str) -> int:
  """Bytes of every array in a shape string ('f32[2,3]{1,0}', '(bf16[4], s32[])')."""
  total = 0
  for dtype, dims in _ARRAY.findall(text):
    n = 1
    for d in dims.split(","):
      if d:
        n *= int(d)
    total += n * _elem_bits(dtype) // 8
  return total


@dataclasses.dataclass
class Instruction:
  name: str
  shape: str                    # the result's shape text
  opcode: str
  operands: list                # operand names, in order
  args: str                     # the operand list as written ('0' for parameter(0))
  attrs: str                    # everything after the operand list
  root: bool = False

  @property
  def bytes(self) -> int:
    return shape_bytes(self.shape)


@dataclasses.dataclass
class Computation:
  name: str
  entry: bool
  instructions: dict            # name -> Instruction, in program order

  @property
  def root(self) -> Instruction:
    return next(i for i in self.instructions.values() if i.root)

  @functools.cached_property
  def users(self) -> dict:
    """{instruction name: the instructions that read it}."""
    out = {}
    for i in self.instructions.values():
      for o in i.operands:
        out.setdefault(o, []).append(i)
    return out

  @functools.cached_property
  def params(self) -> dict:
    """{parameter number: its instruction}."""
    return {int(i.args): i for i in self.instructions.values() if i.opcode == "parameter"}


def _split_type_and_op(rest: str):
  """'f32[2]{0} add(%a, %b), attrs' -> ('f32[2]{0}', 'add', '%a, %b', 'attrs')."""
  depth, i = 0, 0
  if rest.startswith("("):                       # a tuple shape: up to its closing paren
    for i, ch in enumerate(rest):
      depth += ch == "("
      depth -= ch == ")"
      if depth == 0:
        break
    shape, rest = rest[:i + 1], rest[i + 1:].lstrip()
  else:
    shape, _, rest = rest.partition(" ")
  m = re.match(r"([\w\-]+)\(", rest)
  if not m:
    raise ValueError(f"hlo_traffic: cannot read the opcode of {rest[:80]!r}")
  opcode, depth = m.group(1), 0
  start = m.end()
  for j in range(start - 1, len(rest)):
    depth += rest[j] == "("
    depth -= rest[j] == ")"
    if depth == 0:
      break
  return shape, opcode, rest[start:j], rest[j + 1:]


def parse(text: str) -> dict:
  """{computation name: Computation} of an HLO module's text."""
  comps, current = {}, None
  for line in text.splitlines():
    h = _HEADER.match(line)
    if h:
      current = Computation(h.group(2), bool(h.group(1)), {})
      comps[current.name] = current
      continue
    if current is None:
      continue
    if line.strip() == "}":
      current = None
      continue
    m = _INSTR.match(line)
    if not m:
      continue
    shape, opcode, ops, attrs = _split_type_and_op(m.group(3))
    operands = re.findall(r"%([\w.\-]+)", ops)
    current.instructions[m.group(2)] = Instruction(m.group(2), shape, opcode, operands, ops,
                                                   attrs, root=bool(m.group(1)))
  if not any(c.entry for c in comps.values()):
    raise ValueError("hlo_traffic: no ENTRY computation in the text")
  return comps


@dataclasses.dataclass
class Traffic:
  bytes: int                    # memory traffic of one execution
  kernels: int                  # kernels charged (loop bodies once per trip)
  in_place_updates: int         # kernels charged only their update
  uncounted_loops: int          # while loops without a known trip count (body charged once)
  by_opcode: dict               # 'fusion:kLoop' / 'custom-call' / ... -> bytes
  kernels_by_bytes: list        # (bytes, executions, computation, kernel, result shape), desc.

  def top(self, k: int = 10) -> str:
    """The k kernels with the most traffic, one line each, then the k kinds of kernel (XLA's
    name without its number: 'loop_transpose_fusion', 'gemm_fusion_dot') with the most."""
    lines = [f"{b / 1e9:10.2f} GB  x{n:<4} {comp:<24.24} {name:<36.36} {shape:.70}"
             for b, n, comp, name, shape in self.kernels_by_bytes[:k]]
    kinds = {}
    for b, n, _, name, _ in self.kernels_by_bytes:
      kind = re.sub(r"[.\d]+$", "", name)
      got = kinds.setdefault(kind, [0, 0])
      got[0] += b
      got[1] += n
    lines.append("by kind of kernel:")
    lines += [f"{b / 1e9:10.2f} GB  x{n:<5} {kind}" for kind, (b, n) in
              sorted(kinds.items(), key=lambda kv: -kv[1][0])[:k]]
    return "\n".join(lines)


def _called(attrs: str, key: str) -> Optional[str]:
  m = re.search(key + r"=%([\w.\-]+)", attrs)
  return m.group(1) if m else None


def _update_bytes(comp: Computation, ins: Instruction) -> Optional[int]:
  """Bytes written by a root that updates a buffer in place: a dynamic-update-slice (its update
  operand), or a tuple of them; None for any other root."""
  if ins.opcode == "dynamic-update-slice":
    return comp.instructions[ins.operands[1]].bytes if ins.operands[1] in comp.instructions \
        else None
  if ins.opcode == "tuple":
    parts = [_update_bytes(comp, comp.instructions[o]) for o in ins.operands
             if o in comp.instructions]
    if parts and all(p is not None for p in parts):
      return sum(parts)
  return None


def _in_place(comps: dict, ins: Instruction) -> Optional[tuple]:
  """(operand positions updated in place, bytes written) of a fusion whose root updates its
  own parameters in place (a dynamic-update-slice of a parameter, or a tuple of them); None
  for any other kernel."""
  fused = comps.get(_called(ins.attrs, "calls") or "")
  if fused is None:
    return None
  update = _update_bytes(fused, fused.root)
  if update is None:
    return None
  roots = [fused.root] if fused.root.opcode == "dynamic-update-slice" else \
      [fused.instructions[o] for o in fused.root.operands]
  numbers = {i.name: k for k, i in fused.params.items()}
  buffers = {numbers[r.operands[0]] for r in roots if r.operands[0] in numbers}
  if len(buffers) != len(roots):
    return None
  return buffers, update


_SLICING = ("dynamic-slice", "slice", "gather")


def _read_bytes(fused: Computation, number: int, full: int) -> int:
  """Bytes a fusion reads of its parameter `number`: the slices taken of it when every use
  (through bitcasts) is a slice, dynamic-slice or gather (a kernel reads only those
  elements), else all of it."""
  users = fused.users
  start = fused.params.get(number)
  if start is None:
    return full
  taken, frontier = 0, [start]
  while frontier:
    node = frontier.pop()
    for u in users.get(node.name, []):
      if u.opcode == "bitcast":
        frontier.append(u)
      elif u.opcode in _SLICING and u.operands[0] == node.name:
        taken += u.bytes
      else:
        return full
  return min(full, taken) if taken else full


def _kernel_bytes(comps: dict, comp: Computation, ins: Instruction, counts: dict) -> int:
  known = lambda o: o in comp.instructions
  if ins.opcode == "fusion":
    fused = comps.get(_called(ins.attrs, "calls") or "")
    place = _in_place(comps, ins)
    updated = set()
    written = ins.bytes
    if place is not None:
      buffers, written = place
      counts["in_place"] += 1
      updated = {ins.operands[k] for k in buffers}
    read = {}
    for k, o in enumerate(ins.operands):
      if not known(o) or o in updated:
        continue
      full = comp.instructions[o].bytes
      part = full if fused is None else _read_bytes(fused, k, full)
      read[o] = min(full, read.get(o, 0) + part)
    return sum(read.values()) + written
  if ins.opcode == "dynamic-update-slice":
    counts["in_place"] += 1
    read = {o for o in ins.operands[1:] if known(o)}
    return sum(comp.instructions[o].bytes for o in read) + \
        comp.instructions[ins.operands[1]].bytes
  read = {o for o in ins.operands if known(o)}
  return sum(comp.instructions[o].bytes for o in read) + ins.bytes


def _charge(comps: dict, comp: Computation, times: int, counts: dict) -> int:
  total = 0
  for ins in comp.instructions.values():
    if ins.opcode in _FREE:
      continue
    if ins.opcode == "while":
      body = comps.get(_called(ins.attrs, "body") or "")
      m = re.search(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"', ins.attrs)
      trips = int(m.group(1)) if m else 1
      counts["uncounted"] += m is None
      if body is not None:
        total += _charge(comps, body, times * trips, counts)
      continue
    if ins.opcode == "call" and _called(ins.attrs, "to_apply"):
      inner = comps.get(_called(ins.attrs, "to_apply"))
      if inner is not None:
        total += _charge(comps, inner, times, counts)
        continue
    b = _kernel_bytes(comps, comp, ins, counts) * times
    counts["items"].append((b, times, comp.name, ins.name, ins.shape))
    key = ins.opcode + (":" + m.group(1) if (m := re.search(r"kind=(k\w+)", ins.attrs)) else "")
    counts["by_opcode"][key] = counts["by_opcode"].get(key, 0) + b
    counts["kernels"] += times
    total += b
  return total


def traffic(text: str) -> Traffic:
  """The memory traffic of one execution of the module in `text` (see the module doc)."""
  comps = parse(text)
  entry = next(c for c in comps.values() if c.entry)
  counts = {"in_place": 0, "uncounted": 0, "kernels": 0, "by_opcode": {}, "items": []}
  total = _charge(comps, entry, 1, counts)
  return Traffic(total, counts["kernels"], counts["in_place"], counts["uncounted"],
                 dict(sorted(counts["by_opcode"].items(), key=lambda kv: -kv[1])),
                 sorted(counts["items"], key=lambda x: -x[0]))

