#!/usr/bin/env bash
# The Dockerfile's steps without a container engine: a fresh Python 3.11 venv, the same pip
# commands, the build context as `COPY` would see it (the committed tree minus .dockerignore),
# the server started with the image's CMD as uid 1000 (the Hugging Face Spaces user) with HOME and
# VITPE_UPLOAD_DIR as the image sets them, then the image's HEALTHCHECK command and a walk over
# every page with the websocket client of the load test. Loopback only: the CMD's 0.0.0.0 becomes
# 127.0.0.1. Needs root (to drop to uid 1000) and a Python 3.11 that uid 1000 may run (PY=...).
#
#   bash deploy/check_dockerfile_steps.sh            # builds /tmp/vitpe-dockerfile-venv once, reuses it
#   FRESH=1 bash deploy/check_dockerfile_steps.sh    # a new venv
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
VENV=${VENV:-/tmp/vitpe-dockerfile-venv}
APP=${APP:-/tmp/vitpe-app}
HOME_1000=${HOME_1000:-/tmp/vitpe-home-1000}
PORT=${PORT:-8599}
UID_=${UID_:-1000}
PY=${PY:-python3.11}   # a Python that uid 1000 can run (the image has it under /usr/local)

# The build context: the committed tree (what a Space or a clean clone builds), .dockerignore's
# folders left out. COPY requirements.txt and COPY . . both read it.
rm -rf "$APP" && mkdir -p "$APP"
git -C "$REPO" archive HEAD | tar -x -C "$APP"
(cd "$APP" && rm -rf .git runs data artifacts docs .venv .pytest_cache .hypothesis .benchmarks)

if [[ -n "${FRESH:-}" || ! -x "$VENV/bin/streamlit" ]]; then
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  # RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu && ...
  PIP_NO_CACHE_DIR=1 "$VENV/bin/pip" install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
fi
# ... && pip install -r requirements.txt   (run every time: the context's requirements may have changed)
PIP_NO_CACHE_DIR=1 "$VENV/bin/pip" install -q -r "$APP/requirements.txt"
"$VENV/bin/python" -c "import torch, streamlit; print('torch', torch.__version__, 'cuda', torch.version.cuda, '| streamlit', streamlit.__version__)"

# COPY --chown=user . .
mkdir -p "$HOME_1000/uploads"
chown -R "$UID_:$UID_" "$APP" "$HOME_1000"

# RUN python -m vitpe_core kernel   (as uid 1000, into its own torch extension cache)
(cd "$APP" && setpriv --reuid "$UID_" --regid "$UID_" --clear-groups \
  env -i PATH="$VENV/bin:/usr/bin:/bin" HOME="$HOME_1000" "$VENV/bin/python" -m vitpe_core kernel)

# RUN python -m compileall -q app.py pages vitpe_core   (as uid 1000)
(cd "$APP" && setpriv --reuid "$UID_" --regid "$UID_" --clear-groups \
  env -i PATH="$VENV/bin:/usr/bin:/bin" HOME="$HOME_1000" "$VENV/bin/python" -m compileall -q app.py pages vitpe_core)

# CMD ["streamlit", "run", "app.py", "--server.address", "0.0.0.0", "--server.port", "8501", "--server.fileWatcherType", "none"]
cd "$APP"
setpriv --reuid "$UID_" --regid "$UID_" --clear-groups \
  env -i PATH="$VENV/bin:/usr/bin:/bin" HOME="$HOME_1000" VITPE_UPLOAD_DIR="$HOME_1000/uploads" PYTHONUNBUFFERED=1 \
  PYTHONDONTWRITEBYTECODE=1 \
  "$VENV/bin/streamlit" run app.py --server.address 127.0.0.1 --server.port "$PORT" --server.fileWatcherType none \
  > "$HOME_1000/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 120); do
  curl -fsS "http://127.0.0.1:$PORT/_stcore/health" >/dev/null 2>&1 && break
  sleep 1
done
echo "server user: $(ps -o user= -p "$(pgrep -P $SERVER -f streamlit || echo $SERVER)" 2>/dev/null || true)"
# HEALTHCHECK CMD (the image's command, its port)
"$VENV/bin/python" -c "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:$PORT/_stcore/health', timeout=4).read().strip() != b'ok')" \
  && echo "HEALTHCHECK: ok"
# every page, on the shipped checkpoints, through the websocket protocol (the repo's own venv runs the client)
cd "$REPO"
"${CLIENT_PYTHON:-$REPO/.venv/bin/python}" - "$PORT" <<'EOF'
import asyncio, sys
from benchmarks.st_client import open_session

async def main(port):
    base = f"http://127.0.0.1:{port}"
    s, st = await open_session(base, "/?page=bias&patch=2,3")
    print(f"bias: first run {st.seconds:.1f} s, exceptions {s.page.exceptions()}")
    for page in ("similarity", "compare", "checkpoints", "bias"):
        st = await s.run(page=page, timeout=300)
        print(f"{page}: {st.seconds:.1f} s, {st.bytes / 1024:.0f} KB, exceptions {s.page.exceptions()}")
    await s.close()

asyncio.run(main(int(sys.argv[1])))
EOF
echo "server log tail:"; tail -5 "$HOME_1000/server.log"
