#!/usr/bin/env bash
# N vitpe replicas behind nginx on one machine (no containers): every replica a `streamlit run
# app.py` of its own on 127.0.0.1, all on one shared folder for uploads and imported models and one
# cookie secret, nginx in front on PORT. Stops everything on Ctrl-C.
#
#   bash deploy/replicas/run.sh                 # 2 replicas, http://localhost:8080
#   REPLICAS=4 PORT=80 SHARED=/srv/vitpe bash deploy/replicas/run.sh
#
# Needs nginx (apt-get install nginx) and the project installed (README). Across machines: put
# SHARED on a network filesystem every replica mounts, and list the machines' replicas in the
# upstream block (deploy/replicas/README.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
REPLICAS="${REPLICAS:-2}"
PORT="${PORT:-8080}"
FIRST="${FIRST_REPLICA_PORT:-8601}"
SHARED="${SHARED:-$HOME/.cache/vitpe/shared}"
RUN="${RUN_DIR:-$(mktemp -d -t vitpe-replicas-XXXXXX)}"
SECRET="${STREAMLIT_SERVER_COOKIE_SECRET:-$(python -c 'import secrets; print(secrets.token_hex(16))')}"
command -v nginx >/dev/null || { echo "nginx is needed: apt-get install nginx" >&2; exit 2; }
mkdir -p "$SHARED/uploads" "$SHARED/models" "$RUN"/{body,proxy,fastcgi,uwsgi,scgi}
chmod 777 "$RUN"/{body,proxy,fastcgi,uwsgi,scgi}
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait' EXIT INT TERM
upstreams=""
for i in $(seq 0 $((REPLICAS - 1))); do
  port=$((FIRST + i))
  VITPE_UPLOAD_DIR="$SHARED/uploads" VITPE_MODEL_DIR="$SHARED/models" STREAMLIT_SERVER_COOKIE_SECRET="$SECRET" \
    python -m streamlit run app.py --server.headless true --server.address 127.0.0.1 --server.port "$port" \
    --server.fileWatcherType none --browser.gatherUsageStats false >"$RUN/replica$i.log" 2>&1 &
  pids+=($!)
  upstreams+="        server 127.0.0.1:$port max_fails=0;"$'\n'
done
python -c 'import sys; from benchmarks.replicas import fill_template; print(fill_template(*sys.argv[1:]))' \
  "$PORT" "${upstreams%$'\n'}" "$RUN" > "$RUN/nginx.conf"
nginx -p "$RUN" -c "$RUN/nginx.conf" -g "daemon off;" &
pids+=($!)
echo "vitpe: $REPLICAS replicas behind nginx on http://localhost:$PORT (logs in $RUN, shared folder $SHARED)"
wait -n
