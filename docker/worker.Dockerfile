# Worker image for running `opsynth generate` on a distributed Beam runner (Dataflow, Flink, Spark): the Beam
# Python SDK harness, a CUDA build of torch, and opsynth. Build it from the repository root with the Beam version
# of the machine that submits the job (runner and workers must run the same Beam release):
#
#   docker build -f docker/worker.Dockerfile \
#     --build-arg BEAM_VERSION=$(python -c "import apache_beam; print(apache_beam.__version__)") \
#     -t REGION-docker.pkg.dev/PROJECT/REPO/opsynth-worker:0.1.0 .
#
# The GPU driver comes from the host (Dataflow's install-nvidia-driver option, or the NVIDIA container toolkit);
# the torch wheels bring their own CUDA runtime, so the base image needs none.
ARG BEAM_VERSION=2.77.0
FROM apache/beam_python3.11_sdk:${BEAM_VERSION}

WORKDIR /opt/opsynth
# torch first, from PyPI's default index: its Linux wheels are the CUDA builds.
RUN pip install --no-cache-dir "torch>=2.11,<2.14"
COPY pyproject.toml README.md ./
COPY opsynth ./opsynth
COPY pipeline ./pipeline
COPY commands ./commands
COPY operator_catalog ./operator_catalog
COPY filters ./filters
COPY outputs ./outputs
COPY bench ./bench
RUN pip install --no-cache-dir . && pip check
# Inductor (the compile check) writes its kernel cache here; keep it on the container's disk.
ENV TORCHINDUCTOR_CACHE_DIR=/tmp/torchinductor
# The base image's ENTRYPOINT, /opt/apache/beam/boot, starts the SDK worker: keep it.
