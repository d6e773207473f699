#!/usr/bin/env bash
# One encoder (epd-encode) + one prefill/decode (vLLM as ECExampleConnector
# consumer) + vLLM's own EPD proxy; deploy/vllm/README.md explains each
# command. Needs: epd-encode on PATH, vllm installed, a vLLM checkout at
# $VLLM_SRC (for examples/disaggregated/disaggregated_encoder/disagg_epd_proxy.py),
# one GPU. Stops everything it started (by PID) on exit.
set -euo pipefail

MODEL="${MODEL:-Qwen/Qwen2.5-VL-3B-Instruct}"
MODEL_DIR="${MODEL_DIR:-$HOME/models/Qwen2.5-VL-3B-Instruct}"
VLLM_SRC="${VLLM_SRC:-$HOME/vllm}"
EC_DIR="${EC_DIR:-/dev/shm/ec}"
ENCODE_PORT="${ENCODE_PORT:-19534}"
PD_PORT="${PD_PORT:-19535}"
PROXY_PORT="${PROXY_PORT:-10001}"
LOGS="${LOGS:-./logs}"
mkdir -p "$LOGS" "$EC_DIR"

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM

wait_http() {  # until something answers HTTP on 127.0.0.1:$1
  timeout 600 bash -c "until curl -s -o /dev/null http://127.0.0.1:$1/health; do sleep 1; done"
}

epd-encode serve --model "$MODEL_DIR" --served-model-name "$MODEL" --device cuda --dtype bfloat16 \
  --port 50051 --http-host 127.0.0.1 --http-port "$ENCODE_PORT" \
  --ec-dir "$EC_DIR" --ec-dir-max-mb 4096 --ec-dir-grace-s 60 --metrics-port 9464 \
  >"$LOGS/encoder.log" 2>&1 &
pids+=($!)

CUDA_VISIBLE_DEVICES=0 vllm serve "$MODEL" --port "$PD_PORT" --enforce-eager --enable-request-id-headers \
  --max-model-len 32768 \
  --ec-transfer-config '{"ec_connector": "ECExampleConnector", "ec_role": "ec_consumer",
                         "ec_connector_extra_config": {"shared_storage_path": "'"$EC_DIR"'"}}' \
  >"$LOGS/pd.log" 2>&1 &
pids+=($!)

wait_http "$ENCODE_PORT"
wait_http "$PD_PORT"

python "$VLLM_SRC/examples/disaggregated/disaggregated_encoder/disagg_epd_proxy.py" --host 0.0.0.0 \
  --port "$PROXY_PORT" --encode-servers-urls "http://127.0.0.1:$ENCODE_PORT" --prefill-servers-urls disable \
  --decode-servers-urls "http://127.0.0.1:$PD_PORT" >"$LOGS/proxy.log" 2>&1 &
pids+=($!)
wait_http "$PROXY_PORT"

curl -s "http://127.0.0.1:$PROXY_PORT/v1/chat/completions" -H 'Content-Type: application/json' -d '{
  "model": "'"$MODEL"'",
  "messages": [{"role": "user", "content": [
    {"type": "image_url", "image_url": {"url": "https://upload.wikimedia.org/wikipedia/commons/4/47/PNG_transparency_demonstration_1.png"}},
    {"type": "text", "text": "What is in this image?"}]}]}'
echo
ls "$EC_DIR"/*/encoder_cache.safetensors
curl -s http://127.0.0.1:9464/metrics | grep '^epd_ec_files_published_total'
