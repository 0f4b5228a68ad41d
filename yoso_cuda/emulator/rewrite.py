"""The mechanical rewrite that turns a CUDA source into C++ for the emulator's runtime (runtime.h).

Only what C++ cannot express is rewritten, each rule counted, and every line keeps its number (a
``#line`` directive names the original file), so compiler errors and the emulator's messages point
into the real ``.cu``:

* ``includes``: CUDA-only headers (``c10/cuda``, ``ATen/cuda``, ``cub``, ``cuda*.h``) become the
  runtime's one header;
* ``launches``: ``kernel<<<grid, block, shared, stream>>>(args)`` becomes ``emu::launch(...)``,
  carrying the kernel's ``__launch_bounds__``;
* ``shared_arrays`` / ``dynamic_shared``: ``__shared__`` declarations become references to the
  block's shared storage;
* ``empty``: ``at::empty`` becomes its 0xFF-filled twin;
* ``device_checks``: ``is_cuda()`` becomes ``is_cpu()`` (the emulated kernels take CPU tensors);
* ``dispatch_key``: ``TORCH_LIBRARY_IMPL(yoso, CUDA, m)`` registers the kernels for the CPU under
  the emulator's own namespace, beside the real CPU kernels.

Anything CUDA-only left afterwards is an error naming its line.
"""

from __future__ import annotations

import re
from collections import Counter

_INCLUDE = re.compile(
    r'^[ \t]*#[ \t]*include[ \t]*[<"](?:c10/cuda/|ATen/cuda/|cub/|cuda_runtime|cuda\.h|cuda_fp16|cuda_bf16)[^>"]*[>"].*$', re.M
)
_KERNEL = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\(\s*([^,()]+?)\s*(?:,[^()]*)?\)\s+)?(\w+)\s*\(")
_SHARED = re.compile(r"(?<!extern )__shared__\s+([\w:]+(?:\s*<[^;<>]*>)?)\s+(\w+)\s*((?:\[[^\]]+\])*)\s*;")
_DYNAMIC_SHARED = re.compile(r"extern\s+__shared__\s+([\w:]+)\s+(\w+)\s*\[\s*\]\s*;")
_DISPATCH = re.compile(r"TORCH_LIBRARY_IMPL\(\s*(\w+)\s*,\s*CUDA\s*,\s*(\w+)\s*\)")
_IMPL = re.compile(r'\bm\.impl\(\s*"(\w+)"')
_LEFTOVERS = ("<<<", "__shared__", "is_cuda()", "__constant__")  # outside comments
MAX_THREADS_PER_BLOCK = 1024  # a kernel without __launch_bounds__


class RewriteError(ValueError):
    pass


def rewrite(source: str, namespace: str, filename: str) -> tuple[str, Counter, list[str]]:
    """The C++ text, how many times each rule applied, and the op names the source registers."""
    counts: Counter = Counter()
    bounds = {name: bound or str(MAX_THREADS_PER_BLOCK) for bound, name in _KERNEL.findall(source)}

    def include(match: re.Match) -> str:
        counts["includes"] += 1
        return '#include "runtime.h"' if counts["includes"] == 1 else ""

    text = _INCLUDE.sub(include, source)
    text = _launches(text, bounds, counts)

    def shared(match: re.Match) -> str:
        counts["shared_arrays"] += 1
        kind, name, extents = match.group(1), match.group(2), match.group(3)
        return f"auto& {name} = *static_cast<{kind}(*){extents}>(::emu::block_shared(__LINE__, sizeof({kind}{extents})));"

    text = _SHARED.sub(shared, text)

    def dynamic(match: re.Match) -> str:
        counts["dynamic_shared"] += 1
        return f"{match.group(1)}* const {match.group(2)} = static_cast<{match.group(1)}*>(::emu::dynamic_shared());"

    text = _DYNAMIC_SHARED.sub(dynamic, text)
    text, counts["empty"] = re.subn(r"\bat::empty\(", "::emu::poisoned_empty(", text)
    text, counts["device_checks"] = re.subn(r"\bis_cuda\(\)", "is_cpu()", text)
    ops = _IMPL.findall(text[_DISPATCH.search(text).start() :]) if _DISPATCH.search(text) else []
    text, counts["dispatch_key"] = _DISPATCH.subn(lambda m: f"TORCH_LIBRARY_IMPL({namespace}, CPU, {m.group(2)})", text)
    if counts["dispatch_key"] != 1:
        raise RewriteError(f"{filename}: expected one TORCH_LIBRARY_IMPL(<ns>, CUDA, m), found {counts['dispatch_key']}")
    for number, line in enumerate(text.splitlines(), 1):
        for token in _LEFTOVERS:
            if token in line.split("//")[0]:
                raise RewriteError(
                    f"{filename}:{number}: '{token}' is not emulated (extend rewrite.py and runtime.h): {line.strip()}"
                )
    return f'#line 1 "{filename}"\n' + text, counts, ops


def _launches(text: str, bounds: dict[str, str], counts: Counter) -> str:
    """``name<targs><<<config>>>(args)`` -> ``::emu::launch(::emu::LaunchConfig(config), "name", bound, name<targs>, args)``."""
    out, position = [], 0
    while (start := text.find("<<<", position)) >= 0:
        kernel_end = start
        if text[kernel_end - 1] == ">":  # template arguments: walk back to their '<'
            depth, kernel_end = 0, kernel_end - 1
            while True:
                depth += {">": 1, "<": -1}.get(text[kernel_end], 0)
                if depth == 0:
                    break
                kernel_end -= 1
        name_match = re.search(r"(\w+)$", text[:kernel_end])
        if name_match is None:
            raise RewriteError(f"a launch without a kernel name at offset {start}")
        name = name_match.group(1)
        if name not in bounds:
            raise RewriteError(f"launch of {name}, which is not a __global__ function of this file")
        config_end = text.index(">>>", start)
        args_open = config_end + 3
        while text[args_open].isspace():
            args_open += 1
        if text[args_open] != "(":
            raise RewriteError(f"launch of {name}: expected '(' after '>>>'")
        args_close = _matching_paren(text, args_open)
        kernel = text[name_match.start() : start]
        config = text[start + 3 : config_end]
        args = text[args_open + 1 : args_close]
        out.append(text[position : name_match.start()])
        out.append(
            f'::emu::launch(::emu::LaunchConfig({config}), "{name}", {bounds[name]}, {kernel}'
            f"{', ' if args.strip() else ''}{args})"
        )
        counts["launches"] += 1
        position = args_close + 1
    out.append(text[position:])
    return "".join(out)


def _matching_paren(text: str, open_index: int) -> int:
    depth = 0
    for index in range(open_index, len(text)):
        depth += {"(": 1, ")": -1}.get(text[index], 0)
        if depth == 0:
            return index
    raise RewriteError("unbalanced parentheses in a kernel launch")
