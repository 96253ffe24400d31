# CUDA runtime image for the training scripts (cannot be built on the CI machine: no Docker
# engine there). Build: docker build -t horst .   Run, e.g.:
#   docker run --gpus all -v /data:/data horst train_vit.py experiment=deit_small_acdc_s90 \
#       optimizer=horst data.root=/data/imagenet
FROM nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04

ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3-pip git \
 && rm -rf /var/lib/apt/lists/*
RUN python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

WORKDIR /workspace
# The pinned environment (requirements.lock, generated from pyproject.toml; its header says how).
COPY requirements.lock /workspace/requirements.lock
RUN pip install -r /workspace/requirements.lock
COPY . /workspace
RUN pip install --no-deps -e /workspace

ENTRYPOINT ["python"]
CMD ["train_vit.py"]
