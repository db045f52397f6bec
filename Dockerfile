# syntax=docker/dockerfile:1
# rgpt-dist training image: the base image's CUDA PyTorch plus the project's pinned stack, the
# project installed editable in /workspace, the GPT-2 vocabulary baked in, a non-root user.
#
#   docker build -t rgpt-dist:0.1.0 .
#   docker run --rm --gpus all --ipc=host -v "$PWD/data:/workspace/data" -v "$PWD/runs:/workspace/runs" \
#       rgpt-dist:0.1.0 torchrun --nproc_per_node 8 launcher/train.py configs/experiments/<cell>.yaml
#
# See docs/docker.md (SLURM through enroot/pyxis and apptainer, the choices made here, how it is linted).

# Official PyTorch image: torch 2.13.0+cu130 (the version constraints.txt pins, CUDA build), CUDA 13.0
# toolkit with nvcc (DeepSpeed JIT ops), cuDNN 9, conda Python 3.11 in /opt/conda (megatron-core
# 0.16.1 is the newest release for 3.11). Pinned by tag and digest. Hosts need an NVIDIA driver
# >= 580 for CUDA 13.0; see docs/docker.md for the CUDA 12.6 variant (older drivers).
ARG BASE_IMAGE=pytorch/pytorch:2.13.0-cuda13.0-cudnn9-devel@sha256:c74b2049d204a55233abace509fdb1f6bdbe2d169bee382ed2f06cac00ba76c4
FROM ${BASE_IMAGE}

# The non-root user; match your cluster account with --build-arg RGPT_UID=$(id -u) --build-arg RGPT_GID=$(id -g).
ARG RGPT_USER=rgpt
ARG RGPT_UID=1000
ARG RGPT_GID=1000
# The torch the base image must carry (checked below; the build fails rather than replace it).
ARG TORCH_VERSION=2.13.0

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DS_BUILD_OPS=0

# g++ for DeepSpeed's JIT-compiled ops and torch.compile (nvcc comes with the devel base image).
# Ubuntu's archive versions move with security updates, so they are not pinned; the base digest pins the rest.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential ca-certificates \
    && rm -rf /var/lib/apt/lists/*

# The user, at a fixed UID/GID. Ubuntu 24.04 bases ship a user `ubuntu` at 1000:1000: it is removed first.
RUN if getent passwd "${RGPT_UID}" >/dev/null; then userdel -r "$(getent passwd "${RGPT_UID}" | cut -d: -f1)" 2>/dev/null || true; fi \
    && if getent group "${RGPT_GID}" >/dev/null; then groupdel "$(getent group "${RGPT_GID}" | cut -d: -f1)"; fi \
    && groupadd --gid "${RGPT_GID}" "${RGPT_USER}" \
    && useradd --uid "${RGPT_UID}" --gid "${RGPT_GID}" --create-home --shell /bin/bash "${RGPT_USER}"

WORKDIR /workspace

# The pins. constraints.txt pins the CPU torch wheel (and torchvision for resolution); the image keeps the
# base image's CUDA torch, torchvision, triton and nvidia-* wheels, so those lines are dropped into
# /opt/rgpt-dist/constraints-cuda.txt, generated here from constraints.txt (one source of truth), and
# every pip install below uses it. The Python version and the base torch are checked first.
COPY constraints.txt pyproject.toml README.md ./
RUN python -c "import sys; assert sys.version_info[:2] == (3, 11), f'Python 3.11 needed (megatron-core 0.16.1), base has {sys.version}'" \
    && python -c "import torch; v = torch.__version__.split('+')[0]; assert v == '${TORCH_VERSION}' and torch.version.cuda, f'base image torch {torch.__version__} (cuda {torch.version.cuda}) is not the CUDA build of ${TORCH_VERSION}'" \
    && mkdir -p /opt/rgpt-dist \
    && grep -v -i -E '^(torch|torchvision|torchaudio|triton|pytorch-triton)==|^nvidia-' constraints.txt > /opt/rgpt-dist/constraints-cuda.txt \
    && python -c "import torch; print(torch.__version__)" > /opt/rgpt-dist/base-torch-version

# The dependencies (their own layer: rebuilt only when pyproject.toml or constraints.txt change), in one pip
# command as the Makefile does, from pyproject.toml's lists ([test] included, to run the tests in the image).
# DeepSpeed installs with DS_BUILD_OPS=0: no ops prebuilt; the trainer uses torch's AdamW and needs none, and
# any op asked for later is JIT-compiled into TORCH_EXTENSIONS_DIR on first use.
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; print('\n'.join(p['dependencies'] + p['optional-dependencies']['test']))" > /tmp/requirements.txt \
    && pip install -c /opt/rgpt-dist/constraints-cuda.txt -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt \
    && test "$(python -c 'import torch; print(torch.__version__)')" = "$(cat /opt/rgpt-dist/base-torch-version)"

# The project, editable (no dependencies: all in place above), then `pip check` and the torch build re-checked.
COPY . .
RUN pip install -c /opt/rgpt-dist/constraints-cuda.txt --no-deps -e . \
    && pip check \
    && test "$(python -c 'import torch; print(torch.__version__)')" = "$(cat /opt/rgpt-dist/base-torch-version)" \
    && python -c "import deepspeed, megatron.core, streaming, transformers, lm_eval, rgpt_dist; print('deepspeed', deepspeed.__version__)"

# The GPT-2 vocabulary, fetched by the project's own code (openai-whisper sdist from PyPI, sha256 checked by
# rgpt_dist.data.tokenizer.fetch_vocab), read-only in the image; found offline at run time through RGPT_GPT2_VOCAB.
ENV RGPT_CACHE_DIR=/opt/rgpt-dist/cache \
    RGPT_GPT2_VOCAB=/opt/rgpt-dist/cache/gpt2.tiktoken
RUN rgpt prep --fetch-vocab \
    && chmod -R a+rX /opt/rgpt-dist \
    && python -c "from rgpt_dist.data.tokenizer import get_encoding; assert get_encoding().encode('Hello world') == [15496, 995]" \
    && rm -rf /tmp/data-gym-cache

# Writable places for the user: data/ and runs/ (mount over them), and every cache under $HOME/.cache.
ENV HOME=/home/${RGPT_USER} \
    XDG_CACHE_HOME=/home/${RGPT_USER}/.cache \
    HF_HOME=/home/${RGPT_USER}/.cache/huggingface \
    TORCH_EXTENSIONS_DIR=/home/${RGPT_USER}/.cache/torch_extensions \
    TRITON_CACHE_DIR=/home/${RGPT_USER}/.cache/triton \
    MPLCONFIGDIR=/home/${RGPT_USER}/.cache/matplotlib \
    WANDB_CACHE_DIR=/home/${RGPT_USER}/.cache/wandb \
    WANDB_CONFIG_DIR=/home/${RGPT_USER}/.config/wandb
RUN mkdir -p /workspace/data /workspace/runs "${HF_HOME}" "${TORCH_EXTENSIONS_DIR}" "${TRITON_CACHE_DIR}" \
        "${MPLCONFIGDIR}" "${WANDB_CACHE_DIR}" "${WANDB_CONFIG_DIR}" \
    && chown -R "${RGPT_UID}:${RGPT_GID}" /workspace/data /workspace/runs "${HOME}" \
    && install -m 0755 docker/entrypoint.sh /usr/local/bin/rgpt-entrypoint

USER ${RGPT_UID}:${RGPT_GID}
ENTRYPOINT ["/usr/local/bin/rgpt-entrypoint"]
CMD []
