#!/usr/bin/env bash
# The carry for benchmarks/gpu_trainer.py on the H200 device machine (docs/performance.md, "GPU suite on
# the real trainer"): every wheel its image (Python 3.12, torch 2.11+cu130, no registry) lacks for the
# trainer, for CPython 3.12 manylinux x86_64, into .whl/ (git-ignored through .git/info/exclude, never
# committed), plus the GPT-2 vocabulary as .whl/gpt2.tiktoken. Run here, where PyPI is reachable:
#
#     bash benchmarks/device_wheels.sh            # ~20 s; prints each wheel, its size and the total
#
# Versions come from constraints.txt. deepspeed has no wheel on PyPI: its sdist is built here into a
# pure-Python wheel (no ops prebuilt; the trainer needs none on CUDA: a torch AdamW client optimizer).
# Carried beyond deepspeed, megatron-core and mosaicml-streaming: what they import on the trainer's path
# and the image lacks (pydantic and its three needs, hjson; streaming's compression and registry modules
# brotli, python-snappy + cramjam, zstd, catalogue; zstandard for rgpt-prep; typing_extensions >= 4.16
# for pydantic). Left out on purpose, each imported by streaming only for remote storage or converters the
# project never uses (rgpt_dist.data.mds stubs the converters): boto3, google-cloud-storage, paramiko, oci,
# azure-*, torchvision; the image has the rest (list: DEVICE below, from the device's package list).
# The script fails if a requirement of a carried wheel is none of carried / on the device / left out, if
# two versions of one package are in .whl/, or if .whl/ exceeds 60 MiB (the run tool carries 64 MiB with
# the working tree).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}

exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qxF '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >>"$exclude"

BINARY=(megatron-core mosaicml-streaming pydantic pydantic_core annotated-types typing-inspection
        typing_extensions hjson zstandard brotli python-snappy cramjam zstd catalogue)
pin() {  # NAME==VERSION as constraints.txt pins it (zstd: 1.5.7.2 has no cp312 wheel; 1.5.7.3, 1.5.6.2 are yanked)
    [ "$1" = zstd ] && { echo zstd==1.5.6.1; return; }
    local line
    line=$(grep -i -m1 "^$1==" constraints.txt) || { echo "device_wheels: $1 is not pinned in constraints.txt" >&2; exit 1; }
    echo "$line"
}
pins=()
for name in "${BINARY[@]}"; do pins+=("$(pin "$name")"); done

rm -rf .whl
mkdir .whl
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64; do platforms+=(--platform "$p"); done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d .whl "${pins[@]}"
# deepspeed: sdist only; setup.py imports torch, so build with this venv's (DS_BUILD_OPS=0: pure Python)
DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w .whl "$(pin deepspeed)"

"$PY" - <<'EOF'
import shutil
from rgpt_dist.data.tokenizer import fetch_vocab, find_vocab
shutil.copy(find_vocab() or fetch_vocab(), ".whl/gpt2.tiktoken")
EOF

"$PY" - "${BINARY[@]}" deepspeed <<'EOF'
"""Check: every wanted package present once, for cp312 or pure Python; every requirement accounted for."""
import re
import sys
import zipfile
from pathlib import Path

from packaging.requirements import Requirement

TARGET = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux", "os_name": "posix",
          "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
          "platform_python_implementation": "CPython", "extra": ""}  # the device's python
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
wanted = {norm(n) for n in sys.argv[1:]}
# On the device image (its package list, KINDS.md): what the carried wheels require and find there.
DEVICE = {"torch", "numpy", "packaging", "einops", "msgpack", "ninja", "psutil", "py-cpuinfo", "tqdm", "xxhash",
          "matplotlib", "transformers", "pillow", "pyyaml", "tiktoken", "pyarrow", "filelock", "requests"}
# Imported by streaming only for remote storage or its converters (never on the trainer's path).
LEFT_OUT = {"boto3", "google-cloud-storage", "paramiko", "oci", "azure-storage-blob", "azure-storage-file-datalake",
            "azure-identity", "torchvision"}
wheels = sorted(Path(".whl").glob("*.whl"))
names = {}
problems = []
for w in wheels:
    name, _version, *tags = w.stem.split("-")
    names.setdefault(norm(name), []).append(w.name)
    if not (tags[-3] in ("py3", "py2.py3") or tags[-3] == "cp312"):
        problems.append(f"{w.name}: not for CPython 3.12")
problems += [f"{n}: {len(v)} versions ({', '.join(v)})" for n, v in names.items() if len(v) > 1]
problems += [f"{n}: no wheel downloaded" for n in sorted(wanted - set(names))]
for w in wheels:
    with zipfile.ZipFile(w) as z:
        meta = z.read(next(m for m in z.namelist() if m.endswith(".dist-info/METADATA"))).decode()
    for line in meta.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is None or req.marker.evaluate(TARGET):
            req = norm(req.name)
            if req not in names and req not in DEVICE and req not in LEFT_OUT:
                problems.append(f"{w.name} requires {req}: not carried, not on the device, not left out")
total = 0
for p in sorted(Path(".whl").iterdir()):
    total += p.stat().st_size
    print(f"{p.stat().st_size / 2**20:8.2f} MiB  {p.name}")
print(f"{total / 2**20:8.2f} MiB  total in .whl/ ({len(wheels)} wheels + gpt2.tiktoken)")
if total > 60 * 2**20:
    problems.append(f".whl/ holds {total / 2**20:.1f} MiB: over the 60 MiB left beside the working tree")
if problems:
    sys.exit("device_wheels: " + "; ".join(problems))
EOF
