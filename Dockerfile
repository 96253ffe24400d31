# GPU image for the training scripts (cannot be built on the CI machine: no Docker engine there;
# tests/test_dockerfile.py reads this file against requirements.lock). Build: docker build -t horst .
# For a host whose NVIDIA driver predates CUDA 13 (< 580.65.06, >= 525.60.13), the same torch built
# for CUDA 12.6 (make venv TORCH=cu126's install): docker build --build-arg TORCH=cu126 -t horst .
# Run, e.g.:
#   docker run --gpus all --ipc=host --ulimit memlock=-1 -v /data:/data horst train_vit.py \
#       experiment=deit_small_acdc_s90 optimizer=horst data.root=/data/imagenet
# --ipc=host (or --shm-size=16g): DataLoader workers hand their batches over through /dev/shm, which
# Docker makes 64 MB (one DeiT batch of 128 images is 77 MB), and NCCL's shared-memory transport
# uses it too; a run that does not fit stops at start-up saying so. --ulimit memlock=-1: pinned
# host memory (pin_memory) and NCCL lock pages.
#
# Base: plain Python, no CUDA toolkit. The locked torch is a CUDA 13.0 build whose CUDA libraries
# come as pip wheels (requirements.lock: nvidia-cuda-runtime 13.*, nvidia-cudnn-cu13, nvidia-nccl-cu13,
# ...); torch loads those, never a system CUDA, so an nvidia/cuda base would only add a second CUDA
# that nothing uses and suggest that its driver would do. What the host must give is the driver,
# mounted by the NVIDIA container toolkit: >= 580.65.06 for CUDA 13 (horst_sparse/training/env.py
# MIN_DRIVER); with an older one device=cuda stops at start-up naming the TORCH=cu126 build above.
# The official python image carries Python's headers (/usr/local/include/python3.11); gcc and the C
# library's headers are added: Triton compiles a small C module with them the first time a
# torch.compile'd kernel runs (horst's fast path, compile=true), and horst's CPU kernel builds with $CC.
FROM python:3.11-slim-bookworm

# What the nvidia/cuda images set: the toolkit then mounts the driver's compute libraries and nvidia-smi.
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev git \
 && rm -rf /var/lib/apt/lists/*
RUN python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

WORKDIR /workspace
# The pinned environment (requirements.lock, generated from pyproject.toml; its header says how).
COPY requirements.lock /workspace/requirements.lock
COPY requirements-no-torch.lock /workspace/requirements-no-torch.lock
# TORCH=cu126 (or another CUDA tag PyTorch's index serves torch 2.14.1 for): that build of the pinned
# torch and torchvision, everything else as locked (requirements-no-torch.lock)
ARG TORCH=
RUN pip install -r /workspace/requirements${TORCH:+-no-torch}.lock \
    ${TORCH:+--extra-index-url https://download.pytorch.org/whl/$TORCH torch==2.14.1+$TORCH torchvision==0.29.1+$TORCH}
COPY . /workspace
RUN pip install --no-deps -e /workspace

ENTRYPOINT ["python"]
CMD ["train_vit.py"]
