# The vitpe app in a container (CPU only), also the image of a Hugging Face Space (Docker SDK:
# see deploy/huggingface/README.md and the README's "Host a demo").
#
#   docker build -t vitpe .
#   docker run --rm -p 8501:8501 vitpe                                   # http://localhost:8501
#   docker run --rm -p 8501:8501 -v "$PWD/checkpoints:/app/checkpoints:ro" vitpe   # other checkpoints
#   docker run --rm -p 8501:8501 -v vitpe-uploads:/home/user/uploads vitpe   # shared uploads kept across restarts
#
# Not built here: this project's machine has no container engine that can run (podman installs, but
# crun cannot start a container in its sandbox, and no registry is reachable). Its steps ran instead
# in a fresh Python 3.11 venv, the CMD as uid 1000: bash deploy/check_dockerfile_steps.sh (README, "Host a demo").
#
# requirements.txt pins torch==2.13.0; from PyPI that is the large CUDA build on x86_64 Linux,
# so torch is installed first from PyTorch's CPU index (2.13.0+cpu satisfies the `==2.13.0` pin:
# a pin without a local label ignores `+cpu`), then the rest from PyPI.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Hugging Face Spaces run the container as uid 1000: the app's files and its writable folders
# belong to that user (a local `docker run` uses it too).
RUN useradd --create-home --uid 1000 user
WORKDIR /app

# g++ builds the fused SaPE²/CoPE CPU kernel (below, once, at image build time; without it the
# app runs those encodings' eager PyTorch path, slower).
RUN apt-get update && apt-get install -y --no-install-recommends g++ && rm -rf /var/lib/apt/lists/*

COPY requirements.txt .
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
 && pip install -r requirements.txt

COPY --chown=user . .

USER user
# Shared uploads (image=upload:<sha256> links) go to VITPE_UPLOAD_DIR: inside the container's
# writable layer by default (lost with the container); on a Space with persistent storage set the
# variable to /data/vitpe-uploads, elsewhere mount a volume here.
ENV HOME=/home/user \
    VITPE_UPLOAD_DIR=/home/user/uploads
RUN mkdir -p "$VITPE_UPLOAD_DIR"
# The fused kernel, built now into the user's torch extension cache, so that no visitor waits for
# the compiler (about 15 s on 2 cores); the server's warm-up then only loads it.
RUN python -m vitpe_core kernel
# The app's own modules as bytecode: PYTHONDONTWRITEBYTECODE (above) keeps Python from writing it
# while the app runs, so without this every start of the container would compile them again
# (pip compiled the installed packages already).
RUN python -m compileall -q app.py pages vitpe_core

EXPOSE 8501
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8501/_stcore/health', timeout=4).read().strip() != b'ok')"]

# .streamlit/config.toml (copied with the repository) sets headless mode, the upload limit and the
# theme; no file watcher in a deployed image (the source does not change under it).
CMD ["streamlit", "run", "app.py", "--server.address", "0.0.0.0", "--server.port", "8501", \
     "--server.fileWatcherType", "none"]
