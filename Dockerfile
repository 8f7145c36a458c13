# The vitpe app in a container (CPU only). Not built in this project's dev environment (it has
# no Docker engine); build and run where Docker exists:
#
#   docker build -t vitpe .
#   docker run --rm -p 8501:8501 vitpe                                   # http://localhost:8501
#   docker run --rm -p 8501:8501 -v "$PWD/checkpoints:/app/checkpoints:ro" vitpe   # other checkpoints
#
# requirements.txt pins torch==2.13.0; from PyPI that is the large CUDA build on x86_64 Linux,
# so torch is installed first from PyTorch's CPU index (2.13.0+cpu satisfies the `==2.13.0` pin:
# a pin without a local label ignores `+cpu`), then the rest from PyPI.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

COPY requirements.txt .
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
 && pip install -r requirements.txt

COPY . .

RUN useradd --create-home --uid 10001 vitpe && chown -R vitpe /app
USER vitpe

EXPOSE 8501
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8501/_stcore/health', timeout=4).read().strip() != b'ok')"]

# .streamlit/config.toml (copied with the repository) sets headless mode, the upload limit and the theme.
CMD ["streamlit", "run", "app.py", "--server.address", "0.0.0.0", "--server.port", "8501"]
